"""The console's icon: every page names it, and /favicon.ico (where a browser looks when a page
names none: a page the web server answers itself) leads to it, signed in or not (r96: a 404
there put an error in every new browser session's console)."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders
from django.templatetags.static import static

from console.views import plain_page

HOST = {"HTTP_HOST": "127.0.0.1"}


def test_the_icon_is_an_svg_file_of_the_static_files():
    path = finders.find("favicon.svg")
    assert path is not None
    with open(path, encoding="utf-8") as f:
        assert f.read().startswith('<svg xmlns="http://www.w3.org/2000/svg"')


@pytest.mark.django_db
def test_favicon_ico_leads_to_the_icon_for_anyone(client, admin_client):
    for who in (client, admin_client):
        for answer in (who.get("/favicon.ico", **HOST), who.head("/favicon.ico", **HOST)):
            assert (answer.status_code, answer["Location"]) == (302, static("favicon.svg"))
    assert client.post("/favicon.ico", **HOST).status_code == 405


@pytest.mark.django_db
def test_pages_and_error_pages_name_the_icon(client, admin_client):
    icon = f'<link rel="icon" href="{static("favicon.svg")}" type="image/svg+xml">'
    assert icon in client.get("/accounts/login/", **HOST).content.decode()
    assert icon in admin_client.get("/conversations/", **HOST).content.decode()
    assert icon in client.get("/no-such-page/", **HOST).content.decode()
    assert icon in plain_page("error", status=500).content.decode()
    assert icon in plain_page("database_busy", status=503).content.decode()
