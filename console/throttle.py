"""Throttling of failed sign-ins (per username and per client address) and of bad API
tokens (per client address).

Counters live in the database (`console.Throttle`), so every web process sees the same
ones. After `free_failures` failures under a key, each further attempt under it must wait
a delay that doubles (from `delay_seconds` up to `max_delay_seconds`); at the key's lock
threshold it is locked for `lock_seconds`. While a key waits, attempts are refused before
any password or token is checked, so a correct guess during a wait does not get in, and
the answer is the same whether the username exists or not. Each failure and each lock is
an audit fact (address, attempted account when it exists; never a password or a token).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.translation import ngettext

from console.models import Throttle
from lifecycle import audit


@dataclass(frozen=True)
class Key:
    key: str
    lock_after: int


def client_address(request) -> str:
    """The client's address: the socket's, or the one TRUSTED_PROXIES proxies saw.

    IPv6 addresses are grouped by /64, since one client usually holds a whole /64; an IPv4
    address written as IPv6 (`::ffff:a.b.c.d`, as a dual-stack socket or proxy gives it) is
    that IPv4 address (grouped by /64, every IPv4 client would share one key).
    """
    raw = request.META.get("REMOTE_ADDR", "")
    if settings.TRUSTED_PROXIES > 0:
        hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
        if len(hops) >= settings.TRUSTED_PROXIES:
            raw = hops[-settings.TRUSTED_PROXIES]
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return "unknown"
    if address.version == 6 and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _policy() -> dict:
    return settings.LOGIN_THROTTLE


def login_keys(username: str, address: str) -> list[Key]:
    digest = salted_hmac("lethe.throttle.username", username.strip().casefold(), algorithm="sha256").hexdigest()
    policy = _policy()
    return [Key(f"login-user:{digest}", policy["user_lock_after"]),
            Key(f"login-addr:{address}", policy["address_lock_after"])]


def token_keys(address: str) -> list[Key]:
    return [Key(f"token-addr:{address}", _policy()["address_lock_after"])]


def wait_seconds(keys: list[Key]) -> int:
    """How long these keys must still wait (0: an attempt may go ahead)."""
    now = timezone.now()
    until = (Throttle.objects.filter(key__in=[k.key for k in keys], blocked_until__gt=now)
             .order_by("-blocked_until").values_list("blocked_until", flat=True).first())
    return 0 if until is None else max(1, math.ceil((until - now).total_seconds()))


def describe_wait(seconds: int) -> str:
    if seconds < 60:
        return ngettext("%(n)d second", "%(n)d seconds", seconds) % {"n": seconds}
    minutes = math.ceil(seconds / 60)
    return ngettext("%(n)d minute", "%(n)d minutes", minutes) % {"n": minutes}


def _locked_row(key: str) -> Throttle:
    row = Throttle.objects.select_for_update().filter(key=key).first()
    if row is None:
        try:
            with transaction.atomic():
                row = Throttle.objects.create(key=key)
        except IntegrityError:  # another process made it first
            row = Throttle.objects.select_for_update().get(key=key)
    return row


def _count(row: Throttle, key: Key, now, policy: dict) -> bool:
    """Count one failure on a locked row (not saved); True when it starts a lock."""
    if row.first_failure_at is None or now - row.first_failure_at > timedelta(seconds=policy["window_seconds"]):
        row.failures, row.first_failure_at, row.locked = 0, now, False
    row.failures += 1
    extra = row.failures - policy["free_failures"]
    starts_lock = False
    if row.failures >= key.lock_after:
        starts_lock = not (row.locked and row.blocked_until and row.blocked_until > now)
        row.locked = True
        row.blocked_until = now + timedelta(seconds=policy["lock_seconds"])
    elif extra > 0:
        delay = min(policy["delay_seconds"] * 2 ** (extra - 1), policy["max_delay_seconds"])
        row.blocked_until = now + timedelta(seconds=delay)
    row.updated_at = now
    return starts_lock


def _audit_failure(kind: str, *, address: str, username: str, reason: str, locks: list[str], now) -> None:
    """Audit one failure and each lock it started; then forget keys long over."""
    policy = _policy()
    user = get_user_model().objects.filter(username=username).first() if username else None
    detail = {"address": address, "account": user.get_username() if user else None}
    if reason:
        detail["reason"] = reason
    with transaction.atomic():
        audit.record(f"{kind}_failed", actor=user, new=detail)
        for scope in locks:
            audit.record(f"{kind}_locked", actor=user, new={**detail, "scope": scope,
                                                            "seconds": policy["lock_seconds"]})
    forget_past(now)


def forget_past(now=None) -> int:
    """Forget the keys (an address, a username's keyed hash) whose window and lock are long
    over; after each failure, and hourly with the facts' expiry (r103: a quiet install kept a
    failed sign-in's address for good, after its audit fact had expired). Returns how many."""
    policy = _policy()
    horizon = (now or timezone.now()) - timedelta(seconds=max(policy["window_seconds"], policy["lock_seconds"]) + 60)
    return Throttle.objects.filter(updated_at__lt=horizon).delete()[0]


def record_failure(keys: list[Key], *, kind: str, address: str, username: str = "", reason: str = "") -> None:
    """Count one failure under every key; audit it, and audit each lock it starts, in the
    same transaction (a count is never stored without its audit fact, nor one without the
    other)."""
    policy = _policy()
    now = timezone.now()
    locks = []
    with transaction.atomic():
        for key in keys:
            row = _locked_row(key.key)
            if _count(row, key, now, policy):
                locks.append(key.key.split(":", 1)[0])
            row.save()
        _audit_failure(kind, address=address, username=username, reason=reason, locks=locks, now=now)


@dataclass
class Attempt:
    """A sign-in attempt, counted as a failure under its keys before its password is checked,
    in the transaction that checked their waits: attempts made at the same moment are counted
    one after the other, so they cannot all pass one check while the slow password hashes
    run. `failed` audits it; `succeeded` and `taken_back` take the count back."""

    keys: list[Key]
    address: str
    username: str
    at: object
    locks: list[str] = field(default_factory=list)
    # each key's row before this attempt counted, and its failures after
    before: dict[str, tuple] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)


