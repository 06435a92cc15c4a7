"""Lifecycle screens as plain form posts: row actions, the delete preview, operations."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from django.utils import timezone

from lifecycle import fleet
from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}


def page(client, url, **extra) -> str:
    response = client.get(url, **HOST, **extra)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def test_list_rows_offer_archive_close_and_delete_to_admins(admin_client):
    conversation = factories.make_conversation(title="Row actions")
    content = page(admin_client, "/conversations/")
    assert f'action="/conversations/{conversation.public_id}/archive/"' in content
    assert f'action="/conversations/{conversation.public_id}/close/"' in content
    assert f'href="/conversations/{conversation.public_id}/delete/"' in content
    response = admin_client.post(f"/conversations/{conversation.public_id}/archive/",
                                 {"archived": "1", "next": "/conversations/"}, **HOST)
    assert (response.status_code, response["Location"]) == (302, "/conversations/")
    conversation.refresh_from_db()
    assert conversation.archived_at is not None
    after = page(admin_client, "/conversations/")
    assert "Archived: hidden from Recent." in after and "Row actions" not in after
    assert "Row actions" in page(admin_client, "/conversations/?view=archived")
    admin_client.post(f"/conversations/{conversation.public_id}/close/", {"closed": "1"}, **HOST)
    conversation.refresh_from_db()
    assert conversation.closed_at is not None
    assert m.AuditFact.objects.filter(action__in=["conversation.archived", "conversation.closed"]).count() == 2


def test_archive_and_close_messages_say_where_the_conversation_is_listed_now(admin_client):
    """Each message is true of the tab the conversation is on after the action: a closed one
    unarchived goes back under Closed (Recent leaves closed conversations out), and Close
    claims no stopped turn or released lease it did not find."""
    conversation = factories.make_conversation(title="Moves between tabs")
    url = f"/conversations/{conversation.public_id}"

    def act(action: str, value: str) -> str:
        field = "archived" if action == "archive" else "closed"
        answer = admin_client.post(f"{url}/{action}/", {field: value, "next": "/conversations/?view=all"}, **HOST)
        assert answer.status_code == 302
        return page(admin_client, "/conversations/?view=all")

    def listed(view: str) -> bool:
        return "Moves between tabs" in page(admin_client, f"/conversations/?view={view}")

    assert "Closed: no turn runs in it and no process holds it until it is resumed." in act("close", "1")
    assert listed("closed") and not listed("recent")
    assert "Archived: listed under Archived instead of Closed." in act("archive", "1")
    assert listed("archived") and not listed("closed")
    assert "Unarchived: back under Closed." in act("archive", "0")
    assert listed("closed") and not listed("recent")
    assert "Resumed." in act("close", "0")
    assert "Archived: hidden from Recent." in act("archive", "1")
    assert listed("archived") and not listed("recent")
    assert "Back in Recent." in act("archive", "0")
    assert listed("recent")
    # nothing was running: Close found no turn to stop and no lease to release, and said none
    closed = m.AuditFact.objects.get(action="conversation.closed")
    assert closed.new_value == {"closed": True, "interrupted_turns": 0, "resolved_claims": 0, "released_lease": 0}


@pytest.mark.parametrize(("action", "value", "said"), [
    ("archive", "1", "It was already archived: nothing changed."),
    ("archive", "0", "It was already not archived: nothing changed."),
    ("close", "1", "It was already closed: nothing changed."),
    ("close", "0", "It was already open (not closed): nothing changed."),
])
def test_an_action_from_a_page_left_open_that_someone_already_took_says_nothing_changed(admin_client, action, value,
                                                                                        said):
    """Another admin (or a script) made the change first; the stale button is a no-op and says
    so, in place of the message of a change it did not make (r100: "Archived: hidden from
    Recent." and no audit fact of it)."""
    conversation = factories.make_conversation(title="Two admins")
    field = "archived" if action == "archive" else "closed"
    if value == "1":
        m.Conversation.objects.filter(pk=conversation.pk).update(**{f"{field}_at": timezone.now()})
    facts = m.AuditFact.objects.count()
    answer = admin_client.post(f"/conversations/{conversation.public_id}/{action}/",
                               {field: value, "next": "/conversations/?view=all"}, **HOST)
    assert answer.status_code == 302
    shown = page(admin_client, "/conversations/?view=all")
    assert said in shown and "Archived:" not in shown and "Closed: no turn" not in shown and "Resumed." not in shown
    assert m.AuditFact.objects.count() == facts
    spanish = admin_client.post(f"/conversations/{conversation.public_id}/{action}/", {field: value}, **HOST,
                                HTTP_ACCEPT_LANGUAGE="es", follow=True)
    assert "no cambió nada" in spanish.content.decode()


@pytest.mark.parametrize("action", ["archive", "close"])
@pytest.mark.parametrize("sent", [{}, {"v": "true"}, {"v": "1\x00"}, {"v": ["0", "1"]}, {"v": ""}])
def test_a_switch_sent_without_its_value_changes_nothing(admin_client, action, sent):
    """r23: any value but "1" meant the reverse action: an archived conversation posted to with
    no value, "true" or "1\x00" was unarchived and told "Back in Recent"."""
    conversation = factories.make_conversation(title="Stays put")
    field = "archived" if action == "archive" else "closed"
    admin_client.post(f"/conversations/{conversation.public_id}/{action}/", {field: "1"}, **HOST)
    before = m.Conversation.objects.values("archived_at", "closed_at").get(pk=conversation.pk)
    facts = m.AuditFact.objects.count()
    body = {field: sent["v"]} if sent else {}
    answer = admin_client.post(f"/conversations/{conversation.public_id}/{action}/", {**body, "next": "/conversations/"},
                               **HOST)
    assert answer.status_code == 302
    assert "The form arrived incomplete or altered, so nothing was changed." in page(admin_client, "/conversations/")
    assert m.Conversation.objects.values("archived_at", "closed_at").get(pk=conversation.pk) == before
    assert m.AuditFact.objects.count() == facts


@pytest.mark.parametrize("target", ["conversations", "-1", "NaN", "a\x00b", "http://evil.example/", "//evil.example/",
                                    "/\\evil.example/"])
def test_a_return_address_that_is_not_a_path_here_goes_to_the_default(admin_client, target):
    """`next` is the page to go back to; anything but a path on this site (a bare word, which a
    redirect would read as a view name and fail on, another site) goes to the default page,
    and the action is done once, never a server error after it."""
    conversation = factories.make_conversation(title="Row actions")
    detail = f"/conversations/{conversation.public_id}/"
    archived = admin_client.post(f"{detail}archive/", {"archived": "1", "next": target}, **HOST)
    closed = admin_client.post(f"{detail}close/", {"closed": "1", "next": target}, **HOST)
    cleared = admin_client.post("/subagents/resolve/", {"agent_id": "sa_none", "action": "clear", "next": target}, **HOST)
    assert (archived.status_code, archived["Location"]) == (302, detail)
    assert (closed.status_code, closed["Location"]) == (302, detail)
    assert (cleared.status_code, cleared["Location"]) == (302, "/operations/")
    conversation.refresh_from_db()
    assert conversation.archived_at is not None and conversation.closed_at is not None
    assert m.AuditFact.objects.filter(action__in=["conversation.archived", "conversation.closed"]).count() == 2


def test_members_see_the_admins_only_note_and_cannot_post(member_client, admin_client):
    conversation = factories.make_conversation(title="Read only")
    content = page(member_client, "/conversations/")
    assert "Archive, Close and Delete: admins only." in content
    assert "/archive/" not in content
    for url, data in ((f"/conversations/{conversation.public_id}/archive/", {"archived": "1"}),
                      (f"/conversations/{conversation.public_id}/close/", {"closed": "1"}),
                      (f"/conversations/{conversation.public_id}/delete/", {"key": "member-key"})):
        assert member_client.post(url, data, **HOST).status_code == 403
    conversation.refresh_from_db()
    assert (conversation.archived_at, conversation.closed_at, conversation.state) == (None, None, "live")
    assert not m.DeleteOperation.objects.exists() and not m.AuditFact.objects.exists()
    preview = page(member_client, f"/conversations/{conversation.public_id}/delete/")
    assert "Erased for good" in preview and "Deleting is for admins only." in preview
    assert 'name="key"' not in preview
    # r81: nothing to confirm, so nothing tells a member to confirm
    assert "before you confirm" not in preview and "only an admin can delete." in preview
    assert "before you confirm" in page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    detail = page(member_client, f"/conversations/{conversation.public_id}/")
    assert "Lifecycle actions are for admins only." in detail


def test_the_preview_lists_every_store_from_the_registry_with_counts(admin_client):
    conversation = factories.make_conversation(title="Preview me")
    factories.fill_every_store(conversation)
    content = page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    for heading in ("Erased for good", "Compacted to a content-free record", "Kept", "Outside Lethe"):
        assert heading in content
    for label in ("Messages and tool calls", "Event log", "Settled subagent rows", "Exports you saved",
                  "Workspace files the agent wrote", "Project and learned memory", "Usage and metering",
                  "Provider-retained inputs"):
        assert label in content, label
    assert "Provider retention follows provider terms." in content
    assert "kept for 400 days after the delete" in content
    assert 'data-testid="shared-copy-remains"' in content  # one link's publisher cannot revoke
    assert re.search(r"Messages and tool calls</span> <span class=\"store-count\">2 records", content)
    assert "Delete for good" in content and "Cancel" in content
    assert not m.DeleteOperation.objects.exists()  # looking changes nothing


@pytest.mark.parametrize(("language", "shown"), [("en", "1,200 records"), ("es", "1\u00a0200 registros")])
def test_the_preview_groups_the_digits_of_its_counts_as_the_receipt_does(admin_client, language, shown):
    """r81: the preview said "200007 records" where the receipt said "200,007 records erased"."""
    conversation = factories.make_conversation(title="Many")
    m.Item.objects.bulk_create([m.Item(conversation=conversation, seq=n, role="user", content="x")
                                for n in range(1, 1201)])
    admin_client.cookies["django_language"] = language
    content = page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    assert re.search(r"<span class=\"store-count\">" + shown + r"\s*<", content), shown


def test_the_preview_says_the_delete_adds_records_of_its_own_to_what_is_kept(admin_client):
    """The Kept figures are those of now; the receipt then counts the delete's own audit records
    and fingerprints as well (r39): the preview says so, and it is so."""
    conversation = factories.make_conversation(title="Kept figures")
    factories.fill_every_store(conversation)
    m.AuditFact.objects.create(conversation=conversation, action="conversation.archived")
    preview = page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    audit = re.search(r"Audit</span> <span class=\"store-count\">(\d+) records?", preview)
    prints = re.search(r"Erasure check fingerprints</span> <span class=\"store-count\">(\d+) records?", preview)
    assert audit and prints and (int(audit.group(1)), int(prints.group(1))) == (1, 0)
    # Each says its own rule: the facts are content-free; the fingerprints are digests of content
    # samples, and the page says so (r102: it called them content-free too).
    notes = dict(re.findall(r'<span class="store-name">([^<]+)</span>.*?<p class="store-note">([^<]+)</p>',
                            preview, re.S))
    assert notes["Audit"].startswith("Content-free; kept for 365 days after the delete")
    assert notes["Erasure check fingerprints"].startswith("Keyed digests of short samples of the erased content")
    assert "Content-free" not in notes["Erasure check fingerprints"]
    assert ("The delete adds records of its own: its request and its completion to the audit facts, and "
            "fingerprints of the content for its erasure check.") in preview
    op = request_deletion(conversation, key="kept-figures", acting_user=None)
    executor.run_erasure(op.pk)
    kept = {e["store"]: e.get("records") for e in m.DeleteOperation.objects.get(pk=op.pk).receipt["kept"]}
    assert kept["lifecycle.AuditFact"] == 1 + 2 and kept["lifecycle.ErasureFingerprint"] >= 1


def test_a_confirmation_of_a_preview_that_changed_since_is_shown_again_and_not_taken(admin_client, settings, tmp_path):
    """Items appended after the page was shown (or a backup made: the preview's backups are in
    what the form was shown too): the confirmation is not taken, the page shows what the delete erases and leaves now, and its own confirmation then
    starts the delete (r100: it went ahead; only the receipt said 8 records, not the 5 shown)."""
    conversation = factories.make_conversation(title="Changed under me")
    factories.add_message(conversation)
    url = f"/conversations/{conversation.public_id}/delete/"

    def form(content: str) -> dict:
        return {name: re.search(rf'name="{name}" value="([0-9a-f]+)"', content).group(1) for name in ("key", "seen")}

    shown = form(page(admin_client, url))
    for n in range(3):
        factories.add_message(conversation, content=f"written after the preview {n}")
    refused = admin_client.post(url, shown, **HOST)
    assert refused.status_code == 409 and not m.DeleteOperation.objects.exists()
    again = refused.content.decode()
    assert "This conversation changed after the page was shown, so your confirmation was not taken" in again
    assert "4 records" in again  # the messages as they are now
    spanish = admin_client.post(url, shown, HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert spanish.status_code == 409 and "no se tuvo en cuenta" in spanish.content.decode()
    confirmed = admin_client.post(url, form(again), **HOST)
    op = m.DeleteOperation.objects.get()
    assert (confirmed.status_code, confirmed["Location"]) == (302, f"/operations/{op.public_id}/")
    assert admin_client.post(url, form(again), **HOST)["Location"] == f"/operations/{op.public_id}/"  # sent twice


def test_a_confirmation_from_a_page_shown_before_someone_else_deleted_it_says_it_did_nothing_more(admin_client):
    """Two admins on the same delete page: the second confirmation leads to the first's
    delete, and says it added nothing (r121: no word, as if this press had deleted it); the
    first one's own confirmation sent again (a double press) says nothing of the kind."""
    conversation = factories.make_conversation(title="Deleted by the other admin")
    factories.add_message(conversation)
    url = f"/conversations/{conversation.public_id}/delete/"

    def form(content: str) -> dict:
        return {name: re.search(rf'name="{name}" value="([0-9a-f]+)"', content).group(1) for name in ("key", "seen")}

    mine, theirs, later = (form(page(admin_client, url)) for _ in range(3))
    first = admin_client.post(url, theirs, **HOST)
    op = m.DeleteOperation.objects.get()
    told = "This conversation&#x27;s delete had already been requested: your confirmation did nothing more."
    assert told not in admin_client.get(first["Location"], **HOST).content.decode()
    assert told not in page(admin_client, admin_client.post(url, theirs, **HOST)["Location"])  # sent twice
    second = admin_client.post(url, mine, **HOST)
    assert (second.status_code, second["Location"]) == (302, f"/operations/{op.public_id}/")
    assert told in page(admin_client, second["Location"])
    assert m.DeleteOperation.objects.count() == 1
    spanish = admin_client.post(url, later, HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert "ya se había solicitado" in page(admin_client, spanish["Location"], HTTP_ACCEPT_LANGUAGE="es")


def _while_it_is_asked(monkeypatch, act) -> None:
    """Runs `act` once inside the delete request, after the confirmation's page is long gone and
    before the request takes its locks: what another writer does while the form is on its way."""
    from lifecycle.actions import request_deletion as module

    original, done = module.settle_resolutions, []

    def settle(home):
        if not done:
            done.append(True)
            act()
        return original(home)

    monkeypatch.setattr(module, "settle_resolutions", settle)


def _form(content: str) -> dict:
    return {name: re.search(rf'name="{name}" value="([0-9a-f]+)"', content).group(1) for name in ("key", "seen")}


def test_an_item_added_while_the_confirmation_is_on_its_way_is_not_erased_unshown(admin_client, monkeypatch):
    """r134: the page's figures were compared before the request took its locks, so an item
    appended in between was erased though the page never showed it (shown 39, erased 40). The
    comparison is made under the locks: the page is shown again with the item counted."""
    conversation = factories.make_conversation(title="Appended under me")
    factories.add_message(conversation)
    url = f"/conversations/{conversation.public_id}/delete/"
    shown = _form(page(admin_client, url))
    _while_it_is_asked(monkeypatch, lambda: factories.add_message(conversation, content="one more"))
    refused = admin_client.post(url, shown, **HOST)
    assert refused.status_code == 409 and not m.DeleteOperation.objects.exists()
    again = refused.content.decode()
    assert "This conversation changed after the page was shown, so your confirmation was not taken" in again
    assert "2 records" in again and m.Item.objects.filter(conversation=conversation).count() == 2
    conversation.refresh_from_db()
    assert conversation.state == "live"
    confirmed = admin_client.post(url, _form(again), **HOST)
    op = m.DeleteOperation.objects.get()
    assert confirmed["Location"] == f"/operations/{op.public_id}/" and op.state == "pending"
    executor.run_erasure(op.pk)
    erased = {e["store"]: e["records"] for e in m.DeleteOperation.objects.get(pk=op.pk).receipt["stores"]}
    assert erased["lifecycle.Item"] == 2  # what the second page showed


def test_a_delete_someone_requests_while_a_confirmation_is_on_its_way_is_said_to_be_theirs(admin_client, monkeypatch):
    """r134: the other admin's delete committed between this page's check and its request: the
    confirmation joined it (right) but said nothing, reading as this press's delete; and a
    confirmation read while theirs was committing was told at once "changed" and "under way"."""
    conversation = factories.make_conversation(title="Theirs by a hair")
    factories.add_message(conversation)
    url = f"/conversations/{conversation.public_id}/delete/"
    mine = _form(page(admin_client, url))
    _while_it_is_asked(monkeypatch, lambda: request_deletion(conversation, key="the-other-admins", acting_user=None))
    joined = admin_client.post(url, mine, **HOST)
    op = m.DeleteOperation.objects.get()
    assert (joined.status_code, joined["Location"]) == (302, f"/operations/{op.public_id}/")
    told = "This conversation&#x27;s delete had already been requested: your confirmation did nothing more."
    assert told in page(admin_client, joined["Location"])
    assert set(m.OperationKey.objects.filter(operation=op).values_list("key", flat=True)) == {"the-other-admins",
                                                                                               mine["key"]}
    # This form sent again (its answer lost) is still the other's delete, and says so.
    assert told in page(admin_client, admin_client.post(url, mine, **HOST)["Location"])


@pytest.mark.django_db(transaction=True)
def test_a_backup_the_page_named_while_it_was_being_made_is_not_a_change_once_published(admin_client, settings,
                                                                                       tmp_path):
    """r135: a page shown while a backup was being made named it (it will hold the content); once
    published it is dated to the microsecond by its receipt and listed in another place, and the
    confirmation was refused as "changed" though nothing a delete does had changed."""
    from retention.backups import create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    create_backup()  # one made before, so there is an order to change
    conversation = factories.make_conversation(title="Backed up meanwhile")
    factories.add_message(conversation)
    url = f"/conversations/{conversation.public_id}/delete/"
    shown = []

    def show_the_page(*_figures):
        if not shown:
            assert list(settings.LETHE_BACKUP_DIR.glob(".tmp-lethe-*"))  # being made
            shown.append(page(admin_client, url))

    made = create_backup(progress=show_the_page)
    assert shown and made.name in shown[0]  # named while being made
    confirmed = admin_client.post(url, _form(shown[0]), **HOST)
    op = m.DeleteOperation.objects.get()
    assert (confirmed.status_code, confirmed["Location"], op.state) == (302, f"/operations/{op.public_id}/", "pending")


def test_an_engine_folder_gone_at_confirmation_is_said_so_not_taken_for_a_change(admin_client, settings):
    """r135: the engine folder missing when the confirmation came: it was refused as "this
    conversation changed" (nothing recorded), and the page shown again counted its files as
    0 files. The delete is recorded Unavailable with its reason; the files are not counted."""
    conversation = factories.make_conversation(title="Folder gone")
    factories.fill_every_store(conversation)
    url = f"/conversations/{conversation.public_id}/delete/"
    shown = page(admin_client, url)
    assert re.search(r"Event log</span> <span class=\"store-count\">[1-9]\d* files?", shown)
    home = settings.ENGINE_HOME
    home.rename(home.with_name("engine-away"))
    try:
        answered = admin_client.post(url, _form(shown), **HOST)
        op = m.DeleteOperation.objects.get()
        assert (answered.status_code, answered["Location"]) == (302, f"/operations/{op.public_id}/")
        assert (op.state, op.reasons) == ("unavailable", ["engine_folder_unavailable"])
        again = page(admin_client, url)
        event_log = re.search(r"Event log</span> <span class=\"store-count\">(.*?)</div>", again, re.S)
        assert event_log and "could not be counted" in event_log.group(1)
    finally:
        home.with_name("engine-away").rename(home)
    conversation.refresh_from_db()
    assert conversation.state == "live" and m.Item.objects.filter(conversation=conversation).exists()


def test_a_confirmation_sent_again_after_its_delete_was_refused_leads_to_that_refusal(admin_client):
    """The refused delete's own record changes the preview (its operation, its audit fact): the
    same form sent again leads to the recorded refusal, not to "changed since" (r101)."""
    conversation = factories.make_conversation(title="Refused then sent again")
    factories.add_message(conversation)
    turn = factories.start_turn(conversation, state=m.TurnState.DONE)
    url = f"/conversations/{conversation.public_id}/delete/"
    content = page(admin_client, url)
    form = {name: re.search(rf'name="{name}" value="([0-9a-f]+)"', content).group(1) for name in ("key", "seen")}
    m.Turn.objects.filter(pk=turn.pk).update(state=m.TurnState.RUNNING)  # running again after the page was shown
    first = admin_client.post(url, form, **HOST)
    op = m.DeleteOperation.objects.get()
    assert (first.status_code, first["Location"], op.state) == (302, f"/operations/{op.public_id}/", "refused")
    second = admin_client.post(url, form, **HOST)
    assert (second.status_code, second["Location"]) == (302, f"/operations/{op.public_id}/")
    assert m.DeleteOperation.objects.count() == 1


def test_cancel_leaves_everything_and_confirm_starts_the_delete(admin_client):
    conversation = factories.make_conversation(title="Confirm me")
    factories.add_message(conversation)
    content = page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    cancel = re.search(r'<a class="btn" href="([^"]+)">Cancel</a>', content).group(1)
    assert cancel == f"/conversations/{conversation.public_id}/"
    assert page(admin_client, cancel)
    conversation.refresh_from_db()
    assert conversation.state == "live" and not m.DeleteOperation.objects.exists()
    key = re.search(r'name="key" value="([0-9a-f]+)"', content).group(1)
    response = admin_client.post(f"/conversations/{conversation.public_id}/delete/", {"key": key}, **HOST)
    op = m.DeleteOperation.objects.get()
    assert (response.status_code, response["Location"]) == (302, f"/operations/{op.public_id}/")
    # A double submit of the same form is the same operation.
    again = admin_client.post(f"/conversations/{conversation.public_id}/delete/", {"key": key}, **HOST)
    assert again["Location"] == f"/operations/{op.public_id}/" and m.DeleteOperation.objects.count() == 1
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "Pending" in status and 'hx-trigger="every 2s"' in status
    assert "Preparing: taking keyed fingerprints" in status
    fragment = page(admin_client, f"/operations/{op.public_id}/", HTTP_HX_REQUEST="true")
    assert fragment.lstrip().startswith('<section class="card op-status op-pending"')
    version = re.search(r"\?v=([^\"]+)\"", fragment).group(1)
    unchanged = admin_client.get(f"/operations/{op.public_id}/?v={version}", HTTP_HX_REQUEST="true", **HOST)
    assert unchanged.status_code == 204  # polled without a change: nothing swapped or re-announced
    executor.run_erasure(op.pk)
    done = page(admin_client, f"/operations/{op.public_id}/?v={version}", HTTP_HX_REQUEST="true")
    assert 'data-state="completed"' in done and "hx-trigger" not in done  # polling stops
    assert "Erasure receipt" in done and "Messages and tool calls" in done
    assert "Physical erasure" in done


@pytest.mark.parametrize("key", [None, "", "has space", "x" * 201])
def test_a_delete_form_without_its_key_says_so_in_the_forms_words_and_deletes_nothing(admin_client, key):
    """r23: a form without its hidden key said "Send an Idempotency-Key header", the API's words."""
    conversation = factories.make_conversation(days_idle=1, title="Kept")
    response = admin_client.post(f"/conversations/{conversation.public_id}/delete/",
                                 {} if key is None else {"key": key}, **HOST)
    assert response.status_code == 400
    page = response.content.decode()
    assert "The form arrived incomplete or altered, so nothing was deleted." in page and "Idempotency" not in page
    assert not m.DeleteOperation.objects.exists()
    conversation.refresh_from_db()
    assert (conversation.state, conversation.title) == ("live", "Kept")


def test_a_pending_delete_names_the_step_it_died_in_and_says_when_no_job_cluster_runs(admin_client, settings,
                                                                                        monkeypatch):
    """A worker killed inside a step leaves the operation on that step (not the one before:
    its page said "Preparing" while messages were being erased), and while no job finishes on
    any cluster (the readiness check's rule) the page says the job cluster seems stopped and
    the delete goes on once it runs; a heartbeat within the limit takes the note away."""
    from ops.models import JobStat

    conversation = factories.make_conversation(title="Died erasing messages")
    factories.fill_every_store(conversation)
    op = factories.erasure_stopped_in(conversation, "lifecycle.Item", key="died-in-items", monkeypatch=monkeypatch)
    assert (op.state, op.step) == ("pending", "lifecycle.Item")
    assert m.DeleteStep.objects.get(operation=op, key="lifecycle.Item").state == "pending"  # rolled back
    settings.READYZ_HEARTBEAT_SECONDS = 300
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "Erasing: Messages and tool calls." in status and "Preparing" not in status
    assert ("No job has finished recently: the job cluster seems to be stopped. This delete goes on where it stopped "
            "once the cluster runs again.") in status
    beat = JobStat.objects.create(func="ops.jobs.heartbeat", runs=1, last_finished_at=m.timezone.now()
                                  - m.timezone.timedelta(minutes=20))
    status = page(admin_client, f"/operations/{op.public_id}/")
    # (20 minutes ago: "1:05 p.m.", or at the hour "1 p.m.", or "noon", "midnight")
    assert re.search(r"No job has finished since [^<:]+, (?:\d+(?::\d\d)? [ap]\.m\.|noon|midnight) UTC: the job cluster "
                     r"seems to be stopped\.", status)
    JobStat.objects.filter(pk=beat.pk).update(last_finished_at=m.timezone.now())
    assert 'data-testid="cluster-stopped"' not in page(admin_client, f"/operations/{op.public_id}/")
    # A completed delete says nothing of the cluster.
    monkeypatch.undo()  # the job runs to its end now
    JobStat.objects.all().delete()
    m.DeleteOperation.objects.filter(pk=op.pk).update(lease_holder="", lease_expires_at=None)
    assert executor.run_erasure(op.pk) == "completed"
    assert 'data-testid="cluster-stopped"' not in page(admin_client, f"/operations/{op.public_id}/")


def test_a_pending_row_in_the_operations_list_counts_steps_done_and_says_its_error(admin_client):
    """The row said "step 9 of 21" for a delete on its third step with nine done, and left out
    that it was retrying after an error."""
    conversation = factories.make_conversation(title="Retrying")
    factories.fill_every_store(conversation)
    op = request_deletion(conversation, key="retrying", acting_user=None)
    m.DeleteStep.objects.filter(operation=op, position__lt=4).update(state="done")
    m.DeleteOperation.objects.filter(pk=op.pk).update(last_error="io_error")
    total = m.DeleteStep.objects.filter(operation=op).count()
    row = page(admin_client, "/operations/?state=pending")
    row = row[row.index(op.public_id):]
    row = row[:row.index("</li>")]
    words = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row))
    assert f"4 of {total} steps done" in words and "step 4 of" not in words
    assert "The engine folder could not be changed." in words


def test_a_conversation_folder_behind_a_symlink_is_reported_on_its_page_not_left_out(admin_client, settings,
                                                                                      tmp_path):
    """The page counted the engine files without the folder a symlink replaced and said nothing
    (the delete page said it could not be counted): each such folder is named, once, with the
    reason, and the figure shown is only what was counted."""
    import shutil

    conversation = factories.make_conversation(title="Linked away")
    factories.fill_every_store(conversation)
    root = settings.ENGINE_HOME
    key = conversation.storage_key
    outside = tmp_path / "outside"
    shutil.move(root / "artifacts" / key, outside)
    (root / "artifacts" / key).symlink_to(outside, target_is_directory=True)
    assert any(outside.iterdir())
    content = page(admin_client, f"/conversations/{conversation.public_id}/")
    region = content[content.index('data-testid="engine-unreadable"'):]
    region = region[:region.index("</div>")]
    assert f"<code>artifacts/{key}</code> is reached through a symbolic link, so it was not read" in region
    assert region.count("<li>") == 1
    counted = sum(1 for area in ("threads", "sessions") for p in (root / area / key).rglob("*") if p.is_file())
    assert re.search(rf'Engine files</dt><dd data-testid="engine-files">At least {counted} files?, ', content)
    # a thread folder behind a link: named once (its logs are not read either), not twice
    shutil.move(root / "threads" / key, tmp_path / "threads-outside")
    (root / "threads" / key).symlink_to(tmp_path / "threads-outside", target_is_directory=True)
    content = page(admin_client, f"/conversations/{conversation.public_id}/")
    assert content.count(f"<code>threads/{key}</code>") == 1 and content.count(f"<code>artifacts/{key}</code>") == 1


def test_the_receipt_counts_file_stores_in_files_as_the_preview_does(admin_client):
    conversation = factories.make_conversation(title="Files and rows")
    factories.fill_every_store(conversation)
    preview = page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    counted = re.search(r"Large outputs and tool artifacts</span> <span class=\"store-count\">(\d+) files?, ", preview)
    assert counted, "the preview counts the artifacts folder in files"
    op = request_deletion(conversation, key="files-and-rows", acting_user=None)
    executor.run_erasure(op.pk)
    receipt = page(admin_client, f"/operations/{op.public_id}/")
    assert re.search(r"Large outputs and tool artifacts</span>\s*<span class=\"store-count\">"
                     rf"{counted.group(1)} files? erased · ", receipt), "the same figure, in files"
    assert re.search(r"Messages and tool calls</span>\s*<span class=\"store-count\">\d+ records? erased ", receipt)
    # The conversation's own record stays as the tombstone: its title erased, not "1 record erased"
    assert re.search(r"Conversation record</span>\s*<span class=\"store-count\">title erased; the record stays "
                     r"as the tombstone · ", receipt)
    # Settled subagent rows are rows of the fleet file: records, as the preview says
    assert re.search(r"Settled subagent rows</span>\s*<span class=\"store-count\">1 record compacted", receipt)
    assert re.search(r"Settled subagent rows</span> <span class=\"store-count\">1 record\s*<", preview)
    # The total says records and files apart, from the same store lines
    totals = executor.changed_totals(op.__class__.objects.get(pk=op.pk).receipt["stores"])
    assert totals["files"] >= int(counted.group(1)) and totals["records"] > 0
    assert re.search(rf'data-testid="changed-totals">Erased or compacted: {totals["records"]} records, '
                     rf'{totals["files"]} files, ', receipt)
    # The receipt lists its stores in the preview's order (erased, then compacted), not the
    # order the erasure happened to write them in
    receipt_list = receipt[receipt.index('data-testid="receipt"'):]
    receipt_list = receipt_list[:receipt_list.index("</ul>")]
    shown = re.findall(r'<span class="store-name">([^<]+)</span>', receipt_list)
    listed = re.findall(r'<span class="store-name">([^<]+)</span>', preview)
    assert len(shown) >= 5 and shown == [label for label in listed if label in shown]


def test_a_refused_delete_says_why_in_words_and_keeps_archive_and_close(admin_client):
    conversation = factories.make_conversation(title="Busy one")
    factories.start_turn(conversation)
    content = page(admin_client, f"/conversations/{conversation.public_id}/delete/")
    assert "Delete is refused right now" in content
    assert "A turn is running or queued." in content and "Delete for good" not in content
    op = request_deletion(conversation, key="screen-refused", acting_user=None)
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "Refused" in status and "A turn is running or queued." in status
    assert 'data-code="conversation_turn_active"' in status
    assert "Ask again" in status and 'data-testid="later-delete"' not in status
    detail = page(admin_client, f"/conversations/{conversation.public_id}/")
    assert "/archive/" in detail and "/close/" in detail
    # Asked again once the turn ended: the refused request's page leads to that delete
    m.Turn.objects.filter(conversation=conversation).update(state="completed")
    later = request_deletion(conversation, key="screen-later", acting_user=None)
    assert later.state == "pending" and later.pk != op.pk
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "A later request is deleting this conversation." in status and "Ask again" not in status
    assert f'href="/operations/{later.public_id}/">See the delete\'s progress</a>' in status
    executor.run_erasure(later.pk)
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "This conversation was deleted later, by another request." in status
    assert f'href="/operations/{later.public_id}/">Erasure receipt</a>' in status
    assert "Refused" in status and "A turn is running or queued." in status  # its own answer stays


def test_an_unavailable_delete_shows_the_way_out_and_the_forms_take_it(admin_client):
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    fleet.write_snapshot([{"agent_id": "sa_a", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat(), "prompt": "legacy text"},
                          {"agent_id": "sa_b", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    op = request_deletion(conversation, key="screen-unavailable", acting_user=None)
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "Unavailable" in status and "Subagent rows of unknown origin" in status
    assert "legacy text" not in status
    assert status.count('name="agent_id" value="sa_a"') == 3  # this conversation, clear, another
    back = f"/operations/{op.public_id}/"
    admin_client.post("/subagents/resolve/", {"agent_id": "sa_a", "action": "attribute", "conversation": conversation.public_id,
                                                   "next": back}, **HOST)
    response = admin_client.post("/subagents/resolve/", {"agent_id": "sa_b", "action": "clear", "next": back}, **HOST)
    assert response["Location"] == back
    assert [fleet.origin_of(r) for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [conversation.public_id]
    assert "The subagent row was cleared." in page(admin_client, back)
    assert "Delete for good" in page(admin_client, f"/conversations/{conversation.public_id}/delete/")



def test_rows_whose_ids_hold_any_text_are_shown_and_resolved(admin_client):
    """A runtime writes the ids: a slash, a dot, characters an address would escape, a
    right-to-left override. The delete page shows every row (it failed with a 500 on a slash),
    and each row's forms resolve it."""
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    ids = ["sa/x", ".", "sa x?#%&=", "sa\u202egnp.exe"]
    fleet.write_snapshot([{"agent_id": agent_id, "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()} for agent_id in ids])
    op = request_deletion(conversation, key="screen-any-ids", acting_user=None)
    assert op.state == "unavailable"
    preview = admin_client.get(f"/conversations/{conversation.public_id}/delete/", **HOST)
    assert preview.status_code == 200
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "<code><bdi>sa[U+202E]gnp.exe</bdi></code>" in status  # shown written out (the form keeps the id)
    back = f"/operations/{op.public_id}/"
    for agent_id in ids[:3]:
        response = admin_client.post("/subagents/resolve/", {"agent_id": agent_id, "action": "clear", "next": back},
                                     **HOST)
        assert response["Location"] == back
    admin_client.post("/subagents/resolve/", {"agent_id": ids[3], "action": "attribute", "next": back,
                                              "conversation": conversation.public_id}, **HOST)
    assert [(r["agent_id"], fleet.origin_of(r)) for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [
        (ids[3], conversation.public_id)]
    assert request_deletion(conversation, key="screen-any-ids-2", acting_user=None).state == "pending"


@pytest.mark.parametrize("agent_id", [None, 123, "", "sa\ud800x", "sa\x00x", "sa_" + "\u00e9" * 254])
def test_a_row_whose_id_cannot_be_named_makes_the_state_file_need_repair(admin_client, agent_id):
    """No form or address can name such a row, so no way out on the page would work: the delete
    says the subagent state file needs repair (naming it) instead of offering one."""
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    row = {"origin": None, "status": "completed", "delivery": "settled",
           "started_at": conversation.created_at.isoformat()}
    fleet.write_snapshot([row if agent_id is None else {**row, "agent_id": agent_id}])
    op = request_deletion(conversation, key="screen-unnamed", acting_user=None)
    assert (op.state, op.reason) == ("unavailable", "conversation_child_state_unreadable")
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "Repair or restore the file" in status and 'name="agent_id"' not in status
    assert "state/subagents.v1.json in the engine folder" in status


def browser_posts(html: str) -> list[dict[str, str]]:
    """The fields each resolve form of a page sends, as a browser sends them: the attribute's text
    read by an HTML parser (a CR becomes a line feed, a NUL U+FFFD), then every line break sent
    as CR LF (the form's encoding)."""
    posts = []
    for form in re.findall(r'<form[^>]*action="/subagents/resolve/"[^>]*>(.*?)</form>', html, re.S):
        fields = {}
        for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
            value = html_lib.unescape(value.replace("\r\n", "\n").replace("\r", "\n")).replace("\x00", "\ufffd")
            fields[name] = re.sub(r"\r\n|\r|\n", "\r\n", value)
        posts.append(fields)
    return posts


@pytest.mark.parametrize("bad", ["sa_sur\ud800x", "sa\x00x"], ids=["lone-surrogate", "nul"])
def test_a_row_no_form_can_name_is_left_out_of_the_way_out_and_the_pages_answer(admin_client, bad):
    """r123: the operation's way out (read again from the state file on every read) listed every
    row of unknown origin: an id with a lone surrogate made the operation's page a 500 (every
    Unavailable operation's, older ones too), and one with a NUL got a "Clear this row" that always
    answered that no row had that id (the browser sends the NUL back as U+FFFD). Such a row is
    listed nowhere, the delete says the file needs repair, and the other rows keep their way out."""
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    row = {"origin": None, "status": "completed", "delivery": "settled",
           "started_at": conversation.created_at.isoformat()}
    fleet.write_snapshot([{**row, "agent_id": "sa_ok"}, {**row, "agent_id": bad}])
    op = request_deletion(conversation, key="screen-bad-id", acting_user=None)
    assert op.reasons == ["conversation_child_ownership_ambiguous", "conversation_child_state_unreadable"]
    for url in (f"/operations/{op.public_id}/", "/operations/", f"/conversations/{conversation.public_id}/delete/"):
        shown = page(admin_client, url)
        assert "sa_sur" not in shown and not re.search("sa(\x00|\ufffd|\\[U\\+0000\\])x", shown), url
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert [post["agent_id"] for post in browser_posts(status)] == ["sa_ok"] * 3
    back = f"/operations/{op.public_id}/"
    for post in browser_posts(status)[1:2]:  # Clear this row
        admin_client.post("/subagents/resolve/", {**post, "next": back}, **HOST)
    assert [r["agent_id"] for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [bad]
    assert "The subagent row was cleared." in page(admin_client, back)


@pytest.mark.parametrize("agent_id", ["sa_\u202eevil2", "sa_\tevil", "sa\nx", "sa\r\nx", "sa\rx", "sa%0Ax"])
def test_a_legacy_row_whose_id_holds_a_control_or_format_character_is_listed_and_cleared(admin_client, agent_id):
    """r123: a legacy row with no origin whose id held a direction override or a tab made the
    preview list no row and say the state file could not be read (Data & storage said it read
    correctly, and the command cleared the row): one rule names rows now, and the preview lists
    it (written out), its forms send it back as the file holds it (a line break too), and its
    Clear removes it."""
    from console.shown import written_out

    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    home = fleet.EngineHome()
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [*rows, {
        "agent_id": agent_id, "status": "completed", "delivery": "settled",
        "started_at": conversation.created_at.isoformat()}])
    preview_url = f"/conversations/{conversation.public_id}/delete/"
    preview = page(admin_client, preview_url)
    assert "cannot be read" not in preview and "Subagent rows of unknown origin" in preview
    assert f"<code><bdi>{written_out(agent_id)}</bdi></code>" in preview
    posts = browser_posts(preview)
    assert len(posts) == 3
    response = admin_client.post("/subagents/resolve/", {**posts[1], "next": preview_url}, **HOST)
    assert response["Location"] == preview_url
    assert fleet.read_rows(home.legacy_fleet_path) == []
    assert m.AuditFact.objects.get(action="subagent.cleared").new_value["agent_id"] == agent_id
    assert "Delete for good" in page(admin_client, preview_url)

@pytest.mark.parametrize("remote", [False, True], ids=["built-in", "remote"])
@pytest.mark.parametrize("agent_id", ["sa\x00x", "", "sa_" + "x" * 5000, "sa_" + "\u00e9" * 254])
@pytest.mark.parametrize("action", ["clear", "attribute"])
def test_an_agent_id_no_row_can_have_is_refused_as_unknown_and_changes_nothing(admin_client, settings, agent_id,
                                                                                action, remote):
    """r23: a NUL answered 500 on PostgreSQL (the cleared-before lookup in jsonb), and a console of
    a remote engine passed on the engine's words about the address ("The address has a NUL
    character", "The request line ... is longer") where the built-in engine says the row is
    unknown. Refused before any lookup, the engine not called (here unreachable)."""
    if remote:
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = "http://127.0.0.1:9/", "t" * 40, 0
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    fleet.write_snapshot([{"agent_id": "sa_a", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    before = fleet.EngineHome().fleet_path.read_bytes()
    back = "/settings/api-tokens/"  # (a page of the console's own, served without the engine)
    response = admin_client.post("/subagents/resolve/", {"agent_id": agent_id, "action": action, "next": back,
                                                          "conversation": conversation.public_id}, **HOST)
    assert (response.status_code, response["Location"]) == (302, back)
    assert "No subagent row can be named by that id: an id has 1 to 256 characters and no NUL." in page(
        admin_client, back)
    assert fleet.EngineHome().fleet_path.read_bytes() == before
    assert not m.AuditFact.objects.filter(action__startswith="subagent.").exists()


def test_a_refused_attribution_to_another_conversation_keeps_what_was_typed(admin_client):
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    fleet.write_snapshot([{"agent_id": "sa_a", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    op = request_deletion(conversation, key="screen-typed", acting_user=None)
    back = f"/operations/{op.public_id}/"
    response = admin_client.post("/subagents/resolve/", {"agent_id": "sa_a", "action": "attribute", "conversation": "c_nosuchthing",
                                                              "typed": "1", "next": back}, **HOST)
    assert response["Location"] == back
    assert [fleet.origin_of(r) for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [None]  # nothing changed
    status = page(admin_client, back)
    field = re.search(r'<input id="other-1"[^>]*>', status).group(0)
    assert 'value="c_nosuchthing"' in field and 'aria-invalid="true"' in field and "autofocus" in field
    error = re.search(r'<p class="field-error" id="other-1-error" role="alert">([^<]+)</p>', status)
    assert error and error.group(1).strip()
    # shown once: a reload has an empty field again
    again = page(admin_client, back)
    assert 'value="c_nosuchthing"' not in again and "other-1-error" not in again


@pytest.mark.parametrize("typed", ["c_\x00x", "c_" + "x" * 5000])  # a form cannot carry a lone surrogate
def test_a_hostile_id_typed_for_another_conversation_is_refused_as_unknown(admin_client, typed):
    """A NUL (which PostgreSQL cannot compare) and an oversized id: the
    same refusal as any unknown id, under the field, and the row is left as it was."""
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    fleet.write_snapshot([{"agent_id": "sa_a", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    op = request_deletion(conversation, key="screen-typed-hostile", acting_user=None)
    back = f"/operations/{op.public_id}/"
    response = admin_client.post("/subagents/resolve/", {"agent_id": "sa_a", "action": "attribute", "conversation": typed,
                                                              "typed": "1", "next": back}, **HOST)
    assert (response.status_code, response["Location"]) == (302, back)
    assert [fleet.origin_of(r) for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [None]
    assert "Nothing with that id exists here." in page(admin_client, back)


@pytest.mark.parametrize("agent_id", ["sa_b", "sa_" + "long" * 25])
def test_a_refusal_about_the_row_itself_is_said_on_the_page_it_came_from(admin_client, agent_id):
    """The row was attributed by someone else meanwhile: the reason is not about what was typed,
    and that row no longer waits on the page; the reason is a page message, said once."""
    conversation = factories.make_conversation(days_idle=1, title="Ambiguous")
    row = {"agent_id": agent_id, "origin": None, "status": "completed", "delivery": "settled",
           "started_at": conversation.created_at.isoformat()}
    fleet.write_snapshot([row])
    op = request_deletion(conversation, key="screen-typed-row", acting_user=None)
    back = f"/operations/{op.public_id}/"
    elsewhere = factories.make_conversation(title="Elsewhere")
    fleet.write_snapshot([{**row, "origin": {"conversation": elsewhere.public_id}}])  # attributed meanwhile
    admin_client.post("/subagents/resolve/", {"agent_id": agent_id, "action": "attribute", "typed": "1", "next": back,
                                                          "conversation": conversation.public_id}, **HOST)
    status = page(admin_client, back)
    assert "This subagent row already names its conversation" in status
    assert [fleet.origin_of(r) for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [elsewhere.public_id]
    assert "This subagent row already names its conversation" not in page(admin_client, back)
    # typed in that row while it still waited: the reason under its field, however long its id
    fleet.write_snapshot([row])
    admin_client.post("/subagents/resolve/", {"agent_id": agent_id, "action": "attribute", "typed": "1", "next": back,
                                                          "conversation": "c_nosuchthing"}, **HOST)
    status = page(admin_client, back)
    assert 'id="other-1-error" role="alert"' in status and 'value="c_nosuchthing"' in status


def test_pending_and_deleted_tabs_and_the_tombstone(admin_client):
    pending = factories.make_conversation(title="Going away")
    gone = factories.make_conversation(title="Already gone")
    factories.add_message(gone, content="old words")
    request_deletion(pending, key="tab-1", acting_user=None)
    op = request_deletion(gone, key="tab-2", acting_user=None)
    executor.run_erasure(op.pk)
    recent = page(admin_client, "/conversations/")
    assert "Going away" not in recent and gone.thread_id not in recent
    pending_tab = page(admin_client, "/conversations/?view=pending_delete")
    # Listed by its thread id: from the intent on, the title is content being erased.
    assert pending.thread_id in pending_tab and "See progress" in pending_tab
    assert "Going away" not in pending_tab
    deleted_tab = page(admin_client, "/conversations/?view=deleted")
    assert gone.thread_id in deleted_tab and "Erasure receipt" in deleted_tab
    assert "Already gone" not in deleted_tab
    tombstone = page(admin_client, f"/conversations/{gone.public_id}/")
    assert "Deleted conversation" in tombstone and 'data-testid="tombstone"' in tombstone
    assert "old words" not in tombstone and "/archive/" not in tombstone
    # its state says Deleted (r17: "Idle" beside "Deleted conversation"); a pending one says so too
    assert 'data-testid="runtime-state">Deleted</span>' in tombstone and ">Idle<" not in tombstone
    assert 'data-testid="runtime-state">Pending delete</span>' in page(admin_client, f"/conversations/{pending.public_id}/")
    assert f"/operations/{op.public_id}/" in tombstone
    banner = tombstone.split('data-testid="tombstone"', 1)[1].split("</p>", 1)[0]
    # It says what stays elsewhere by design and where that is listed, never "only ... remain".
    assert "shared copies that could not be revoked" in banner and "listed on its erasure receipt" in banner
    # It says "erased from the database" only once the database's files no longer hold the bytes
    # (r106: on PostgreSQL it said so while the receipt said physically pending).
    op.refresh_from_db()
    pending_physically = "the database's files still hold the deleted bytes"
    if op.physical_state == "pending":
        assert pending_physically in banner and "erased from the database" not in banner
    else:
        assert op.physical_state == "erased"
        assert "is erased from the database and the engine folder" in banner and pending_physically not in banner
    m.DeleteOperation.objects.filter(pk=op.pk).update(physical_state="pending")
    banner = page(admin_client, f"/conversations/{gone.public_id}/").split('data-testid="tombstone"', 1)[1]
    assert pending_physically in banner.split("</p>", 1)[0]
    preview = page(admin_client, f"/conversations/{gone.public_id}/delete/")
    assert "already deleted" in preview and "Delete for good" not in preview
    # Not a fresh preview: no "Delete ...?" heading and no counts of what a delete would do
    assert "<h1>Deleted conversation</h1>" in preview and "Erased for good" not in preview
    under_way = page(admin_client, f"/conversations/{pending.public_id}/delete/")
    assert "<h1>Delete under way</h1>" in under_way and "Erased for good" not in under_way


def test_the_operations_page_lists_deletes_with_their_states(admin_client, member_client):
    done = factories.make_conversation(title="Done one")
    busy = factories.make_conversation(title="Busy")
    factories.start_turn(busy)
    op = request_deletion(done, key="ops-1", acting_user=None)
    executor.run_erasure(op.pk)
    request_deletion(busy, key="ops-2", acting_user=None)
    content = page(member_client, "/operations/")
    assert "Completed" in content and "Refused" in content and "A turn is running or queued." in content
    refused = m.DeleteOperation.objects.get(conversation=busy)
    assert "Ask again" in page(admin_client, f"/operations/{refused.public_id}/")
    as_member = page(member_client, f"/operations/{refused.public_id}/")
    assert "Ask again" not in as_member and "Deleting is for admins only." in as_member  # admins only, said
    assert "INCLUDE SLOT" not in content
    refused_only = page(member_client, "/operations/?state=refused")
    assert "Busy" in refused_only and "Completed</span>" not in refused_only
    assert page(member_client, "/operations/?state=nonsense&page=%C2%B2")
    assert member_client.get("/operations/op_00000000000000000000/", **HOST).status_code == 404
    nav = page(admin_client, "/operations/")
    assert 'href="/operations/" aria-current="page"' in nav


def test_deletes_of_two_owners_conversations_with_one_thread_id_say_whose_each_is(member_client):
    """Two owners may each have a conversation with the same raw thread id; deleted, neither
    has a title left, so the Operations list and each operation's page name the owner."""
    ours = factories.make_conversation(factories.make_account("Northwind"), thread_id="th-shared", title="One")
    theirs = factories.make_conversation(factories.make_computer("lab-mac"), thread_id="th-shared", title="Two")
    ops = []
    for conversation in (ours, theirs):
        ops.append(request_deletion(conversation, key=f"twin-{conversation.pk}", acting_user=None))
        executor.run_erasure(ops[-1].pk)
    listed = page(member_client, "/operations/")
    rows = {op.public_id: listed.split(f'id="op-row-{op.public_id}"', 1)[1].split("</li>", 1)[0] for op in ops}
    assert "Account · <bdi>Northwind</bdi>" in rows[ops[0].public_id] and "lab-mac" not in rows[ops[0].public_id]
    assert "Local · <bdi>lab-mac</bdi>" in rows[ops[1].public_id] and "Northwind" not in rows[ops[1].public_id]
    assert "Local · <bdi>lab-mac</bdi>" in page(member_client, f"/operations/{ops[1].public_id}/")


def test_a_delete_that_stopped_on_the_same_error_until_it_stalled_says_both_and_offers_a_retry(
        admin_client, member_client, api):
    """r48: a conversation folder replaced by a file stopped every run with unsafe_path; past
    MAX_STALLED nothing retried it, yet the page said only the error, with no Retry, and the
    API said nothing of it: the flag was set only when something tried to take the lease."""
    from lifecycle.enginefs import EngineHome

    conversation = factories.make_conversation()
    factories.fill_every_store(conversation)
    folder = EngineHome().artifacts_dir(conversation.storage_key)
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.write_bytes(b"a file where the folder was")
    op = request_deletion(conversation, key="stall-on-file", acting_user=None)
    runs = 0
    while op.pk in executor.outstanding():  # retried by itself (the first run erases the stores before)
        assert executor.run_erasure(op.pk) == "pending"
        m.DeleteOperation.objects.filter(pk=op.pk).update(next_attempt_at=None)  # its back-off, passed
        runs += 1
        assert runs <= executor.MAX_STALLED + 1
    op.refresh_from_db()
    assert (op.state, op.last_error, op.stalled_attempts) == ("pending", "unsafe_path", executor.MAX_STALLED)
    assert op.pk not in executor.outstanding()  # the recovery job leaves it alone now
    shown = api.get(f"/v1/operations/{op.public_id}").json()
    assert (shown["state"], shown["error"], shown["stalled"]) == ("pending", "unsafe_path", True)
    assert shown["error_message"].startswith("Where a folder of this conversation should be there is a symbolic "
                                             "link, a file or")  # r48: it said only "a symbolic link"
    content = page(admin_client, f"/operations/{op.public_id}/")
    assert 'data-testid="op-stalled"' in content and "no longer retried by itself" in content
    assert "Retry now" in content
    # r52: no job cluster runs here, and a stalled delete does not go on when one does: not promised
    assert 'data-testid="cluster-stopped"' not in content
    listed = page(admin_client, "/operations/")
    assert "no longer retried by itself" in listed
    spanish = page(admin_client, f"/operations/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="es")
    assert "Reintentar ahora" in spanish
    folder.unlink()  # the operator fixes the folder, then retries
    admin_client.post(f"/operations/{op.public_id}/retry/", **HOST)
    op.refresh_from_db()
    assert (op.stalled_attempts, op.last_error, executor.stalled(op)) == (0, "", False)
    assert executor.run_erasure(op.pk) == "completed"
    assert api.get(f"/v1/operations/{op.public_id}").json()["stalled"] is False


def test_a_stalled_delete_offers_admins_a_retry(admin_client, member_client):
    conversation = factories.make_conversation()
    op = request_deletion(conversation, key="stall", acting_user=None)
    m.DeleteOperation.objects.filter(pk=op.pk).update(stalled_attempts=5, last_error="stalled", attempts=5)
    content = page(admin_client, f"/operations/{op.public_id}/")
    assert "no longer retried by itself" in content and "Retry now" in content
    assert "Retrying is for admins only." in page(member_client, f"/operations/{op.public_id}/")
    assert member_client.post(f"/operations/{op.public_id}/retry/", **HOST).status_code == 403
    admin_client.post(f"/operations/{op.public_id}/retry/", **HOST)
    op.refresh_from_db()
    assert (op.stalled_attempts, op.last_error) == (0, "")


def test_a_retry_from_a_page_older_than_the_deletes_end_says_nothing_was_retried(admin_client):
    """A stale page's Retry now on a delete that completed since changes nothing and says so
    (it redirected to the delete's page in silence)."""
    conversation = factories.make_conversation()
    op = request_deletion(conversation, key="stale-retry", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    before = (op.state, op.attempts, op.stalled_attempts, op.completed_at)
    for language, words in (("en", "Nothing was retried: this delete is no longer pending (Completed)."),
                            ("es", "No se reintentó nada: esta eliminación ya no está pendiente (Completada).")):
        response = admin_client.post(f"/operations/{op.public_id}/retry/", follow=True,
                                     HTTP_ACCEPT_LANGUAGE=language, **HOST)
        assert response.status_code == 200 and words in response.content.decode()
    op.refresh_from_db()
    assert (op.state, op.attempts, op.stalled_attempts, op.completed_at) == before


@pytest.mark.parametrize("bad", ["/conversations/\x00", "/conversations/\x07x", "/conversations/\u2028",
                                 "https://evil.example/", "conversation-list"])
def test_a_form_sends_back_only_to_a_printable_path_of_this_site(admin_client, settings, bad):
    """A `next` with a NUL or a control character would redirect to an address that itself
    answers 400, after the action ran; such a value, another site or a bare word gives the
    form's own page."""
    conversation = factories.make_conversation(title="Back to where")
    response = admin_client.post(f"/conversations/{conversation.public_id}/archive/",
                                 {"archived": "1", "next": bad}, **HOST)
    assert (response.status_code, response["Location"]) == (302, f"/conversations/{conversation.public_id}/")
    conversation.refresh_from_db()
    assert conversation.archived_at is not None
    for url in ("/i18n/setlang/", "/i18n/settz/"):
        response = admin_client.post(url, {"language": "es", "timezone": "", "next": bad}, **HOST)
        assert (response.status_code, response["Location"]) == (302, "/"), url
    settings.ENGINE_URL = ""
    sent_back = "/engine/conversations/" if bad.startswith("/") else "/engine/" + bad  # (a path of this site)
    response = admin_client.post("/engine/conversations/sync/", {"next": "/engine/" + bad.lstrip("/")}, **HOST)
    assert (response.status_code, response["Location"]) == (302, sent_back)


def test_a_refused_delete_names_the_actions_this_viewer_has_for_this_state(admin_client, member_client):
    """"Archive and Close stay available" was said of a conversation already closed (its page
    offers Resume) and to members (who have neither)."""
    conversation = factories.make_conversation(days_idle=1, title="Held", closed=True)
    fleet.write_snapshot([{"agent_id": "sa_held", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    address = f"/conversations/{conversation.public_id}/delete/"
    note = re.compile(r'data-testid="still-available">([^<]*)<')
    assert note.search(page(admin_client, address)).group(1) == (
        "Nothing was changed. Archive and Resume stay available on the conversation's page.")
    assert note.search(page(member_client, address)).group(1) == "Nothing was changed."
    # r81: the way out's instructions are an admin's; a member reads who can take it
    told = "Attribute each to the conversation it belongs to, or clear it"
    assert told in page(admin_client, address)
    seen = page(member_client, address)
    assert told not in seen and "An admin can attribute each to the conversation it belongs to" in seen
    m.Conversation.objects.filter(pk=conversation.pk).update(closed_at=None, archived_at=m.timezone.now())
    assert note.search(page(admin_client, address)).group(1) == (
        "Nothing was changed. Unarchive and Close stay available on the conversation's page.")


def test_a_refused_delete_with_rows_of_unknown_origin_besides_shows_their_way_out(admin_client):
    """Refused for a running turn, and unknown-origin rows overlap it too: asked again after the
    turn, it would be Unavailable for them, so its page offers their way out as the preview does."""
    conversation = factories.make_conversation(days_idle=1, title="Busy and ambiguous")
    factories.start_turn(conversation)
    fleet.write_snapshot([{"agent_id": "sa_busy", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat()}])
    op = request_deletion(conversation, key="screen-refused-ambiguous", acting_user=None)
    assert op.state == "refused" and "conversation_child_ownership_ambiguous" in op.reasons
    status = page(admin_client, f"/operations/{op.public_id}/")
    assert "Refused" in status and "Subagent rows of unknown origin" in status
    assert status.count('name="agent_id" value="sa_busy"') == 3
    back = f"/operations/{op.public_id}/"
    admin_client.post("/subagents/resolve/", {"agent_id": "sa_busy", "action": "attribute",
                                              "conversation": conversation.public_id, "next": back}, **HOST)
    assert [fleet.origin_of(r) for r in fleet.read_rows(fleet.EngineHome().fleet_path)] == [conversation.public_id]
    assert 'name="agent_id"' not in page(admin_client, back)  # none left to resolve
