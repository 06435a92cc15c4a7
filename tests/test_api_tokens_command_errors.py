"""Command-line refusals: `api_tokens list --user` for a user that does not exist, `api_tokens
revoke` with the start of a prefix, a prefix two tokens share, none, or a token only by case, and
`bench_pages --requests` below 1. Each refuses with a CommandError (exit 1 from manage.py) and
changes nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from console.models import ApiToken
from lifecycle.models import AuditFact
from tests import factories

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_listing_the_tokens_of_a_user_that_does_not_exist_says_so(admin_user):
    ApiToken.issue(admin_user, name="Script A")
    with pytest.raises(CommandError, match=r"^No user named 'nobody'\.$"):
        run("api_tokens", "list", "--user", "nobody")
    # A user with no tokens is a user: an empty table, as before.
    factories.make_user("carol")
    assert run("api_tokens", "list", "--user", "carol").splitlines()[1:] == []
    assert "Script A" in run("api_tokens", "list", "--user", "alice")


def two_tokens_sharing(admin_user, start: str) -> tuple[ApiToken, ApiToken]:
    a, _raw = ApiToken.issue(admin_user, name="Script A")
    b, _raw = ApiToken.issue(admin_user, name="Script B")
    ApiToken.objects.filter(pk=a.pk).update(prefix=start + "aa")
    ApiToken.objects.filter(pk=b.pk).update(prefix=start + "bb")
    a.refresh_from_db()
    b.refresh_from_db()
    return a, b


def test_the_start_of_a_prefix_names_the_tokens_it_fits_and_revokes_none(admin_user):
    """Revoking cannot be undone: only an id or a whole prefix revokes. The start of one (the
    reviewer's `revoke lethe_`, which said "No token matches") names the tokens it fits."""
    a, b = two_tokens_sharing(admin_user, "lethe_Xy12")
    for start in ("lethe_Xy12", "lethe_Xy12b"):
        with pytest.raises(CommandError) as caught:
            run("api_tokens", "revoke", start)
        message = str(caught.value)
        assert message.startswith(f"No token has the prefix '{start}'; ") and "nothing was revoked" in message
        assert f"{b.prefix} (id {b.pk})" in message
        assert (f"{a.prefix} (id {a.pk})" in message) == (start == "lethe_Xy12")
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    assert not AuditFact.objects.filter(action="api_token_revoked").exists()
    # The whole prefix, as `list` shows it, or the id, revokes that one only.
    assert run("api_tokens", "revoke", b.prefix).strip() == f"Revoked {b.prefix} (Script B)."
    assert list(ApiToken.objects.filter(revoked_at__isnull=False)) == [b]
    assert run("api_tokens", "revoke", str(a.pk)).strip() == f"Revoked {a.prefix} (Script A)."


def test_two_tokens_with_the_same_prefix_are_named_and_neither_is_revoked(admin_user):
    a, b = two_tokens_sharing(admin_user, "lethe_Same")
    ApiToken.objects.filter(pk__in=[a.pk, b.pk]).update(prefix="lethe_Same00")
    with pytest.raises(CommandError, match=r"^2 tokens have the prefix 'lethe_Same00': .*Give the id; nothing"):
        run("api_tokens", "revoke", "lethe_Same00")
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()


@pytest.mark.parametrize("given", ["\u00b2", "\u0663"])
def test_a_digit_that_is_not_ascii_is_neither_an_id_nor_a_crash(admin_user, given):
    """`str.isdigit` passes "²" (which int() refuses: a traceback) and "٣" (which int() reads as
    3: another token's id). Only ASCII digits are an id; anything else is a prefix, unknown here."""
    for n in range(3):
        ApiToken.issue(admin_user, name=f"Script {n}")
    with pytest.raises(CommandError, match=r"^No token matches"):
        run("api_tokens", "revoke", given)
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    assert not AuditFact.objects.filter(action="api_token_revoked").exists()


def test_a_prefix_matches_case_sensitively_and_an_unknown_one_matches_nothing(admin_user):
    a, b = two_tokens_sharing(admin_user, "lethe_Ab")
    ApiToken.objects.filter(pk=b.pk).update(prefix="lethe_aBcdef")
    with pytest.raises(CommandError, match=r"^No token matches 'lethe_abcdef'\.$"):
        run("api_tokens", "revoke", "lethe_abcdef")
    with pytest.raises(CommandError, match=r"^No token matches 'lethe_zz'\.$"):
        run("api_tokens", "revoke", "lethe_zz")
    with pytest.raises(CommandError, match="id or its prefix"):
        run("api_tokens", "revoke", " ")
    assert run("api_tokens", "revoke", "lethe_aBcdef").strip() == "Revoked lethe_aBcdef (Script B)."
    assert not ApiToken.objects.get(pk=a.pk).revoked_at


@pytest.mark.parametrize("requests", ["0", "-1"])
def test_bench_pages_refuses_fewer_than_one_request(requests):
    factories.make_conversation(title="Something to measure")
    with pytest.raises(CommandError, match=r"^--requests must be from 1 to 100000 \(requests per page\); got "):
        run("bench_pages", "--requests", requests)
    assert not get_user_model().objects.filter(username__startswith="bench-reader").exists()


@pytest.mark.parametrize(("args", "said"), [
    (("--days", "0"), "--days: Ensure this value is greater than or equal to 1."),
    (("--days", "100000"), "--days: Ensure this value is less than or equal to"),
    (("--days", "5", "--name", " "), "--name: This field is required."),
])
def test_a_refused_new_token_names_the_option_the_rule_is_about(admin_user, args, said):
    """"--days 0" answered only "Ensure this value is greater than or equal to 1." (r42)."""
    with pytest.raises(CommandError) as refused:
        run("api_tokens", "create", admin_user.username, "--name", "Script", *args)
    assert str(refused.value).startswith(said)
    assert not ApiToken.objects.exists()


def test_the_default_name_of_a_long_username_is_not_refused_as_if_given():
    """create_api_token names the token "<user> token"; for a long username that passed the
    name's limit and was refused as "--name: ...", an option the operator never gave (r45)."""
    user = get_user_model().objects.create_user("u" * 150, password="pw-long-user-1")
    raw = run("create_api_token", user.username).strip()
    token = ApiToken.objects.get(user=user)
    assert raw.startswith(token.prefix) and len(token.name) <= 120 and token.name.endswith("… token")