def begin_attempt(keys: list[Key], *, address: str, username: str) -> tuple[int, Attempt | None]:
    """(seconds to wait, None) when a key must still wait, or (0, the attempt, counted)."""
    policy = _policy()
    now = timezone.now()
    with transaction.atomic():
        rows = [(key, _locked_row(key.key)) for key in keys]
        until = max((row.blocked_until for _key, row in rows if row.blocked_until and row.blocked_until > now),
                    default=None)
        if until is not None:
            return max(1, math.ceil((until - now).total_seconds())), None
        attempt = Attempt(keys, address, username, now)
        for key, row in rows:
            attempt.before[key.key] = (row.failures, row.first_failure_at, row.blocked_until, row.locked)
            if _count(row, key, now, policy):
                attempt.locks.append(key.key.split(":", 1)[0])
            attempt.after[key.key] = row.failures
            row.save()
    return 0, attempt


def failed(attempt: Attempt, *, kind: str = "login") -> None:
    """The password was wrong: the count stays; audit it and the locks it started.

    The count was stored before the password was checked (begin_attempt), so a process that
    dies while the password hashes leaves the attempt counted without an audit fact: an
    attempt whose password was never judged is no audited failure, and counting it keeps a
    guesser from escaping the count by dropping connections."""
    _audit_failure(kind, address=attempt.address, username=attempt.username, reason="", locks=attempt.locks,
                   now=attempt.at)


def taken_back(attempt: Attempt, *, clear_username: bool = False) -> None:
    """The attempt was no failure: take its count back (each key as it was, unless others
    counted since: then only this one), or, for a correct sign-in, clear the username's
    count (never the address's)."""
    with transaction.atomic():
        for key in attempt.keys:
            if clear_username and key.key.startswith("login-user:"):
                Throttle.objects.filter(key=key.key).delete()
                continue
            row = Throttle.objects.select_for_update().filter(key=key.key).first()
            if row is None:
                continue
            if row.failures == attempt.after[key.key]:
                row.failures, row.first_failure_at, row.blocked_until, row.locked = attempt.before[key.key]
            else:
                row.failures = max(0, row.failures - 1)
            row.save()


def succeeded(attempt: Attempt) -> None:
    """A correct sign-in: its count is taken back and the username's cleared."""
    taken_back(attempt, clear_username=True)
