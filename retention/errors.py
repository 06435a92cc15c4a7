"""The one shape of a refusal in the retention app: a stable `code` and a localized `message`."""

from __future__ import annotations


class CodedError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
