from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from lifecycle.models import RetainedFactsPolicy
from retention.models import AGE_LIMITS, AgeUnit


class ToolPayloadPolicyForm(forms.Form):
    enabled = forms.BooleanField(label=_("Clean up old tool payloads"), required=False)
    age_value = forms.IntegerField(label=_("Conversations inactive for"), min_value=1, max_value=520)
    age_unit = forms.ChoiceField(label=_("Unit"), choices=AgeUnit.choices)
    revision = forms.IntegerField(widget=forms.HiddenInput, min_value=1)

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


def _days_field(label):
    return forms.IntegerField(
        label=label, min_value=RetainedFactsPolicy.MIN_DAYS, max_value=RetainedFactsPolicy.MAX_DAYS
    )


class RetainedFactsForm(forms.Form):
    audit_days = _days_field(_("Audit facts, days"))
    usage_days = _days_field(_("Usage and metering, days"))
    billing_days = _days_field(_("Billing facts, days"))
    revision = forms.IntegerField(widget=forms.HiddenInput, min_value=1)
