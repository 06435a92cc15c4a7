"""Pages that show a delete (or a cleanup operation) in progress poll it, only while it is in
progress: the conversation page, the conversation list and the Operations list. A poll that
finds nothing changed is a 204; one that does answers the changed parts out of band and stops
polling once nothing is in progress."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor
from retention.models import ToolPayloadOperation
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def get(client, url, **extra):
    return client.get(url, **HOST, **extra)


def poller(content: str) -> str:
    """The page's poller element (there is one on each of these pages)."""
    found = re.findall(r'<div id="live-poll"[^>]*>', content)
    assert len(found) == 1, found
    return found[0]


def poll_url(content: str) -> str:
    return re.search(r'hx-get="([^"]+)"', poller(content)).group(1).replace("&amp;", "&")


@pytest.fixture
def pending(admin_user):
    conversation = factories.make_conversation(title="Being erased")
    factories.add_message(conversation, content="a secret line")
    op = request_deletion(conversation, key="live-pages", acting_user=admin_user)
    conversation.refresh_from_db()
    assert conversation.state == "pending_delete" and op.state == "pending"
    return conversation, op


def test_the_conversation_page_polls_its_pending_delete_and_shows_the_tombstone_once_done(admin_client, pending):
    conversation, op = pending
    page = get(admin_client, f"/conversations/{conversation.public_id}/").content.decode()
    assert 'hx-trigger="every 3s"' in poller(page) and "its content is being erased" in page
    url = poll_url(page)
    assert url == f"/conversations/{conversation.public_id}/?live=1&v=pending_delete"
    assert get(admin_client, url, HTTP_HX_REQUEST="true").status_code == 204  # nothing changed: one small read

    assert executor.run_erasure(op.pk) == "completed"
    answer = get(admin_client, url, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    fragment = answer.content.decode()
    assert '<h1 id="conversation-h" hx-swap-oob="true">Deleted conversation</h1>' in fragment
    assert re.search(r'<div id="conversation-state" data-live-row hx-swap-oob="true">\s*<p class="alert" role="status" '
                     r'data-testid="tombstone">Deleted on ', fragment)
    assert f'href="/conversations/{conversation.public_id}/">Reload the page</a>' in fragment
    # the State fact too (r18: it kept saying Pending delete under "Deleted conversation")
    assert ('<span class="badge badge-deleted" id="runtime-state" data-testid="runtime-state" '
            'hx-swap-oob="true">Deleted</span>') in fragment
    assert re.search(rf'id="conversation-op" href="/operations/{op.public_id}/">Erasure receipt</a>', fragment)
    said = poller(fragment)
    assert "hx-trigger" not in said and 'hx-swap-oob="true"' in said  # polling stops
    assert 'data-said="The delete is complete: this conversation&#x27;s content is erased."' in said
    assert "Being erased" not in fragment and "a secret line" not in fragment
    # A page opened now has nothing to poll; a live page never polled.
    assert "hx-trigger" not in poller(get(admin_client, f"/conversations/{conversation.public_id}/").content.decode())
    other = factories.make_conversation(title="Still here")
    assert "hx-trigger" not in poller(get(admin_client, f"/conversations/{other.public_id}/").content.decode())


def test_the_pending_tab_polls_its_rows_and_marks_a_finished_one_deleted_in_place(admin_client, pending):
    conversation, op = pending
    factories.make_conversation(title="Live one")
    page = get(admin_client, "/conversations/?view=pending_delete").content.decode()
    assert "See progress" in page and 'hx-trigger="every 3s"' in poller(page)
    url = poll_url(page)
    assert url == f"/conversations/?live=1&view=pending_delete&n=1&t=1&c={conversation.public_id}"
    # The list's own htmx read (a search, a tab) brings the poller with the rows.
    assert "hx-trigger" in poller(get(admin_client, "/conversations/?view=pending_delete", HTTP_HX_REQUEST="true").content.decode())
    assert get(admin_client, url, HTTP_HX_REQUEST="true").status_code == 204
    # A tab with no pending delete has nothing to poll.
    assert "hx-trigger" not in poller(get(admin_client, "/conversations/").content.decode())

    executor.run_erasure(op.pk)
    fragment = get(admin_client, url, HTTP_HX_REQUEST="true").content.decode()
    row = re.search(rf'<li class="conv" id="conv-row-{conversation.public_id}" data-live-row data-state="deleted" '
                    r'hx-swap-oob="true">.*?</li>', fragment, re.S).group(0)
    assert "Erasure receipt" in row and "See progress" not in row and "Being erased" not in row
    # "now", or some seconds ago on a slow machine
    assert 'data-testid="deleted-at"' in row and re.search(r"Deleted (now|a second ago|\d+ seconds ago)<", row) and "Active" not in row
    assert "hx-trigger" not in poller(fragment)
    assert f'data-said="Deleted: {conversation.thread_id}."' in poller(fragment)
    assert 'id="live-unavailable"' in fragment  # a good read clears a failed one's note
    assert "hx-trigger" not in poller(get(admin_client, "/conversations/?view=pending_delete").content.decode())


def test_the_pending_tab_keeps_counting_while_deletes_beyond_its_rows_are_erased(admin_client, admin_user):
    """r124: the tab lists the newest activity first and the erasures go in the order asked, so
    every row shown could be done while deletes further down were still erased: the poll
    stopped with the rows, and the count stayed at a figure no longer true. It goes on while the
    tab counts any, says its count is current and the list is as it was, and stops at 0."""
    ops = []
    for n in range(27):
        conversation = factories.make_conversation(title=f"Bulk {n}")
        ops.append(request_deletion(conversation, key=f"bulk-{n:02d}", acting_user=admin_user))
    page = get(admin_client, "/conversations/?view=pending_delete").content.decode()
    assert re.search(r'id="results-count" tabindex="-1" data-live-row>27 conversations</p>', page)
    assert 'data-testid="list-moved"' not in page and "Page 1 of 2" in page
    url = poll_url(page)
    shown = re.findall(r"&c=(c_[0-9a-f]+)", url)
    assert len(shown) == 25
    for op in ops:
        if op.conversation.public_id in shown:
            executor.run_erasure(op.pk)
    fragment = get(admin_client, url, HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'id="results-count" tabindex="-1" data-live-row hx-swap-oob="true">2 conversations</p>', fragment)
    moved = re.search(r'<div id="list-moved" data-live-row hx-swap-oob="true"><p class="alert changed-note" '
                      r'data-testid="list-moved">'
                      r"The count above is current; the list below is as it was when you opened it\. "
                      r'<a class="btn btn-small" id="list-moved-refresh" href="\?view=pending_delete&amp;owner=&amp;q="',
                      fragment)
    assert moved
    url = poll_url(fragment)  # polling goes on, for the count alone
    assert "&c=" not in url and "n=2" in url and "t=27" in url
    assert get(admin_client, url, HTTP_HX_REQUEST="true").status_code == 204  # nothing changed since
    # Figures that are not the page's (not digits, too long): the count is sent again, nothing fails.
    for odd in ("n=x&t=27", "n=99999999999999999999&t=27", "n=-1&t=27", "n=%EF%BC%92&t=27", "t=27"):
        answer = get(admin_client, f"/conversations/?live=1&view=pending_delete&{odd}", HTTP_HX_REQUEST="true")
        assert answer.status_code == 200 and "2 conversations" in answer.content.decode(), odd
    rest = [op for op in ops if op.conversation.public_id not in shown]
    executor.run_erasure(rest[0].pk)
    fragment = get(admin_client, url, HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'data-live-row hx-swap-oob="true">1 conversation</p>', fragment)
    executor.run_erasure(rest[1].pk)
    fragment = get(admin_client, poll_url(fragment), HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'data-live-row hx-swap-oob="true">0 conversations</p>', fragment)
    assert "hx-trigger" not in poller(fragment)  # nothing left to count
    assert m.Conversation.objects.filter(state="pending_delete").count() == 0
    spanish = get(admin_client, url, HTTP_HX_REQUEST="true", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "El recuento de arriba está al día" in spanish


def test_the_list_poll_counts_the_list_anew_with_its_owner_and_search(admin_client, admin_user):
    """A row that turns Deleted leaves the Pending delete tab: the "N conversations" line says
    so at once, counted with the list's own owner and search, not the count of the first read."""
    owner = factories.make_account("Poll owner")
    ops = {}
    # Each pending: the search then matches thread ids only (titles are content being erased).
    for thread_id, who in (("th-1", owner), ("th-2", owner), ("th-3", owner), ("zz-4", owner),
                           ("th-5", factories.make_account("Someone else"))):
        conversation = factories.make_conversation(who, thread_id=thread_id, title=f"Plan {thread_id}")
        ops[thread_id] = request_deletion(conversation, key=f"count-{thread_id}", acting_user=admin_user)
    page = get(admin_client, f"/conversations/?view=pending_delete&owner={owner.owner_key}&q=th-").content.decode()
    assert re.search(r'id="results-count" tabindex="-1" data-live-row>3 conversations</p>', page)
    url = poll_url(page)
    assert f"owner={owner.owner_key.replace(':', '%3A')}" in url and "q=th-" in url
    assert get(admin_client, url, HTTP_HX_REQUEST="true").status_code == 204  # nothing changed yet
    executor.run_erasure(ops["th-1"].pk)
    fragment = get(admin_client, url, HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'<p class="muted count" id="results-count" tabindex="-1" data-live-row hx-swap-oob="true">2 conversations</p>',
                     fragment)
    executor.run_erasure(ops["th-5"].pk)  # another owner's: not this list's
    executor.run_erasure(ops["th-2"].pk)
    fragment = get(admin_client, poll_url(fragment), HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'id="results-count" tabindex="-1" data-live-row hx-swap-oob="true">1 conversation</p>', fragment)


def test_the_operations_list_polls_pending_deletes_and_open_cleanup_operations(admin_client, pending, admin_user):
    conversation, op = pending
    run = ToolPayloadOperation.objects.create(kind="cleanup", state="running", started_by=admin_user)
    page = get(admin_client, "/operations/").content.decode()
    assert "0 of" in page and 'hx-trigger="every 3s"' in poller(page)
    url = poll_url(page)
    assert f"op={op.public_id}" in url and f"run={run.pk}" in url
    assert get(admin_client, url, HTTP_HX_REQUEST="true").status_code == 204

    executor.run_erasure(op.pk)
    fragment = get(admin_client, url, HTTP_HX_REQUEST="true").content.decode()
    row = re.search(rf'<li class="op-row" id="op-row-{op.public_id}" data-live-row data-state="completed" '
                    r'hx-swap-oob="true">.*?</li>', fragment, re.S).group(0)
    assert "Completed" in row and "steps done" not in row
    # The cleanup run still runs: the list keeps polling it, and only it.
    assert 'id="cleanup-history"' in fragment
    again = poll_url(fragment)
    assert f"run={run.pk}" in again and "op=" not in again
    assert f'data-said="{conversation.thread_id}: Completed."' in poller(fragment)
    assert get(admin_client, again, HTTP_HX_REQUEST="true").status_code == 204

    ToolPayloadOperation.objects.filter(pk=run.pk).update(state="succeeded", slot=None)
    done = get(admin_client, again, HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'<section aria-labelledby="cleanup-h" id="cleanup-history" data-live-row hx-swap-oob="true">',
                     done)
    assert "hx-trigger" not in poller(done) and 'data-said="Cleanup: Completed."' in poller(done)
    assert "hx-trigger" not in poller(get(admin_client, "/operations/").content.decode())


def test_the_deleted_tab_says_when_each_conversation_was_deleted(admin_client, pending):
    conversation, op = pending
    executor.run_erasure(op.pk)
    # three hours back, so the words do not depend on how fast this machine reads the pages
    # (a CI run on a slow machine read them more than a second apart: "now" became "1 second ago")
    completed = m.DeleteOperation.objects.get(pk=op.pk).completed_at - timedelta(hours=3)
    m.DeleteOperation.objects.filter(pk=op.pk).update(completed_at=completed)
    page = get(admin_client, "/conversations/?view=deleted").content.decode()
    row = re.search(rf'<li class="conv"(?:(?!</li>).)*?{conversation.thread_id}.*?</li>', page, re.S).group(0)
    # to the second: HTML takes at most three digits of a second (r119: Django's "c" wrote six)
    assert f'<time datetime="{completed.isoformat(timespec="seconds")}"' in row and "Deleted 3\xa0hours ago" in row
    for page_path in ("/conversations/?view=deleted", "/operations/", f"/operations/{op.public_id}/",
                      f"/conversations/{conversation.public_id}/"):
        stamps = re.findall(r'<time datetime="([^"]*)"', get(admin_client, page_path).content.decode())
        assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", s) for s in stamps), stamps
    # and its last activity (from before the delete)
    assert "Active" not in row and "Last active" in row
    spanish = get(admin_client, "/conversations/?view=deleted", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    row = re.search(rf'<li class="conv"(?:(?!</li>).)*?{conversation.thread_id}.*?</li>', spanish, re.S).group(0)
    assert "Eliminada hace 3 horas" in row and "Activa" not in row and "Última actividad" in row


def pending_bound_delete(title: str = "Remote plan"):
    """(binding, another binding, its pending bound delete) on Engine conversations' first owner."""
    from remote.models import BoundDelete, EngineBinding

    binding = EngineBinding.objects.create(engine_id="c_" + "a" * 20, owner_kind="account", owner_id=1, scope="bound",
                                           thread_id="t-remote", title=title, engine_state="live")
    other = EngineBinding.objects.create(engine_id="c_" + "b" * 20, owner_kind="account", owner_id=1, scope="bound",
                                         thread_id="t-stays", title="Stays", engine_state="live")
    delete = BoundDelete.objects.create(key="k-remote", binding=binding, binding_ref=binding.public_id,
                                        engine_id=binding.engine_id, owner_kind="account", owner_id=1, scope="bound",
                                        thread_id="t-remote", state="pending", waiting_on="engine")
    return binding, other, delete


def acknowledged(delete, binding) -> None:
    """The engine's receipt acknowledged: the delete completed and the binding went (as delivery does)."""
    from remote.models import BoundDelete

    now = timezone.now()
    BoundDelete.objects.filter(pk=delete.pk).update(state="completed", binding=None, receipt={"stores": []},
                                                    receipt_at=now, acknowledged_at=now, completed_at=now, waiting_on="")
    binding.delete()


def test_engine_conversations_poll_their_pending_deletes_and_drop_a_finished_binding(admin_client):
    binding, other, delete = pending_bound_delete()
    page = get(admin_client, "/engine/conversations/").content.decode()
    assert "See the delete's progress" in page and 'hx-trigger="every 3s"' in poller(page)
    assert re.search(r'<p class="muted count" id="bindings-count" data-testid="bindings-count">2 conversations</p>',
                     page)
    url = poll_url(page)
    assert url == f"/engine/conversations/?live=1&d={delete.public_id}"
    assert get(admin_client, url, HTTP_HX_REQUEST="true").status_code == 204

    acknowledged(delete, binding)
    fragment = get(admin_client, url, HTTP_HX_REQUEST="true").content.decode()
    assert f'<li id="binding-row-{binding.public_id}" hx-swap-oob="delete"></li>' in fragment
    row = re.search(rf'<li id="bound-delete-row-{delete.public_id}" data-live-row data-state="completed" '
                    r'hx-swap-oob="true">.*?</li>', fragment, re.S).group(0)
    assert "Completed" in row
    assert f"binding-row-{other.public_id}" not in fragment  # only what changed
    # and the count with it (r119: "2 conversations" stayed above the one row left)
    assert re.search(r'<p class="muted count" id="bindings-count" data-testid="bindings-count" '
                     r'hx-swap-oob="true">1 conversation</p>', fragment)
    assert "hx-trigger" not in poller(fragment) and 'data-said="t-remote: Completed."' in poller(fragment)
    assert "hx-trigger" not in poller(get(admin_client, "/engine/conversations/").content.decode())


@pytest.mark.parametrize("query", [
    "run=%C2%B2",  # "²" passes str.isdigit() but not int(): a 500
    "run=99999999999999999999999",  # past a bigint: a 500 (OverflowError)
    "op=x",  # no such operation: it answered 503, "status unavailable", and logged an error
    "op=op_%ED%A0%80",  # bytes that are not UTF-8 (read as U+FFFD): no such operation either
])
def test_the_operations_poll_takes_odd_ids_as_naming_nothing(member_client, pending, query):
    """A poll's ids are the client's: one that names nothing is left out, never a 500 or a 503
    (which says the status cannot be read); the pending delete it also names is still polled."""
    _conversation, op = pending
    answer = get(member_client, f"/operations/?live=1&op={op.public_id}&{query}", HTTP_HX_REQUEST="true")
    assert answer.status_code == 200 and op.public_id in answer.content.decode()


def test_the_list_poll_takes_an_id_that_names_nothing_as_naming_nothing(member_client, pending):
    """An asked id that names nothing (bytes that are not UTF-8, read as U+FFFD) is left out;
    the poll answers for the rest. A NUL in a query is refused before any view: 400."""
    conversation, _op = pending
    answer = get(member_client, f"/conversations/?live=1&view=pending_delete&n=1&t=1&c={conversation.public_id}&c=%ED%A0%80",
                 HTTP_HX_REQUEST="true")
    assert answer.status_code == 204
    assert get(member_client, "/conversations/?live=1&view=pending_delete&c=c_%00x",
               HTTP_HX_REQUEST="true").status_code == 400
