from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from console.models import ApiToken, hash_token
from lifecycle.models import AuditFact

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
PAGE = "/settings/api-tokens/"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def api(raw: str, path: str = "/v1/threads"):
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(path, **HOST)


def test_a_token_opens_the_api_only_never_the_screens(admin_user):
    """The screens take the session and CSRF only: an admin's token cannot make another token
    (which would outlive its own revocation), revoke one, or read a page."""
    _token, raw = ApiToken.issue(admin_user, name="script")
    scripted = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", enforce_csrf_checks=True, **HOST)
    made = scripted.post(PAGE, {"name": "persist", "days": "3650", "form_number": "abcdefghijklmnopqrst"})
    assert made.status_code == 403 and ApiToken.objects.count() == 1
    other, _other_raw = ApiToken.issue(admin_user, name="other")
    revoked = scripted.post(f"{PAGE}{other.pk}/revoke/")
    other.refresh_from_db()
    assert revoked.status_code == 403 and other.revoked_at is None
    page = scripted.get("/conversations/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")
    assert scripted.get("/v1/threads").status_code == 200  # the API takes it


# The command ------------------------------------------------------------------------

def test_the_command_creates_a_named_expiring_token_and_prints_it_once(admin_user):
    raw = run("api_tokens", "create", "alice", "--name", "Nightly export").strip()
    token = ApiToken.objects.get()
    assert raw.startswith("lethe_") and token.key_hash == hash_token(raw) and raw not in str(token.__dict__)
    assert token.name == "Nightly export" and token.prefix == raw[:12]
    assert abs(token.expires_at - (timezone.now() + timedelta(days=90))) < timedelta(minutes=1)
    assert api(raw).status_code == 200
    assert AuditFact.objects.get().action == "api_token_created"


def test_the_lifetime_comes_from_the_setting_or_the_option(settings, admin_user):
    settings.API_TOKEN_DAYS = 7
    run("api_tokens", "create", "alice", "--name", "a")
    run("api_tokens", "create", "alice", "--name", "b", "--days", "30")
    a, b = ApiToken.objects.get(name="a"), ApiToken.objects.get(name="b")
    assert (a.expires_at - a.created_at).days == 7 and (b.expires_at - b.created_at).days == 30


@pytest.mark.parametrize("args", [["--days", "0"], ["--days", "99999"], ["--name", ""], ["--name", "x" * 121],
                                  ["--name", "tab\there"], ["--name", "\u202eevil"], ["--name", "a\u200b"],
                                  ["--name", "\u2066x\u2069"], ["--name", "a\u2028b"], ["--days", "٣"],
                                  ["--name", "\ufeffscript"], ["--name", "\u200d"], ["--name", "\u200c \u200f"],
                                  ["--days", "+3"], ["--days", "1_0"]])
