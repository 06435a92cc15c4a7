from __future__ import annotations


class ActionRefused(Exception):
    """An action declined to change anything; `code` is stable, `message` is localized."""

    def __init__(self, code: str, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
