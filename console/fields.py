"""Form fields shared by the console's forms."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError

_DIGITS = re.compile(r"[0-9]{1,18}")


class WholeNumberField(forms.IntegerField):
    """A whole number written as the API takes one: ASCII digits only. Django's IntegerField
    goes through int(), which also takes "1_000", "+365", " 365.0" and other scripts' digits
    ("٣٦٥", "３６５"), so a form saved what the API for the same setting refuses."""

    def to_python(self, value):
        if value in self.empty_values:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if not _DIGITS.fullmatch(text):
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return int(text)


def whole_number(text: str) -> int:
    """argparse's type for a command's whole-number option, as strict as the forms' field."""
    if not _DIGITS.fullmatch(text):
        raise ValueError(text)
    return int(text)