def test_the_command_refuses_bad_input_and_makes_nothing(admin_user, args):
    base = {"--name": "ok", "--days": "10"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    with pytest.raises(CommandError):
        run("api_tokens", "create", "alice", *[x for pair in base.items() for x in pair])
    with pytest.raises(CommandError):
        run("api_tokens", "create", "nobody", "--name", "ok")
    assert ApiToken.objects.count() == 0 and AuditFact.objects.count() == 0


# Names with the joiners and direction marks the pages keep as legitimate (r123: "Use letters,
# digits, spaces and punctuation only." for an emoji sequence or a Persian word)
KEPT_NAMES = ["\U0001f469\u200d\U0001f4bb laptop script", "اسکریپت شب\u200cانه", "\u200fגיבוי\u200e nightly",
              "\u061c١٢ report", "\U0001f1ea\U0001f1f8 flag"]


@pytest.mark.parametrize("name", KEPT_NAMES)
def test_the_command_takes_a_name_with_a_joiner_or_a_direction_mark(admin_user, name):
    raw = run("create_api_token", "alice", "--name", name).strip()
    token = ApiToken.objects.get()
    assert token.name == name and token.key_hash == hash_token(raw)


def test_the_page_takes_a_name_with_a_joiner_and_refuses_an_override(admin_client):
    name = KEPT_NAMES[0]
    made = admin_client.post(PAGE, {"name": name, "days": "30", "form_number": form_number(admin_client)}, **HOST)
    assert made.status_code == 201 and ApiToken.objects.get().name == name
    for refused in ("\u202eevil", "zero\u200bwidth", "\ufeffscript"):
        page = admin_client.post(PAGE, {"name": refused, "days": "30", "form_number": form_number(admin_client)},
                                 **HOST)
        assert page.status_code == 422 and "Use letters, digits, spaces and punctuation only." in page.content.decode()
    assert list(ApiToken.objects.values_list("name", flat=True)) == [name]


def test_the_old_command_still_works_as_an_alias(admin_user):
    raw = run("create_api_token", "alice").strip()
    token = ApiToken.objects.get()
    assert token.name == "alice token" and api(raw).status_code == 200


def test_the_command_lists_and_revokes(admin_user, member_user):
    raw_a = run("api_tokens", "create", "alice", "--name", "Script A").strip()
    raw_b = run("api_tokens", "create", "bob", "--name", "Script B").strip()
    api(raw_a)
    listing = run("api_tokens", "list")
    assert "Script A" in listing and "Script B" in listing and listing.count("active") == 2
    assert "never" in listing.splitlines()[1] or "never" in listing.splitlines()[2]  # B was never used
    assert "Script B" not in run("api_tokens", "list", "--user", "alice")
    assert "Revoked" in run("api_tokens", "revoke", raw_a[:12])
    token_b = ApiToken.objects.get(name="Script B")
    assert "Revoked" in run("api_tokens", "revoke", str(token_b.pk))
    assert "already revoked" in run("api_tokens", "revoke", str(token_b.pk))
    with pytest.raises(CommandError):
        run("api_tokens", "revoke", "lethe_nothing")
    assert api(raw_a).status_code == 401 and api(raw_b).status_code == 401
    assert "revoked" in run("api_tokens", "list")
    assert list(AuditFact.objects.values_list("action", flat=True)) == [
        "api_token_created", "api_token_created", "api_token_revoked", "api_token_revoked"]


def test_expired_and_revoked_tokens_answer_401_and_use_is_recorded(admin_user):
    _t, active = ApiToken.issue(admin_user, name="active")
    expired_token, expired = ApiToken.issue(admin_user, name="expired")
    ApiToken.objects.filter(pk=expired_token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked_token, revoked = ApiToken.issue(admin_user, name="revoked")
    ApiToken.objects.filter(pk=revoked_token.pk).update(revoked_at=timezone.now())
    assert api(active).status_code == 200
    assert api(expired).status_code == 401 and api(revoked).status_code == 401
    used = ApiToken.objects.get(name="active").last_used_at
    assert used is not None and ApiToken.objects.get(name="expired").last_used_at is None
    api(active)  # within a minute: no new write
    assert ApiToken.objects.get(name="active").last_used_at == used


# The page ---------------------------------------------------------------------------

def form_number(client) -> str:
    """The one-time number of a freshly read create form."""
    return re.search(r'name="form_number" value="([^"]+)"', client.get(PAGE, **HOST).content.decode())[1]


def test_admins_create_a_token_that_is_shown_once(admin_client):
    response = admin_client.post(PAGE, {"name": "Phone app", "days": "30", "form_number": form_number(admin_client)},
                                 **HOST)
    page = response.content.decode()
    assert response.status_code == 201
    raw = re.search(r'id="new-token"[^>]*value="(lethe_[^"]+)"', page)[1]
    token = ApiToken.objects.get()
    assert token.key_hash == hash_token(raw) and token.name == "Phone app"
    assert (token.expires_at - token.created_at).days == 30
    assert api(raw).status_code == 200
    again = admin_client.get(PAGE, **HOST).content.decode()
    assert raw not in again and "Phone app" in again and token.prefix in again
    assert "no-store" in response["Cache-Control"]


def test_the_same_form_sent_again_creates_nothing_and_says_so(admin_client):
    """A reload of the answer (or Back, Forward and resend) sends the same form again: it must
    not mint a second credential the admin never sees."""
    data = {"name": "Phone app", "days": "30", "form_number": form_number(admin_client)}
    assert admin_client.post(PAGE, data, **HOST).status_code == 201
    again = admin_client.post(PAGE, data, **HOST)
    assert again.status_code == 409 and ApiToken.objects.count() == 1
    page = again.content.decode()
    assert "This form was already sent, and nothing was created now." in page
    assert 'id="new-token"' not in page and 'role="alert"' in page
    # A form without a number, or with one this session never handed out, creates nothing either
    for number in ("", "made-up"):
        refused = admin_client.post(PAGE, {**data, "form_number": number}, **HOST)
        assert refused.status_code == 409 and "This form has expired." in refused.content.decode()
    assert ApiToken.objects.count() == 1
    # A fresh form creates the next one
    fresh = {"name": "Second", "days": "30", "form_number": form_number(admin_client)}
    assert admin_client.post(PAGE, fresh, **HOST).status_code == 201 and ApiToken.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_form_sent_twice_at_the_same_instant_creates_one_token(admin_user):
    """A double click: two requests with the same form number race. The number is claimed by
    the database (a unique column), so one creates the token and the other says it was sent."""
    import threading

    client = Client()
    client.force_login(admin_user)
    data = {"name": "Raced", "days": "30", "form_number": form_number(client)}
    start = threading.Barrier(2)
    codes, pages = [], []

    def send():
        own = Client()
        own.cookies = client.cookies  # the same session, as two requests of one browser tab
        start.wait()
        try:
            answer = own.post(PAGE, data, **HOST)
            codes.append(answer.status_code)
            pages.append(answer.content.decode())
        finally:
            connection.close()  # this thread's own connection, or the test database stays in use

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(codes) == [201, 409] and ApiToken.objects.filter(name="Raced").count() == 1
    # the one that lost names the token the other made
    raced = ApiToken.objects.get(name="Raced")
    assert sum(f"({raced.prefix}…)" in page and "Its first submission created the token" in page
               for page in pages) == 1


def resent_notice(page: str) -> str:
    return re.search(r'<div class="alert alert-warn flash" role="alert" data-testid="token-form-resent">(.*?)</div>',
                     page, re.S)[1]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_a_double_submit_names_the_token_the_first_one_made_and_offers_its_revoke(admin_client, lang):
    """A second tap on Create token before the first answer shows: the browser shows only the
    second answer. It said the token "was shown once", which the person never saw, and gave no
    way to the token. It now names the token (as the list shows it), never its value, says the
    value must be revoked and made again if it was not copied, and links to the revoke."""
    ask = {"HTTP_ACCEPT_LANGUAGE": lang, **HOST}
    data = {"name": "Phone app", "days": "30", "form_number": form_number(admin_client)}
    first = admin_client.post(PAGE, data, **ask)
    second = admin_client.post(PAGE, data, **ask)
    assert (first.status_code, second.status_code) == (201, 409)
    token = ApiToken.objects.get()  # one row
    raw = re.search(r'id="new-token"[^>]*value="(lethe_[^"]+)"', first.content.decode())[1]
    assert token.key_hash == hash_token(raw) and token.form_number == data["form_number"]
    page = second.content.decode()
    assert raw not in page and raw[len(token.prefix):] not in page and 'id="new-token"' not in page
    notice = resent_notice(page)
    words = {
        "en": ["This form was already sent, and nothing was created now.",
               "Its first submission created the token “<bdi>Phone app</bdi>” (" + token.prefix + "…) at ",
               "If you did not copy the value, revoke this token and create a new one.", "Revoke"],
        "es": ["Este formulario ya se envió y ahora no se creó nada.",
               "Su primer envío creó el token «<bdi>Phone app</bdi>» (" + token.prefix + "…) el ",
               "Si no copió el valor, revoque este token y cree uno nuevo.", "Revocar"],
    }[lang]
    for text in words:
        assert text in notice, text
    # the time as the list shows it, and the way to revoke it right there
    row = re.search(rf'data-testid="token-{token.pk}">(.*?)</li>', page, re.S)[1]
    user, created = re.findall(r"<dd>([^<]*)</dd>", row)[:2]  # (the first, "Starts with", holds a <code>)
    assert user == "alice" and f"{token.prefix}…) {'at' if lang == 'en' else 'el'} {created}." in notice
    assert f'href="/settings/api-tokens/{token.pk}/revoke/"' in notice
    # later pages never show the value either; the revoke it links to works
    assert raw not in admin_client.get(PAGE, **ask).content.decode()
    assert admin_client.post(f"/settings/api-tokens/{token.pk}/revoke/", **ask).status_code == 302
    assert ApiToken.objects.get().revoked_at is not None and api(raw).status_code == 401


def test_a_resent_form_whose_token_is_revoked_says_so_without_a_revoke(admin_client):
    data = {"name": "Phone app", "days": "30", "form_number": form_number(admin_client)}
    assert admin_client.post(PAGE, data, **HOST).status_code == 201
    token = ApiToken.objects.get()
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    again = admin_client.post(PAGE, data, **HOST)
    notice = resent_notice(again.content.decode())
    assert again.status_code == 409 and ApiToken.objects.count() == 1
    assert f"({token.prefix}…)" in notice and "That token can no longer be used" in notice and "/revoke/" not in notice


def test_an_expired_form_keeps_what_was_typed(admin_client):
    page = admin_client.post(PAGE, {"name": "Typed name", "days": "45", "form_number": ""}, **HOST)
    assert page.status_code == 409 and ApiToken.objects.count() == 0
    text = page.content.decode()
    assert 'value="Typed name"' in text and 'value="45"' in text and "This form has expired." in text


def test_a_refused_form_focuses_and_announces_its_first_error(admin_client):
    page = admin_client.post(PAGE, {"name": "", "days": "30", "form_number": form_number(admin_client)},
                             **HOST).content.decode()
    assert re.search(r'<input id="id_name"[^>]*aria-invalid="true" autofocus>', page)
    assert '<p class="field-error" id="name-error" role="alert">' in page


@pytest.mark.parametrize("data", [{"name": "", "days": "30"}, {"name": "x" * 121, "days": "30"},
                                  {"name": "ok", "days": "0"}, {"name": "ok", "days": "3651"},
                                  {"name": "ok", "days": "ten"}, {"name": "bell\x07", "days": "3"}, {}])
def test_the_page_refuses_bad_input_and_makes_nothing(admin_client, data):
    response = admin_client.post(PAGE, data, **HOST)
    assert response.status_code == 422 and 'class="field-error"' in response.content.decode()
    assert ApiToken.objects.count() == 0


def test_admins_revoke_after_a_confirmation_page(admin_client, admin_user):
    token, raw = ApiToken.issue(admin_user, name="Old script")
    listing = admin_client.get(PAGE, **HOST).content.decode()
    assert f"/settings/api-tokens/{token.pk}/revoke/" in listing
    confirm = admin_client.get(f"{PAGE}{token.pk}/revoke/", **HOST)
    assert confirm.status_code == 200 and "Revoke “Old script”?" in confirm.content.decode()
    assert api(raw).status_code == 200  # looking at the confirmation changes nothing
    done = admin_client.post(f"{PAGE}{token.pk}/revoke/", **HOST)
    assert done.status_code == 302 and done["Location"] == f"{PAGE}?revoked={token.pk}"
    page = admin_client.get(done["Location"], **HOST).content.decode()
    assert "is revoked" in page and "Revoked" in page
    assert api(raw).status_code == 401
    assert admin_client.post(f"{PAGE}{token.pk}/revoke/", **HOST).status_code == 302  # twice: no change
    assert AuditFact.objects.filter(action="api_token_revoked").count() == 1
    assert admin_client.post(f"{PAGE}999999/revoke/", **HOST).status_code == 404


def test_members_see_their_own_tokens_read_only_and_no_one_elses(member_client, member_user, admin_user):
    """A member sees only the tokens of their own account (read-only): another user's token
    names, prefixes, users and last use are not theirs to see, not even through ?revoked=."""
    token, raw = ApiToken.issue(admin_user, name="Admin script")
    own, _own_raw = ApiToken.issue(member_user, name="Member export")
    page = member_client.get(PAGE, **HOST)
    html = page.content.decode()
    assert page.status_code == 200 and "Member export" in html and own.prefix in html
    assert "Admin script" not in html and token.prefix not in html and "alice" not in html
    assert "Only admins can create or revoke them." in html
    assert "Only your own tokens are shown." in html
    shown = member_client.get(f"{PAGE}?revoked={token.pk}", **HOST).content.decode()
    assert "Admin script" not in shown and token.prefix not in shown
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    assert "<form" not in html.split("Create a token")[1].split("</section>")[0]
    assert "/revoke/" not in html
    assert member_client.post(PAGE, {"name": "mine", "days": "3"}, **HOST).status_code == 403
    assert member_client.get(f"{PAGE}{token.pk}/revoke/", **HOST).status_code == 403
    assert member_client.post(f"{PAGE}{token.pk}/revoke/", **HOST).status_code == 403
    assert ApiToken.objects.count() == 2 and api(raw).status_code == 200
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_admins_see_every_users_tokens(admin_client, member_user, admin_user):
    ApiToken.issue(admin_user, name="Admin script")
    ApiToken.issue(member_user, name="Member export")
    html = admin_client.get(PAGE, **HOST).content.decode()
    assert "Admin script" in html and "Member export" in html and "bob" in html
    assert "Only your own tokens are shown." not in html


@pytest.mark.parametrize("revoked", ["\u00b2", "\u0663", "9" * 30, "-1", "x"])
def test_a_revoked_mark_that_is_not_a_token_number_just_shows_the_page(admin_client, admin_user, revoked):
    """`?revoked=` names the token a revoke just took; anything that is not a plain number (a
    superscript digit passes str.isdigit but not int()) is ignored, never a server error."""
    token, _raw = ApiToken.issue(admin_user, name="Admin script")
    page = admin_client.get(PAGE, {"revoked": revoked}, **HOST)
    assert page.status_code == 200 and 'data-testid="token-revoked"' not in page.content.decode()
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_the_page_is_localized(admin_client, admin_user):
    ApiToken.issue(admin_user, name="x")
    html = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Create a token" not in html and "Last used" not in html


def test_a_token_of_an_inactive_user_is_said_so_and_none_is_made_for_one(admin_user, member_user, admin_client):
    """Made for an inactive user without a word and listed as active, while every request with
    it answered 401."""
    _token, raw = ApiToken.issue(member_user, name="Old laptop")
    member_user.is_active = False
    member_user.save()
    assert api(raw).status_code == 401
    listed = run("api_tokens", "list", "--user", member_user.username)
    assert re.search(r"\binactive\s+" + member_user.username, listed), listed
    page = admin_client.get("/settings/api-tokens/", **HOST).content.decode()
    assert "badge-token-inactive" in page and "User inactive" in page
    assert "/revoke/" in page  # it can still be revoked
    with pytest.raises(CommandError, match="is inactive"):
        run("api_tokens", "create", member_user.username, "--name", "New")
    assert ApiToken.objects.filter(user=member_user).count() == 1


def test_the_page_lists_tokens_a_page_at_a_time_in_a_constant_number_of_queries(admin_client, admin_user,
                                                                                  member_user, member_client):
    from django.test.utils import CaptureQueriesContext

    from console.token_views import TOKENS_PAGE

    def queries(client) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(PAGE, **HOST).status_code == 200
        return len(captured.captured_queries)

    for i in range(2):
        ApiToken.issue(admin_user, name=f"script {i}")
    few = queries(admin_client)
    tokens = [ApiToken.issue(admin_user, name=f"script {i}")[0] for i in range(2, TOKENS_PAGE + 5)]
    assert queries(admin_client) == few
    first = admin_client.get(PAGE, **HOST).content.decode()
    assert first.count('class="token-row"') == TOKENS_PAGE and f"token-{tokens[-1].pk}" in first  # newest first
    assert 'data-pager="next"' in first and "Page 1 of 2" in first
    second = admin_client.get(f"{PAGE}?page=2", **HOST).content.decode()
    assert second.count('class="token-row"') == 5 and 'data-pager="previous"' in second
    assert f"/settings/api-tokens/{tokens[0].pk}/revoke/" in second  # the oldest, revocable on its page
    own, _raw = ApiToken.issue(member_user, name="Member export")
    mine = member_client.get(f"{PAGE}?page=2", **HOST).content.decode()  # past the last: the last
    assert mine.count('class="token-row"') == 1 and own.prefix in mine and "data-pager" not in mine
