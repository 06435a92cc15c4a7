from __future__ import annotations

from django import forms
from django.db import models
from django.utils.translation import gettext_lazy as _

from console.fields import OfferedChoiceField, SwitchField, WholeNumberField
from lifecycle.models import RetainedFactsPolicy
from retention.models import AGE_LIMITS, AgeUnit


class BackupChoice(models.TextChoices):
    CREATE = "create", _("Create backup (recommended)")
    SKIP = "skip", _("Continue without backup")


class AgeForm(forms.Form):
    """The cleanup period alone: what an analysis of the draft needs."""

    # The range depends on the unit, so clean() checks it and says it in those words.
    age_value = WholeNumberField(label=_("Conversations inactive for"))
    age_unit = OfferedChoiceField(label=_("Unit"), choices=AgeUnit.choices,
                                  invalid_choice=_("Choose weeks or months."))

    def clean(self):
        data = super().clean()
        unit, value = data.get("age_unit"), data.get("age_value")
        if unit and value is not None:
            low, high = AGE_LIMITS[AgeUnit(unit)]
            if not low <= value <= high:
                message = (
                    _("Choose from %(low)s to %(high)s weeks.")
                    if unit == AgeUnit.WEEKS
                    else _("Choose from %(low)s to %(high)s months.")
                )
                self.add_error("age_value", message % {"low": low, "high": high})
        return data


class ToolPayloadPolicyForm(AgeForm):
    enabled = SwitchField(label=_("Automatic cleanup"), required=False)
    # Never preselected: the service says when the choice is required (enabling, re-enabling,
    # shortening the period) and refuses the save without it.
    backup_choice = OfferedChoiceField(
        label=_("Before the next cleanup"), choices=BackupChoice.choices, required=False,
        widget=forms.RadioSelect,
        invalid_choice=_("Choose Create backup or Continue without backup."),
    )
    revision = WholeNumberField(widget=forms.HiddenInput, min_value=1)

    field_order = ("age_value", "age_unit", "enabled", "backup_choice", "revision")


class RunForm(forms.Form):
    revision = WholeNumberField(min_value=1)


class CancelForm(forms.Form):
    operation_id = WholeNumberField(min_value=1)


def _days_field(label):
    return WholeNumberField(
        label=label, min_value=RetainedFactsPolicy.MIN_DAYS, max_value=RetainedFactsPolicy.MAX_DAYS
    )


class RetainedFactsForm(forms.Form):
    audit_days = _days_field(_("Audit facts, days"))
    usage_days = _days_field(_("Usage and metering, days"))
    billing_days = _days_field(_("Billing facts, days"))
    revision = WholeNumberField(widget=forms.HiddenInput, min_value=1)
