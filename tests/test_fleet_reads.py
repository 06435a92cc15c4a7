"""Reads of the fleet files that change nothing reuse the last parse of an unchanged file (a
large fleet takes long to parse); a changed file is read again."""

from __future__ import annotations

import os

import pytest

from lifecycle import enginefs, fleet
from lifecycle.enginefs import EngineHome
from tests import factories

pytestmark = pytest.mark.django_db

def test_it_reads_a_changed_fleet_again(parses):
    home = EngineHome()
    fleet.put_row({"agent_id": "a1", "status": "done", "delivery": "settled"}, home=home)
    assert [r["agent_id"] for r in fleet.read_rows(home.fleet_path, cached=True)] == ["a1"]
    assert [r["agent_id"] for r in fleet.read_rows(home.fleet_path, cached=True)] == ["a1"]
    assert len(parses) == 1  # unchanged: not parsed again
    fleet.put_row({"agent_id": "a2", "status": "done", "delivery": "settled"}, home=home)
    assert [r["agent_id"] for r in fleet.read_rows(home.fleet_path, cached=True)] == ["a1", "a2"]
    # Rewritten in place with the same size in the same instant: the bytes are compared
    before = home.fleet_path.stat()
    home.fleet_path.write_bytes(home.fleet_path.read_bytes().replace(b'"a2"', b'"a3"'))
    os.utime(home.fleet_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert [r["agent_id"] for r in fleet.read_rows(home.fleet_path, cached=True)] == ["a1", "a3"]


def test_it_does_not_read_a_settled_unchanged_fleet_again(parses, monkeypatch):
    home = EngineHome()
    fleet.put_row({"agent_id": "a1", "status": "done", "delivery": "settled"}, home=home)
    monkeypatch.setattr(enginefs, "SETTLED_NS", -1)  # as if the file were written long ago
    reads: list[str] = []
    read = enginefs._read_fleet_file
    monkeypatch.setattr(enginefs, "_read_fleet_file", lambda path: reads.append(str(path)) or read(path))
    for _ in range(3):
        assert home.try_read_fleet().rows == [{"agent_id": "a1", "status": "done", "delivery": "settled"}]
    assert (len(reads), len(parses)) == (1, 1)
    fleet.put_row({"agent_id": "a2", "status": "done", "delivery": "settled"}, home=home)  # a new file
    assert [r["agent_id"] for r in home.try_read_fleet().rows] == ["a1", "a2"]
    assert len(parses) == 3  # the write's own read, then the page's


@pytest.mark.parametrize("page", ["/conversations/{id}/", "/conversations/{id}/delete/",
                                  "/settings/system/data-storage/"])
def test_a_page_parses_each_fleet_file_once_and_an_unchanged_one_not_again(admin_client, parses, page):
    home = EngineHome()
    conversation = factories.make_conversation()
    fleet.put_row({"agent_id": "a1", "status": "done", "delivery": "settled",
                   "origin": {"conversation": conversation.public_id}}, home=home)
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [{"agent_id": "old", "status": "done"}])
    parses.clear()
    url = page.format(id=conversation.public_id)
    assert admin_client.get(url, HTTP_HOST="127.0.0.1").status_code == 200
    assert len(parses) == len(set(parses)) <= 2  # each file at most once in the request
    parses.clear()
    assert admin_client.get(url, HTTP_HOST="127.0.0.1").status_code == 200
    assert parses == []  # unchanged since: not parsed again
