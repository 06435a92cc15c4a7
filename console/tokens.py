"""API token lifecycle: create (shown once), revoke. Expiry is a date on the token."""

from __future__ import annotations

import unicodedata

from django import forms
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from console.fields import WholeNumberField
from console.models import ApiToken
from console.shown import KEPT_FORMAT
from lifecycle import audit

MAX_DAYS = 3650


class TokenForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=120, strip=True,
                           help_text=_("What uses it, for example “Nightly export script”."))
    days = WholeNumberField(label=_("Expires after (days)"), min_value=1, max_value=MAX_DAYS)

    def clean_name(self):
        name = self.cleaned_data["name"]
        # Control characters, and the invisible ones that make a name read as another (bidi
        # overrides such as U+202E, zero-width spaces, the byte order mark): format, private-use,
        # unassigned. The format characters the pages keep as legitimate are taken (r123: the
        # joiner of "👩<U+200D>💻" and of Persian words, the direction marks of right-to-left
        # text), though not alone: a name of nothing else would show as an empty one.
        refused = ("Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp")
        if (any(ord(c) < 32 or ord(c) == 127 or (c not in KEPT_FORMAT and unicodedata.category(c) in refused)
                for c in name) or all(c in KEPT_FORMAT or c.isspace() for c in name)):
            raise forms.ValidationError(_("Use letters, digits, spaces and punctuation only."), code="invalid")
        return name


def create_token(user, *, name: str, days: int | None = None, acting_user=None,
                 form_number: str | None = None) -> tuple[ApiToken, str]:
    """A new token for `user`; the raw token is returned once and never stored."""
    form = TokenForm({"name": name, "days": days if days is not None else settings.API_TOKEN_DAYS})
    if not form.is_valid():
        raise forms.ValidationError({field: list(errors) for field, errors in form.errors.items()})
    with transaction.atomic():
        token, raw = ApiToken.issue(user, name=form.cleaned_data["name"], days=form.cleaned_data["days"],
                                    form_number=form_number)
        audit.record("api_token_created", actor=acting_user, new={
            "token": token.prefix, "name": token.name, "user": user.get_username(),
            "expires_at": token.expires_at.isoformat(),
        })
    return token, raw


def revoke_token(token: ApiToken, *, acting_user=None) -> bool:
    """Revoke now; False (and nothing recorded) when it was already revoked."""
    with transaction.atomic():
        changed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if not changed:
            return False
        token.refresh_from_db()
        audit.record("api_token_revoked", actor=acting_user, old={"state": "active"}, new={
            "state": "revoked", "token": token.prefix, "name": token.name, "user": token.user.get_username(),
        })
    return True
