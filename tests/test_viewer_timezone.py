"""Times are shown in the viewer's zone: the browser's, or one they chose; never a bogus one."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from console.viewer import BROWSER_COOKIE, CHOSEN_COOKIE, zone_choices
from lifecycle.models import Conversation
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
MOMENT = datetime(2026, 1, 15, 13, 5, tzinfo=UTC)


@pytest.fixture
def dated(db) -> Conversation:
    conv = factories.make_conversation(title="Dated")
    Conversation.objects.filter(pk=conv.pk).update(last_activity_at=MOMENT)
    return conv


def detail(client, conv) -> str:
    return client.get(f"/conversations/{conv.public_id}/", **HOST).content.decode()


def test_it_shows_times_in_utc_with_the_zone_named_when_nothing_is_known(member_client, dated):
    assert "Jan. 15, 2026, 1:05 p.m. UTC" in detail(member_client, dated)


def test_it_shows_times_in_the_zone_the_browser_reports(member_client, dated):
    member_client.cookies[BROWSER_COOKIE] = "Europe/Madrid"
    page = detail(member_client, dated)
    assert "Jan. 15, 2026, 2:05 p.m. CET" in page
    assert '<option value="" selected>Europe/Madrid (automatic)</option>' in page


@pytest.mark.parametrize(("zone", "first", "second"), [
    ("Europe/Madrid", "Oct. 25, 2026, 2:30 a.m. CEST", "Oct. 25, 2026, 2:30 a.m. CET"),
    ("America/New_York", "Nov. 1, 2026, 1:30 a.m. EDT", "Nov. 1, 2026, 1:30 a.m. EST"),
])
def test_the_two_moments_of_a_repeated_hour_each_name_their_zone(member_client, zone, first, second):
    """r87: inside the hour a clock change repeats, the zone was left out (Django's "T" gives
    none there), so two times an hour apart read the same."""
    clock_back = {"Europe/Madrid": datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
                  "America/New_York": datetime(2026, 11, 1, 5, 30, tzinfo=UTC)}[zone]
    conversations = [factories.make_conversation(title=f"Hour {n}") for n in range(2)]
    for n, conv in enumerate(conversations):
        Conversation.objects.filter(pk=conv.pk).update(last_activity_at=clock_back.replace(hour=clock_back.hour + n))
    member_client.cookies[BROWSER_COOKIE] = zone
    assert first in detail(member_client, conversations[0]) and second in detail(member_client, conversations[1])
    member_client.cookies["django_language"] = "es"
    spanish = detail(member_client, conversations[1])
    assert re.search(r"a las 0?[12]:30 (CET|EST)<", spanish), re.findall(r"a las [^<]*<", spanish)


def test_a_chosen_zone_wins_over_the_browser(member_client, dated):
    member_client.cookies[BROWSER_COOKIE] = "Europe/Madrid"
    response = member_client.post("/i18n/settz/", {"timezone": "Asia/Tokyo", "next": "/conversations/"}, **HOST)
    assert response.status_code == 302 and response["Location"] == "/conversations/"
    assert response.cookies[CHOSEN_COOKIE].value == "Asia/Tokyo"
    page = detail(member_client, dated)
    assert "Jan. 15, 2026, 10:05 p.m. JST" in page
    assert "<option selected>Asia/Tokyo</option>" in page

    # Back to automatic: the chosen cookie goes, the browser's zone applies again.
    response = member_client.post("/i18n/settz/", {"timezone": "", "next": "/conversations/"}, **HOST)
    assert response.cookies[CHOSEN_COOKIE].value == ""
    assert "2:05 p.m. CET" in detail(member_client, dated)


@pytest.mark.parametrize("bogus", ["Mars/Olympus", "localtime", "Factory", "../../etc/passwd", "x" * 300, "UTC\x00"])
def test_it_ignores_zones_that_do_not_exist(member_client, dated, bogus):
    member_client.cookies[BROWSER_COOKIE] = bogus
    member_client.cookies[CHOSEN_COOKIE] = bogus
    assert "1:05 p.m. UTC" in detail(member_client, dated)
    response = member_client.post("/i18n/settz/", {"timezone": bogus, "next": "https://evil.example/"}, **HOST)
    assert response.status_code == 302 and response["Location"] == "/"
    assert CHOSEN_COOKIE not in response.cookies


def test_an_alias_the_picker_leaves_out_is_still_shown_as_chosen(member_client, dated):
    assert "US/Eastern" not in zone_choices() and "Europe/Madrid" in zone_choices()
    member_client.cookies[CHOSEN_COOKIE] = "US/Eastern"
    page = detail(member_client, dated)
    assert "8:05 a.m. EST" in page and "<option selected>US/Eastern</option>" in page


def test_the_api_keeps_answering_in_utc(member_client, dated):
    member_client.cookies[BROWSER_COOKIE] = "Asia/Tokyo"
    row = member_client.get(f"/v1/threads/{dated.public_id}", **HOST).json()
    assert row["last_activity_at"] == "2026-01-15T13:05:00Z"


def test_every_page_with_an_absolute_time_names_its_zone(admin_client, admin_user):
    """Not only the conversation pages: a delete's page, an engine delete's page and the API
    tokens page show each absolute time with its zone, in the viewer's zone."""
    from console.models import ApiToken
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor
    from tests.test_remote_delete_screens import RECEIPT, completed

    admin_client.cookies[BROWSER_COOKIE] = "America/New_York"
    conversation = factories.make_conversation(title="Zoned")
    op = request_deletion(conversation, key="zoned-1", acting_user=None)
    executor.run_erasure(op.pk)
    bound = completed(RECEIPT)
    ApiToken.issue(admin_user)
    for url in (f"/operations/{op.public_id}/", f"/engine/deletes/{bound.public_id}/", "/settings/api-tokens/"):
        page = admin_client.get(url, HTTP_HOST="127.0.0.1").content.decode()
        # Django leaves the minutes out at the hour ("2 p.m.") and says noon and midnight: the
        # times are now's, so any of them may come up.
        times = re.findall(r"(?:\d{1,2}(?::\d\d)? [ap]\.m\.|noon|midnight)(?: [A-Z]{2,5})?", page)
        assert times and all(t.endswith((" EST", " EDT")) for t in times), (url, times)


@pytest.mark.parametrize("secure", [False, True])
def test_the_preference_cookies_are_secure_when_the_console_is_served_over_https(member_client, settings, secure):
    """r51: with HTTPS=true the session and CSRF cookies were Secure, the language and time zone
    cookies were not (settings.py sets LANGUAGE_COOKIE_SECURE with HTTPS)."""
    settings.LANGUAGE_COOKIE_SECURE = secure
    zone = member_client.post("/i18n/settz/", {"timezone": "Asia/Tokyo", "next": "/conversations/"}, **HOST)
    language = member_client.post("/i18n/setlang/", {"language": "es", "next": "/conversations/"}, **HOST)
    assert bool(zone.cookies[CHOSEN_COOKIE]["secure"]) is secure
    assert bool(language.cookies[settings.LANGUAGE_COOKIE_NAME]["secure"]) is secure
