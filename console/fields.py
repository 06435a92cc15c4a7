"""Form fields shared by the console's forms."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from console.api import MAX_WHOLE_NUMBER

# A whole number as a person writes one: ASCII digits, a minus sign before them for a negative
# one. Any length: "-3" and a 22-digit number are whole numbers out of a field's range (its
# range message), not something else ("Enter a whole number." is for letters, "1.5", "+3").
_WHOLE = re.compile(r"-?[0-9]+")
# Past this a number is out of any range here; int() is not asked to read it (it refuses text
# of more than 4,300 digits, and a long one costs time).
_TOO_LONG = len(str(MAX_WHOLE_NUMBER)) + 1


def _parse(text: str) -> int | None:
    """The whole number `text` writes, or None when it writes none. One beyond
    ±MAX_WHOLE_NUMBER reads as ±(MAX_WHOLE_NUMBER + 1): out of every range and still a number
    any database column here can compare with."""
    if not _WHOLE.fullmatch(text):
        return None
    digits = text.lstrip("-").lstrip("0") or "0"
    value = int(digits) if len(digits) <= _TOO_LONG else MAX_WHOLE_NUMBER + 1
    value = min(value, MAX_WHOLE_NUMBER + 1)
    return -value if text.startswith("-") else value


class WholeNumberField(forms.IntegerField):
    """A whole number written as the API takes one: ASCII digits only (and a minus sign, so a
    negative number gets the range message). Django's IntegerField goes through int(), which
    also takes "1_000", "+365", " 365.0" and other scripts' digits ("٣٦٥", "３６５"), so a form
    saved what the API for the same setting refuses.

    A field given one bound gets the other at ±MAX_WHOLE_NUMBER, so what it lets through fits
    a 64-bit column. A field given neither (the cleanup period, whose range depends on the
    unit) leaves the range to its form's clean(), which then sees the number as written."""

    def __init__(self, *, min_value=None, max_value=None, **kwargs):
        if (min_value is None) != (max_value is None):
            min_value = -MAX_WHOLE_NUMBER if min_value is None else min_value
            max_value = MAX_WHOLE_NUMBER if max_value is None else max_value
        super().__init__(min_value=min_value, max_value=max_value, **kwargs)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        number = _parse(str(value).strip())
        if number is None:
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return number


def whole_number(text: str) -> int:
    """argparse's type for a command's whole-number option, as strict as the forms' field (and,
    like it, a negative or overlong number is read, so the command's range check says so)."""
    number = _parse(text)
    if number is None:
        raise ValueError(text)
    return number


# A form's checkbox sends "on" when ticked and nothing when not (an empty value reads as not
# ticked too). Anything else is a form altered or sent by hand: Django's BooleanField reads
# "off", "no" and any other word as ticked, which turned automatic cleanup on (r82).
_ALTERED = object()


class _SwitchInput(forms.CheckboxInput):
    def value_from_datadict(self, data, files, name):
        if name not in data:
            return False
        values = data.getlist(name) if hasattr(data, "getlist") else [data[name]]
        if values == ["on"]:
            return True
        return False if values == [""] else _ALTERED


class SwitchField(forms.BooleanField):
    """A checkbox that is on only when the form's checkbox says so, refused when altered."""

    widget = _SwitchInput
    default_error_messages = {
        "altered": _("The form arrived incomplete or altered, so nothing was changed. Reload the page and try again."),
    }

    def to_python(self, value):
        if value is _ALTERED:
            raise ValidationError(self.error_messages["altered"], code="altered")
        return super().to_python(value)

    def bound_data(self, data, initial):
        return False if data is _ALTERED else super().bound_data(data, initial)  # shown unticked


class OfferedChoiceField(forms.ChoiceField):
    """A choice whose refusal names the choices, never the value sent: Django's own message
    repeats it (a megabyte sent came back whole, control and direction characters included)."""

    def __init__(self, *, invalid_choice, **kwargs):
        super().__init__(**kwargs)
        self.error_messages["invalid_choice"] = invalid_choice
