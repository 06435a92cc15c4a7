"""API tokens for native apps and scripts (`Authorization: Bearer <token>`), and the
database-backed counters that throttle failed sign-ins and bad tokens."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import pgettext_lazy


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class TokenState(models.TextChoices):
    ACTIVE = "active", pgettext_lazy("api token", "Active")
    EXPIRED = "expired", pgettext_lazy("api token", "Expired")
    REVOKED = "revoked", pgettext_lazy("api token", "Revoked")
    # Not revoked or expired, but its user may no longer sign in: every request with it is refused.
    INACTIVE = "inactive", pgettext_lazy("api token", "User inactive")


class ApiTokenQuerySet(models.QuerySet):
    def usable(self, now=None):
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True, expires_at__gt=now)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=120, blank=True)
    # Only the hash is stored; the token is shown once when created.
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The one-time number of the Settings form that created it (none for other ways): the
    # same form sent twice, even at the same instant, creates one token (console.token_views).
    form_number = models.CharField(max_length=32, null=True, blank=True, unique=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    @classmethod
    def issue(cls, user, *, name: str = "", days: int | None = None,
              form_number: str | None = None) -> tuple[ApiToken, str]:
        """A new token for `user`, valid for `days` (API_TOKEN_DAYS by default); the raw token once.
        IntegrityError when a token was already made by the form with `form_number`."""
        raw = "lethe_" + secrets.token_urlsafe(32)
        now = timezone.now()
        token = cls.objects.create(
            user=user, name=name, key_hash=hash_token(raw), prefix=raw[:12], created_at=now,
            expires_at=now + timedelta(days=days if days is not None else settings.API_TOKEN_DAYS),
            form_number=form_number,
        )
        return token, raw

    def state(self, now=None) -> TokenState:
        if self.revoked_at is not None:
            return TokenState.REVOKED
        if self.expires_at <= (now or timezone.now()):
            return TokenState.EXPIRED
        if not self.user.is_active:
            return TokenState.INACTIVE
        return TokenState.ACTIVE

    def get_state_display(self) -> str:
        return str(self.state().label)


class Throttle(models.Model):
    """Failures counted under one key: a username (keyed by HMAC, never stored as typed) or
    a client address, for sign-ins or for bearer tokens. Shared by every web process."""

    key = models.CharField(max_length=100, unique=True)
    failures = models.PositiveIntegerField(default=0)
    first_failure_at = models.DateTimeField(null=True, blank=True)
    blocked_until = models.DateTimeField(null=True, blank=True)
    locked = models.BooleanField(default=False)  # blocked_until ends a lock, not a short delay
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)
