"""The Data & storage breadcrumb is made of links, and each level leads somewhere."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def test_every_breadcrumb_level_is_a_link_that_answers(member_client):
    page = member_client.get("/settings/system/data-storage/", **HOST).content.decode()
    crumbs = re.search(r'<nav class="crumbs" aria-label="Breadcrumb">(.*?)</nav>', page, re.S).group(1)
    links = re.findall(r'<a href="([^"]+)"( aria-current="page")?>([^<]+)</a>', crumbs)
    assert [(href, text) for href, _current, text in links] == [
        ("/settings/", "Settings"), ("/settings/system/", "System"),
        ("/settings/system/data-storage/", "Data & storage"),
    ]
    assert [bool(current) for _href, current, _text in links] == [False, False, True]
    for href, _current, _text in links:
        response = member_client.get(href, follow=True, **HOST)
        assert response.status_code == 200 and response.redirect_chain[-1:] in ([], [("/settings/system/data-storage/", 302)])
