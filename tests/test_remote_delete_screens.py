"""The delete confirmation and the receipt of a conversation bound to a remote engine say what
the embedded pages say: what is erased, compacted and kept (exports, shared copies, retained
facts with their periods, provider terms), with the engine's figures where it gave them and
none where it did not; the receipt by store label, action and unit, never by store key.

The engine here is scripted (tests.scripted_engine); a real engine process answers the same
pages in tests/test_remote_engine.py."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.utils import timezone, translation
from django.utils.html import escape

from lifecycle.deletion.presentation import CLASS_RULES, OTHER_LABEL, UNKNOWN_RULE
from lifecycle.models import RetainedFactsPolicy
from lifecycle.registry import STORES, store
from remote.models import BoundDelete, BoundDeleteKey, EngineBinding
from tests.scripted_engine import scripted_engine

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
TARGET, OTHER = "c_" + "a" * 20, "c_" + "b" * 20
FIGURES = {"lifecycle.Item": {"records": 2}, "events": {"records": 3, "bytes": 2048},
           "lifecycle.Export": {"records": 2}, "lifecycle.SharedLink": {"records": 3, "remaining": 1},
           "lifecycle.WorkspaceFile": {"records": 5}, "lifecycle.MemoryEntry": {"records": 1},
           "lifecycle.UsageFact": {"records": 4, "days": 30}, "lifecycle.BillingFact": {"records": 1, "days": 90},
           "lifecycle.AuditFact": {"records": 2, "days": 60}}
FUTURE = {"store": "lifecycle.Hologram", "kind": "table", "class": "erase", "records": 7}  # a newer engine's


@pytest.fixture(autouse=True)
def _language_reset():
    yield
    translation.deactivate()  # a request in Spanish leaves Spanish active in this thread, for the next tests


def preview(**fields) -> dict:
    stores = [{"store": s.key, "kind": s.kind, "class": s.retention.value,
               **({} if s.kind == "external" else {"records": 0}), **FIGURES.get(s.key, {})} for s in STORES]
    return {"target": TARGET, "state": "live", "admission": {"outcome": "admitted", "code": None, "reasons": [],
                                                             "ambiguous": []},
            "stores": [*stores, FUTURE], "shared_copy_remains": 1, **fields}


def bound(title: str = "Quarterly plan") -> EngineBinding:
    return EngineBinding.objects.create(engine_id=TARGET, owner_kind="account", owner_id=1, scope="bound",
                                        thread_id="t1", title=title, engine_state="live")


def point_at(settings, url: str) -> None:
    settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
    settings.ENGINE_CONNECT_TIMEOUT = settings.ENGINE_READ_TIMEOUT = 2


def text(html: str) -> str:
    """The page's words, tags out and spaces collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def items(html: str, testid: str) -> list[str]:
    """The text of each row of the list with that data-testid."""
    block = html.split(f'data-testid="{testid}"', 1)[1].split("</ul>", 1)[0]
    return [text(row) for row in re.findall(r"<li\b.*?</li>", block, re.S)]


def label(key: str, language: str = "en") -> str:
    with translation.override(language):
        return str(store(key).label)


def test_it_names_the_engines_backups_that_hold_the_conversation_and_ignores_what_is_not_one(settings,
                                                                                             admin_client):
    """r74: the engine's preview names its backups that hold the conversation (a delete leaves
    them as they are); the confirmation says so before the delete, as the receipt does after."""
    held = [{"kind": "backup", "name": "lethe-sqlite-20260101T000000Z-abcdef.sqlite3", "made_at": "2026-01-01T00:00:00Z"},
            {"kind": "backup_folder", "name": "/srv/backups"},
            {"kind": "backup", "name": "nightly\tcopy \u202etxt.sqlite3"}, {"kind": "server_wal"}, "not an object",
            {"kind": 5}, {"kind": "backup", "name": 7}]
    b = bound()
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview(backups=held))}) as (url, _seen):
        point_at(settings, url)
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
    assert items(page, "preview-backups") == [
        "Backup lethe-sqlite-20260101T000000Z-abcdef.sqlite3, made before the delete: until that backup is deleted.",
        "Any backup made before the delete in the backup folder /srv/backups, which cannot be read now: until those "
        "backups are deleted.",
        # r77: every backup named, a name's invisible characters written out (it was left out)
        "Backup nightly copy [U+202E]txt.sqlite3, made before the delete: until that backup is deleted."]
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview(backups="junk"))}) as (url, _seen):
        point_at(settings, url)
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
    assert 'data-testid="preview-backups"' not in page and "Delete for good" in page


def test_it_shows_what_the_engine_says_a_delete_erases_and_keeps(settings, admin_client):
    RetainedFactsPolicy.objects.filter(pk=RetainedFactsPolicy.load().pk).update(usage_days=11)  # not the engine's
    b = bound()
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview())}) as (url, seen):
        point_at(settings, url)
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
    assert ("GET", f"/v1/threads/{TARGET}/deletion-preview") in seen
    words = text(page)
    assert 'data-testid="preview-rules-only"' not in page
    assert "Messages and tool calls 2 records" in words and "Event log 3 files, 2.0 KB" in words
    assert "Exports you saved 2 records Files are kept; their link to the conversation is cut." in words
    assert "Shared links and published copies 3 records" in words
    assert "Shared copy remains: 1 published copy cannot be revoked by its publisher" in words
    assert "Workspace files the agent wrote 5 records Untouched." in words
    assert "Project and learned memory 1 record Untouched unless removed separately." in words
    # Retained facts with the periods the engine declared, not this console's own
    assert "Usage and metering 4 records Content-free; kept for 30 days after the delete, then expired." in words
    assert "Billing 1 record Content-free; kept for 90 days" in words and "Audit 2 records" in words
    assert "11 days" not in words
    assert "Provider-retained inputs: Provider retention follows provider terms." in words
    # A store this console does not know: a generic label, the engine's figure, never its key
    assert "Other data on the engine 7 records" in words
    assert "lifecycle." not in page and "Hologram" not in page and "approval_receipts" not in page
    assert "Delete for good" in page


def test_it_says_the_same_in_spanish(settings, admin_client):
    b = bound()
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview())}) as (url, _seen):
        point_at(settings, url)
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", HTTP_ACCEPT_LANGUAGE="es",
                                **HOST).content.decode()
    words = text(page)
    for key in ("lifecycle.Export", "lifecycle.SharedLink", "lifecycle.UsageFact", "provider"):
        assert label(key, "es") in words and label(key, "es") != label(key)
    assert "se conserva durante 30 días tras la eliminación" in words
    assert "Queda una copia compartida: 1 copia publicada" in words
    assert "se rige por sus propias condiciones" in words
    assert "Otros datos del motor" in words
    assert "lifecycle." not in page and "Exports you saved" not in page and "Provider retention" not in page


@pytest.mark.parametrize("engine", ["unreachable", "other-conversation", "text-figure", "no-such-call"])
def test_without_a_usable_preview_it_states_the_rules_and_claims_no_figures(settings, admin_client, engine):
    b = bound()
    answers = {"other-conversation": (200, preview(target=OTHER)),
               "text-figure": (200, preview(stores=[{"store": "lifecycle.Item", "class": "erase", "records": "2"}])),
               "no-such-call": (404, {"detail": "Not Found"})}
    if engine == "unreachable":
        point_at(settings, "http://127.0.0.1:9")
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
    else:
        with scripted_engine({("GET", "/v1/threads/"): lambda h: answers[engine]}) as (url, _seen):
            point_at(settings, url)
            page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
    words = text(page)
    assert 'data-testid="preview-rules-only"' in page
    assert "Exports you saved Files are kept; their link to the conversation is cut." in words
    assert ("Shared links and published copies Revoked where the publisher supports it; otherwise the shared "
            "copy remains.") in words
    assert "Workspace files the agent wrote Untouched." in words
    assert "Usage and metering Content-free; kept for the declared period after the delete, then expired." in words
    assert "Provider retention follows provider terms." in words
    # No figures at all: none given, none made up, none said to be missing
    assert 'class="store-count"' not in page and "could not be counted" not in page
    assert not re.search(r"\d+ (records?|files?)\b", words)
    assert "Delete for good" in page  # the delete itself does not depend on the preview


def raw_rows(html: str, heading: str) -> list[str]:
    """The markup of each row of the preview group under the heading with that id."""
    block = html.split(f'id="{heading}"', 1)[1].split("</ul>", 1)[0]
    return re.findall(r"<li\b.*?</li>", block, re.S)


def store_row(name: str, note: str, count: str | None) -> str:
    """A compacted or engine-reported store's row, exactly as the preview writes it."""
    figure = "" if count is None else f' <span class="store-count">{count}\n</span>'
    return (f'<li><div class="store-line"><span class="store-name">{escape(name)}</span>{figure}</div>'
            f'<p class="store-note">{escape(note)}</p></li>')


@pytest.mark.parametrize("rules_only", [False, True], ids=["figures", "rules-only"])
def test_compacted_and_engine_reported_rows_are_written_alike(settings, admin_client, rules_only):
    """One row markup for both groups: the store's name, the engine's figure (none when the
    engine could not be asked) and what a delete does with it. Stores only the engine knows
    come last in their group: one with a class this console knows (compact), one without."""
    newer = [{"store": "lifecycle.Quantum", "kind": "table", "class": "compact", "records": 4},
             {"store": "lifecycle.Hologram", "kind": "table", "class": "entangle", "records": 7},
             {"store": "blobs", "kind": "file", "class": "", "records": 2, "bytes": 2048}]
    answer = (404, {"detail": "Not Found"}) if rules_only else (200, preview(stores=[*preview()["stores"], *newer]))
    b = bound()
    with scripted_engine({("GET", "/v1/threads/"): lambda h: answer}) as (url, _seen):
        point_at(settings, url)
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
    compacted = [s for s in STORES if s.retention == "compact"]
    assert len(compacted) == 4
    expected = [store_row(str(s.label), str(s.on_delete), None if rules_only else "0 records") for s in compacted]
    if rules_only:
        assert raw_rows(page, "compact-h") == expected
        assert 'data-testid="preview-other"' not in page  # nothing the engine reported
        return
    other, unknown = str(OTHER_LABEL), str(UNKNOWN_RULE)
    assert raw_rows(page, "compact-h") == [*expected, store_row(other, str(CLASS_RULES["compact"]), "4 records")]
    assert raw_rows(page, "other-h") == [store_row(other, unknown, "7 records"),
                                         store_row(other, unknown, "2 files, 2.0\xa0KB")]


def completed(receipt: dict) -> BoundDelete:
    """A bound delete as the delivery job leaves it once the engine's receipt is acknowledged."""
    b = bound(title="")
    now = timezone.now()
    op = BoundDelete.objects.create(key="k-receipt", binding_ref=b.public_id, engine_id=TARGET, owner_kind="account",
                                    owner_id=1, scope="bound", thread_id="t1", state="completed", attempts=1,
                                    engine_operation="op_" + "c" * 20, receipt=receipt, receipt_at=now,
                                    acknowledged_at=now, completed_at=now)
    BoundDeleteKey.objects.create(key=op.key, delete=op)
    b.delete()
    return op


RECEIPT = {"engine": "sqlite", "stores": [
    {"store": "approval_receipts", "class": "erase", "action": "erased", "records": 1, "bytes": 100},
    {"store": "lifecycle.Item", "class": "erase", "action": "erased", "records": 2, "bytes": 2081},
    {"store": "events", "class": "erase", "action": "erased", "records": 3, "bytes": 4096},
    {"store": "lifecycle.OperationBinding", "class": "compact", "action": "compacted", "records": 1, "bytes": 50},
    {"store": "subagents", "class": "compact", "action": "compacted", "records": 2, "bytes": 0},
    {"store": "lifecycle.Export", "class": "retain_detach", "action": "detached", "records": 1, "bytes": 0},
    {"store": "lifecycle.SharedLink", "class": "shared", "action": "revoked", "records": 1, "bytes": 0,
     "remaining": 1},
    {"store": "lifecycle.Hologram", "class": "erase", "action": "dematerialized", "records": 4, "bytes": 10},
], "kept": [
    {"store": "lifecycle.WorkspaceFile", "class": "retain", "action": "kept", "records": 3},
    {"store": "lifecycle.UsageFact", "class": "retain_facts", "action": "kept", "records": 2},
    {"store": "provider", "class": "out_of_scope", "action": "out_of_scope"},
    {"store": "lifecycle.Hologram", "class": "retain", "action": "kept", "records": "many"},
    "not an entry",
]}


def test_a_released_bindings_keys_answer_with_their_recorded_outcome_and_a_new_key_with_its_delete(
        settings, admin_client, api):
    """Once a completed delete let its binding go (r122): the form sent again leads to its delete
    (it was 404); the API answers each key with its recorded outcome (a refused one 409, as for a
    binding still here; it was 202), a new key with the completed delete, remembered for it; no
    key 400, another conversation's key 422, and an id never bound 404. Nothing is sent anywhere."""
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t" * 40  # nothing listens: never asked
    op = completed(RECEIPT)
    refused = BoundDelete.objects.create(key="k-refused", binding_ref=op.binding_ref, engine_id=TARGET,
                                         owner_kind="account", owner_id=1, scope="bound", thread_id="t1",
                                         state="refused", code="conversation_turns_running", completed_at=op.requested_at)
    BoundDeleteKey.objects.create(key=refused.key, delete=refused)
    elsewhere = BoundDelete.objects.create(key="k-other", binding_ref="b_" + "9" * 20, engine_id=OTHER,
                                           owner_kind="account", owner_id=1, scope="bound", thread_id="t2",
                                           state="refused", code="conversation_turns_running")
    BoundDeleteKey.objects.create(key=elsewhere.key, delete=elsewhere)
    form_url = f"/engine/conversations/{op.binding_ref}/delete/"
    resent = admin_client.post(form_url, {"key": op.key, "seen": "x"}, **HOST)
    assert (resent.status_code, resent["Location"]) == (302, f"/engine/deletes/{op.public_id}/")
    refused_again = admin_client.post(form_url, {"key": refused.key, "seen": "x"}, **HOST)
    assert refused_again["Location"] == f"/engine/deletes/{refused.public_id}/"

    def delete(key: str | None, binding_id: str = op.binding_ref):
        return api.delete(f"/api/v1/bindings/{binding_id}", **({"HTTP_IDEMPOTENCY_KEY": key} if key else {}))

    assert (delete(op.key).status_code, delete(op.key).json()["id"]) == (202, op.public_id)
    answer = delete(refused.key)
    assert (answer.status_code, answer.json()["outcome"], answer.json()["operation"]) == (
        409, "refused", refused.public_id)
    joined = delete("k-new")
    assert (joined.status_code, joined.json()["id"], joined.json()["state"]) == (202, op.public_id, "completed")
    assert BoundDeleteKey.objects.get(key="k-new").delete_id == op.pk
    assert (delete(None).status_code, delete(None).json()["code"]) == (400, "idempotency_key_missing")
    assert (delete("k-other").status_code, delete("k-other").json()["code"]) == (422, "idempotency_key_reused")
    assert delete("k-never", "b_" + "0" * 20).status_code == 404
    assert not BoundDeleteKey.objects.filter(key__in=["k-never"]).exists()
    assert BoundDelete.objects.count() == 3 and not EngineBinding.objects.exists()


def test_the_receipt_names_each_store_its_action_and_unit(admin_client):
    op = completed(RECEIPT)
    page = admin_client.get(f"/engine/deletes/{op.public_id}/", **HOST).content.decode()
    assert page.count('data-state="completed"') == 1
    # Erased first, then compacted, then the rest, each in the registry's order; unknown stores last
    assert items(page, "receipt") == [
        "Messages and tool calls 2 records erased · 2.0 KB",
        "Event log 3 files erased · 4.0 KB",
        "Approval receipt log and recovery files 1 file erased · 100 bytes",
        "Turn-operation bindings 1 record compacted · 50 bytes",
        "Settled subagent rows 2 records compacted",  # rows of the shared fleet file, not files
        "Exports you saved 1 record kept, link cut",
        "Shared links and published copies 1 record revoked · 1 shared copy remains",
        "Other data on the engine 4 records · 10 bytes",  # an action this console does not know: not named
    ]
    assert items(page, "receipt-kept") == [
        "Workspace files the agent wrote 3 records kept",
        "Usage and metering 2 records kept until their period after the delete runs out",
        "Provider-retained inputs follows provider terms",
        "Other data on the engine kept",  # a figure that is not a count is not shown
    ]
    totals = text(page.split('data-testid="changed-totals"', 1)[1].split("</p>", 1)[0])
    assert "5 records, 4 files" in totals  # erased or compacted; files of the conversation's folders apart
    assert "<code>" not in page.split('data-testid="receipt"', 1)[1].split("</ul>", 1)[0]
    assert not re.search(r"lifecycle\.|approval_receipts|\bevents\b|Hologram|dematerialized", text(page))


@pytest.mark.parametrize(("language", "words"), [
    ("en", ["erased", "compacted", "kept, link cut", "revoked"]),
    ("es", ["datos borrados", "datos compactados", "datos conservados, vínculo cortado", "enlaces revocados"]),
])
def test_a_receipt_line_without_usable_figures_says_what_was_done_and_no_number(admin_client, language, words):
    """An engine's figure that is not a whole number is not shown; the line still says what
    was done, in words that agree with nothing they do not name (Spanish: "datos borrados")."""
    receipt = {"engine": "sqlite", "stores": [
        {"store": "lifecycle.Item", "class": "erase", "action": "erased", "records": "two", "bytes": -1},
        {"store": "lifecycle.OperationBinding", "class": "compact", "action": "compacted", "records": None},
        {"store": "lifecycle.Export", "class": "retain_detach", "action": "detached", "records": 1.5},
        {"store": "lifecycle.SharedLink", "class": "shared", "action": "revoked", "records": [1]},
    ], "kept": []}
    op = completed(receipt)
    page = admin_client.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE=language, **HOST).content.decode()
    assert items(page, "receipt") == [
        f"{label(key, language)} {word}" for key, word in zip(
            ["lifecycle.Item", "lifecycle.OperationBinding", "lifecycle.Export", "lifecycle.SharedLink"], words,
            strict=True)]
    totals = text(page.split('data-testid="changed-totals"', 1)[1].split("</p>", 1)[0])
    assert {"en": ">Erased or compacted, where the engine gave figures: 0 records, 0 bytes.",
            "es": ">Borrado o compactado, donde el motor dio cifras: 0 registros, 0 bytes."}[language] == totals


@pytest.mark.parametrize("answer", [
    {"receipt": ["not", "an", "object"]},
    {"receipt": "text"},
    {"receipt": {"stores": "text", "kept": 7, "holders": "x"}},
    {"receipt": {"stores": [{"store": "lifecycle.Item", "action": "erased", "records": "two", "bytes": 1.5}]}},
    {"steps": "text", "reasons": {"a": 1}, "way_out": ["x"]},
    {"steps": [1, None, {"store": 3, "state": "done"}, {"store": "lifecycle.Item"}], "reasons": [1, "busy"]},
])
def test_an_engine_operation_in_an_unexpected_shape_is_shown_without_a_server_error(settings, admin_client, answer):
    """A remote engine's operation answer is read only in the shape the pages use: a receipt
    that is not an object, steps that do not name a store and a state, figures that are not
    counts are left out; the operation's own page and the list answer 200 and say what they can."""
    operation = {"id": "op_" + "d" * 20, "target": TARGET, "state": "completed", "kind": "delete",
                 "requested_at": "2026-12-01T00:00:00Z", "completed_at": "2026-12-01T00:01:00Z", **answer}
    with scripted_engine({("GET", "/v1/operations/"): lambda h: (200, operation),
                          ("GET", "/v1/operations"): lambda h: (200, {"results": [operation], "next": None})}) as (url, _):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
        detail = admin_client.get(f"/operations/{operation['id']}/", **HOST)
        listed = admin_client.get("/operations/", **HOST)
    assert detail.status_code == 200 and listed.status_code == 200
    assert operation["id"] in listed.content.decode()
    assert "Deleted on" in detail.content.decode()


def test_the_receipt_in_spanish_has_no_store_keys(admin_client):
    op = completed(RECEIPT)
    page = admin_client.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    rows = items(page, "receipt")
    assert rows[0] == f"{label('lifecycle.Item', 'es')} 2 registros borrados · 2,0 KB"
    assert rows[1] == f"{label('events', 'es')} 3 archivos borrados · 4,0 KB"
    assert rows[5] == f"{label('lifecycle.Export', 'es')} 1 registro conservado, vínculo cortado"
    assert rows[6] == f"{label('lifecycle.SharedLink', 'es')} 1 registro revocado · queda 1 copia compartida"
    assert rows[7].startswith("Otros datos del motor 4 registros")
    kept = items(page, "receipt-kept")
    assert kept[1] == (f"{label('lifecycle.UsageFact', 'es')} 2 registros conservados hasta que termine su "
                       "periodo tras la eliminación")
    assert kept[2] == f"{label('provider', 'es')} según las condiciones del proveedor"
    for key in ("lifecycle.Item", "events", "lifecycle.Export", "lifecycle.SharedLink", "provider"):
        assert label(key, "es") != label(key)
    assert not re.search(r"lifecycle\.|approval_receipts|\bevents\b|Hologram", text(page))
    assert "Messages and tool calls" not in page and " records" not in page and "erased" not in text(page)


def test_the_list_says_which_conversations_the_engine_has_deleted_or_is_deleting(settings, admin_client):
    """A conversation deleted on its engine by other means (its own console, another one) is
    read back by a sync with the engine's state: the list does not show that tombstone, or a
    delete under way there, as a conversation living on the engine."""
    point_at(settings, "http://127.0.0.1:9")  # the list asks the engine nothing
    for state in ("live", "pending_delete", "deleted"):
        EngineBinding.objects.create(engine_id=f"c_{state}", owner_kind="account", owner_id=1, scope="bound",
                                     thread_id=f"t-{state}", title="", engine_state=state)
    for language, words in (("en", {"pending_delete": "Pending delete on the engine",
                                    "deleted": "Deleted on the engine"}),
                            ("es", {"pending_delete": "Eliminación pendiente en el motor",
                                    "deleted": "Eliminada en el motor"})):
        page = admin_client.get("/engine/conversations/?owner=account:1", HTTP_ACCEPT_LANGUAGE=language,
                                **HOST).content.decode()
        rows = {re.search(r'data-thread="([^"]+)"', row).group(1): text(row)
                for row in re.findall(r'<li class="card binding-row".*?</li>', page, re.S)}
        assert set(rows) == {"t-live", "t-pending_delete", "t-deleted"}
        assert words["deleted"] in rows["t-deleted"] and words["pending_delete"] not in rows["t-deleted"]
        assert words["pending_delete"] in rows["t-pending_delete"] and words["deleted"] not in rows["t-pending_delete"]
        assert not any(w in rows["t-live"] for w in words.values())


def test_the_list_says_when_the_engine_listed_its_conversations(settings, admin_client, member_client):
    """r67: the list is the engine's as the last read found it; it said nothing of when, and
    showed a conversation deleted on the engine since, with its title and a Delete. It gives the
    oldest read of the owner's rows shown (in the viewer's zone), for admins and members."""
    point_at(settings, "http://127.0.0.1:9")
    read = timezone.now() - timedelta(days=3)
    EngineBinding.objects.create(engine_id="c_old", owner_kind="account", owner_id=1, scope="bound",
                                 thread_id="t-old", title="Old", synced_at=read)
    EngineBinding.objects.create(engine_id="c_new", owner_kind="account", owner_id=1, scope="bound",
                                 thread_id="t-new", title="New")
    EngineBinding.objects.create(engine_id="c_other", owner_kind="account", owner_id=2, scope="bound",
                                 thread_id="t-other", title="Other", synced_at=read - timedelta(days=30))
    for client, language, words in ((admin_client, "en", "As the engine listed them 3"),
                                    (member_client, "es", "Tal como el motor las listó hace 3")):
        page = client.get("/engine/conversations/?owner=account:1", HTTP_ACCEPT_LANGUAGE=language,
                          **HOST).content.decode()
        said = text(re.search(r'data-testid="bindings-read-at">(.*?)</p>', page, re.S).group(1))
        assert said.startswith(words), said
        with translation.override(language):
            from django.utils import formats

            assert formats.date_format(timezone.localtime(read), "DATETIME_FORMAT") in said


@pytest.mark.parametrize("state", ["deleted", "pending_delete"])
def test_the_confirmation_says_when_the_engine_already_deleted_or_is_deleting_it(settings, admin_client, state):
    """A conversation its engine deleted by other means (or is deleting) is not previewed as a
    delete to come: its figures are a tombstone's, and its facts' periods run from that delete.
    The page says a confirmation only asks the engine for that delete's receipt."""
    b = bound(title="")
    answer = preview(state=state)
    words = {"en": {"deleted": "The engine has already deleted this conversation",
                    "pending_delete": "The engine is already deleting this conversation"},
             "es": {"deleted": "El motor ya eliminó esta conversación",
                    "pending_delete": "El motor ya está eliminando esta conversación"}}
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, answer)}) as (url, _seen):
        point_at(settings, url)
        for language in ("en", "es"):
            page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", HTTP_ACCEPT_LANGUAGE=language,
                                    **HOST).content.decode()
            assert words[language][state] in text(page)
            assert 'data-testid="preview-kept"' not in page  # no figures of a delete to come
            assert f'action="/engine/conversations/{b.public_id}/delete/"' in page  # confirming stays possible
        live = preview()
        with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, live)}) as (live_url, _):
            point_at(settings, live_url)
            page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
        assert 'data-testid="preview-kept"' in page and "already" not in text(page)
    assert not BoundDelete.objects.exists() and EngineBinding.objects.filter(pk=b.pk).exists()


@pytest.mark.parametrize("outcome", ["refused", "unavailable"])
def test_a_delete_the_engine_would_not_admit_says_why_and_offers_no_confirmation(settings, admin_client, outcome):
    """The engine's preview says a delete would be refused (or is unavailable) now: the page
    says so with each reason, in this console's words where it knows the code (the engine's
    text, made one printable line, where it does not), and offers no Delete for good that
    could only fail."""
    from lifecycle.deletion import reasons

    admission = {"outcome": outcome, "code": reasons.TURN_ACTIVE, "ambiguous": [], "reasons": [
        {"code": reasons.TURN_ACTIVE, "outcome": "refused", "message": "engine words"},
        {"code": "conversation_new_reason", "outcome": outcome, "message": "A reason\x07 only a newer\nengine has"}]}
    b = bound()
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview(admission=admission))}) as (url, _seen):
        point_at(settings, url)
        page = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", **HOST).content.decode()
        spanish = admin_client.get(f"/engine/conversations/{b.public_id}/delete/", HTTP_ACCEPT_LANGUAGE="es",
                                   **HOST).content.decode()
    with translation.override("en"):
        assert items(page, "delete-not-admitted") == [reasons.message(reasons.TURN_ACTIVE),
                                                     "A reason only a newer engine has"]
    heading = "Delete is refused right now" if outcome == "refused" else "Delete is unavailable"
    assert heading in page and "Check again" in page
    assert "Delete for good" not in page and 'name="key"' not in page
    assert "Messages and tool calls 2 records" in text(page)  # what a delete would do, still shown
    with translation.override("es"):
        assert reasons.message(reasons.TURN_ACTIVE) in text(spanish)
    assert "Eliminar para siempre" not in spanish


def unreachable_for_now() -> BoundDelete:
    """A pending bound delete whose engine could not be reached, retried in five minutes."""
    b = bound()
    now = timezone.now()
    return BoundDelete.objects.create(key="k-unreachable", binding=b, binding_ref=b.public_id, engine_id=TARGET,
                                      owner_kind="account", owner_id=1, scope="bound", thread_id="t1",
                                      state="pending", waiting_on="engine", last_error="engine_unreachable",
                                      last_error_at=now, next_attempt_at=now + timedelta(minutes=5))


def test_a_retry_already_due_is_not_shown_as_a_time_in_the_past():
    """The minute sweep takes a retry once it is due: the page says it comes within a minute
    rather than naming a time that has passed."""
    from remote.status import waiting_text

    op = unreachable_for_now()
    assert "(next retry: " in waiting_text(op, None)
    op.next_attempt_at = timezone.now() - timedelta(seconds=10)
    assert waiting_text(op, None) == "Waiting for the engine: it cannot be reached; it is tried again within a minute."


def test_a_remote_consoles_conversation_list_says_where_its_conversations_are(settings, admin_client):
    page = admin_client.get("/conversations/", **HOST).content.decode()
    assert 'data-testid="remote-engine-note"' not in page  # the embedded engine: this list is the data
    settings.ENGINE_URL = "http://127.0.0.1:9"
    page = admin_client.get("/conversations/", **HOST).content.decode()
    assert "the conversations it governs are on the engine, listed under Engine conversations" in page
    spanish = admin_client.get("/conversations/", HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "las conversaciones que gestiona están en el motor" in spanish


@pytest.mark.parametrize(("extra", "physical", "verified"), [
    ({"physical": {"state": "erased"}, "verification": {"logical": "clean", "at": "2026-12-01T10:00:00+00:00"}},
     "Physically erased on the engine", "The engine re-checked every store on Dec. 1, 2026, 10 a.m. UTC: clean."),
    ({"physical": {"state": "pending"}, "verification": {"logical": "found"}},
     "Physically pending there", "The engine's last check found traces of this conversation"),
    ({"physical": "erased", "verification": ["clean"]}, None, None),  # not in a form this console knows: nothing said
])
def test_the_receipt_says_what_the_engine_reports_of_physical_erasure_and_its_checks(admin_client, extra, physical,
                                                                                      verified):
    op = completed({**RECEIPT, **extra})
    page = admin_client.get(f"/engine/deletes/{op.public_id}/", **HOST).content.decode()
    words = text(page)
    if physical is None:
        assert 'data-testid="engine-physical"' not in page and 'data-testid="engine-verified"' not in page
    else:
        assert physical in words and verified in words


def cluster_runs() -> None:
    """A job cluster runs: its heartbeat job just finished (ops.health.cluster_stopped)."""
    from ops.jobs import record_run

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)


def test_an_engine_that_cannot_be_reached_is_said_once_on_the_delete_page(admin_client):
    cluster_runs()
    op = unreachable_for_now()
    page = text(admin_client.get(f"/engine/deletes/{op.public_id}/", **HOST).content.decode())
    assert page.count("cannot be reached") == 1 and "next retry:" in page
    BoundDelete.objects.filter(pk=op.pk).update(last_error="engine_bad_answer")
    page = text(admin_client.get(f"/engine/deletes/{op.public_id}/", **HOST).content.decode())
    assert "could not be used" in page  # other errors are still said in their own words


@pytest.mark.parametrize("key", [None, "", "has space"])
def test_a_delete_form_without_its_key_says_so_in_the_forms_words_and_sends_nothing(settings, admin_client, key):
    """r23: a form without its hidden key said "Send an Idempotency-Key header", the API's words."""
    b = bound()
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview()),
                          ("DELETE", "/v1/threads/"): lambda h: (202, {})}) as (url, seen):
        point_at(settings, url)
        response = admin_client.post(f"/engine/conversations/{b.public_id}/delete/",
                                     {} if key is None else {"key": key}, **HOST)
    assert response.status_code == 400
    page = response.content.decode()
    assert "The form arrived incomplete or altered, so nothing was deleted." in page and "Idempotency" not in page
    assert not [request for request in seen if request[0] == "DELETE"]
    assert not BoundDelete.objects.exists()



HELD = [{"kind": "backup", "name": "lethe-sqlite-20261206T013337Z-abc123.sqlite3"},
        {"kind": "database_files"}, {"kind": "wal"}, "not a holder"]
BACKUP_WORDS = "Backup lethe-sqlite-20261206T013337Z-abc123.sqlite3, made before the delete: until that backup is deleted."


@pytest.mark.parametrize(("extra", "shown"), [
    ({"holders": HELD, "physical": {"state": "pending"}}, [
        BACKUP_WORDS, "The database's table files: until an operator runs manage.py finish_erasure.",
        "The database's write-ahead log: until the next successful checkpoint."]),
    # erased on the engine: its database no longer holds them, its backups still do
    ({"holders": HELD, "physical": {"state": "erased"}}, [BACKUP_WORDS]),
    ({}, None),  # an engine that names nothing: no list
])
def test_the_page_names_what_still_holds_the_deleted_bytes_on_the_engine(admin_client, extra, shown):
    """r35: the engine's receipt named its backups made before the delete, the console stored
    them and showed none, while its own copy's section said "No earlier backup or archive
    holds them"."""
    op = completed({**RECEIPT, **extra})
    page = admin_client.get(f"/engine/deletes/{op.public_id}/", **HOST).content.decode()
    if shown is None:
        assert 'data-testid="engine-holders"' not in page
        return
    assert [html.unescape(row) for row in items(page, "engine-holders")] == shown
    spanish = admin_client.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Qué conserva todavía los bytes eliminados en el motor:" in text(spanish)


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "America/New_York", "Pacific/Kiritimati"])
@pytest.mark.parametrize("expired_at", ["9999-12-31T23:00:00Z", "0001-01-01T00:00:00", "2026-02-30T00:00:00Z"])
def test_a_receipt_time_at_the_calendars_end_is_shown_without_a_time_not_a_server_error(admin_client, zone,
                                                                                          expired_at):
    """An expired fact's time of year 9999 answered 500 in every zone east of UTC (r45)."""
    op = completed({"stores": [], "kept": [{"store": "lifecycle.UsageFact", "class": "retain_facts",
                                             "action": "expired", "records": 1, "expired_at": expired_at}]})
    admin_client.cookies["lethe_timezone"] = zone
    response = admin_client.get(f"/engine/deletes/{op.public_id}/", **HOST)
    assert response.status_code == 200


def test_the_owner_list_reads_one_row_per_owner_not_per_binding(settings, admin_client):
    """r78: the owners' DISTINCT carried the models' default ordering columns, so every page load
    read one row per binding (450,000 bindings: over a second and 80 MB a request)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t" * 40
    for n in range(30):
        EngineBinding.objects.create(engine_id=f"c_{n:020d}", owner_kind="account", owner_id=n % 3, scope="bound",
                                     thread_id=f"t{n}", engine_state="live")
    with CaptureQueriesContext(connection) as seen:
        page = admin_client.get("/engine/conversations/", **HOST).content.decode()
    distinct = [q["sql"] for q in seen.captured_queries if "DISTINCT" in q["sql"]]
    assert len(distinct) == 2 and not any("last_activity_at" in sql or "requested_at" in sql or '"id"' in sql
                                          for sql in distinct), distinct
    with connection.cursor() as cursor:
        cursor.execute(distinct[0])
        assert len(cursor.fetchall()) == 3  # one row per owner
    assert page.count('<option value="account:') == 3


def test_past_a_hundred_owners_an_engine_owner_is_found_by_its_number(settings, admin_client, monkeypatch):
    """r78: every engine owner was an option (1,500 owners: a 170 KB page)."""
    from remote import views

    monkeypatch.setattr(views, "OWNER_CHOICES", 3)
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t" * 40
    for n, owner_id in enumerate((7, 12, 31, 45, 120)):
        EngineBinding.objects.create(engine_id=f"c_{n:020d}", owner_kind="account", owner_id=owner_id, scope="bound",
                                     thread_id=f"t{n}", engine_state="live")

    def offered(page: str) -> list[str]:
        start = page.index('<select id="owner"')
        return re.findall(r'<option value="([^"]+)"', page[start:page.index("</select>", start)])

    page = admin_client.get("/engine/conversations/", **HOST).content.decode()
    assert offered(page) == ["account:7", "account:12", "account:31"]
    assert "The list offers 3 of 5 owners: type part of an owner's number, then Show." in page
    found = admin_client.get("/engine/conversations/?owner=account:7&owner_find=12", **HOST).content.decode()
    assert offered(found) == ["account:7", "account:12", "account:120"]  # the one shown, then the two that match
    assert "2 owners' numbers hold “12”" in found
    spanish = admin_client.get("/engine/conversations/", HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert 'id="owner-find"' in spanish and "The list offers" not in spanish


def test_a_confirmation_of_what_the_engine_no_longer_previews_is_shown_again_and_not_sent(settings, admin_client):
    """The engine's conversation grew after the page was shown: the confirmation is not sent;
    the page shows the engine's preview as it is now, and its own confirmation is sent (r100)."""
    b = bound()
    shown = {"stores": preview()}

    def deletion_preview(_headers):
        return 200, shown["stores"]

    with scripted_engine({("GET", "/v1/threads/"): deletion_preview,
                          ("DELETE", "/v1/threads/"): lambda h: (202, {})}) as (url, seen):
        point_at(settings, url)
        url_delete = f"/engine/conversations/{b.public_id}/delete/"
        page = admin_client.get(url_delete, **HOST).content.decode()
        form = {name: re.search(rf'name="{name}" value="([^"]+)"', page).group(1) for name in ("key", "seen")}
        grown = preview()
        grown["stores"] = [{**s, "records": 9} if s["store"] == "lifecycle.Item" else s for s in grown["stores"]]
        shown["stores"] = grown
        refused = admin_client.post(url_delete, form, **HOST)
        assert refused.status_code == 409
        again = refused.content.decode()
        assert "changed after the page was shown, so your confirmation was not taken" in again
        assert "Messages and tool calls 9 records" in text(again)
        assert not [request for request in seen if request[0] == "DELETE"] and not BoundDelete.objects.exists()
        fresh = {name: re.search(rf'name="{name}" value="([^"]+)"', again).group(1) for name in ("key", "seen")}
        confirmed = admin_client.post(url_delete, fresh, **HOST)
    op = BoundDelete.objects.get()  # recorded here, delivered to the engine by the job cluster
    assert (confirmed.status_code, confirmed["Location"]) == (302, f"/engine/deletes/{op.public_id}/")


def test_a_delete_the_engine_no_longer_admits_at_confirmation_is_sent_and_not_called_a_change(settings,
                                                                                             admin_client):
    """The engine's folder went between the page and its confirmation: its preview now counts
    no files and says the delete is unavailable. That is no change of the conversation (r139:
    "This conversation changed after the page was shown", in both languages): the delete is
    recorded and sent, and the engine answers it with its reasons, as the embedded engine does."""
    from lifecycle.deletion import reasons

    b = bound()
    shown = {"preview": preview()}
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, shown["preview"])}) as (url, _seen):
        point_at(settings, url)
        url_delete = f"/engine/conversations/{b.public_id}/delete/"
        page = admin_client.get(url_delete, **HOST).content.decode()
        form = {name: re.search(rf'name="{name}" value="([^"]+)"', page).group(1) for name in ("key", "seen")}
        gone = preview(admission={"outcome": "unavailable", "code": reasons.ENGINE_FOLDER_UNAVAILABLE, "ambiguous": [],
                                  "reasons": [{"code": reasons.ENGINE_FOLDER_UNAVAILABLE, "outcome": "unavailable",
                                               "message": "gone"}]})
        gone["stores"] = [{**e, "records": None} if e.get("kind") == "file" else e for e in gone["stores"]]
        shown["preview"] = gone
        confirmed = admin_client.post(url_delete, form, **HOST)
    op = BoundDelete.objects.get()
    assert (confirmed.status_code, confirmed["Location"]) == (302, f"/engine/deletes/{op.public_id}/")


def test_the_http_engine_compares_a_confirmation_only_for_a_delete_the_engine_admits(settings):
    """The same through the engine client a console's delete page uses: a delete only the
    engine's folder keeps from being admitted now is sent (its answer carries the reason), never
    refused as changed; one whose figures moved otherwise is refused (r139)."""
    from lifecycle.actions.request_deletion import CHANGED_CODE
    from lifecycle.deletion import reasons
    from lifecycle.deletion.preview import preview_digest
    from lifecycle.engine.http import HttpEngine
    from lifecycle.errors import ActionRefused

    seen = preview_digest(preview())
    moved = preview()
    moved["stores"] = [{**e, "records": 9} if e["store"] == "lifecycle.Item" else e for e in moved["stores"]]
    unavailable = {**moved, "admission": {"outcome": "unavailable", "code": reasons.ENGINE_FOLDER_UNAVAILABLE,
                                          "ambiguous": [], "reasons": [{"code": reasons.ENGINE_FOLDER_UNAVAILABLE,
                                                                        "outcome": "unavailable", "message": "gone"}]}}
    refusal = {"code": reasons.ENGINE_FOLDER_UNAVAILABLE, "message": "gone", "outcome": "unavailable",
               "operation": "op_" + "2" * 20}
    operation = {"id": "op_" + "2" * 20, "target": TARGET, "state": "unavailable", "code": reasons.ENGINE_FOLDER_UNAVAILABLE,
                 "message": "gone", "reasons": [reasons.ENGINE_FOLDER_UNAVAILABLE], "steps": []}
    answers = {"preview": unavailable}
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, answers["preview"]),
                          ("DELETE", "/v1/threads/"): lambda h: (409, refusal),
                          ("GET", "/v1/operations/"): lambda h: (200, operation)}) as (url, seen_requests):
        point_at(settings, url)
        op = HttpEngine().request_delete(TARGET, key="k-gone", actor=None, seen=seen)
        assert (op.state, op.reasons) == ("unavailable", [reasons.ENGINE_FOLDER_UNAVAILABLE])
        answers["preview"] = moved
        with pytest.raises(ActionRefused) as refused:
            HttpEngine().request_delete(TARGET, key="k-moved", actor=None, seen=seen)
    assert refused.value.code == CHANGED_CODE
    assert [r[0] for r in seen_requests].count("DELETE") == 1


def test_an_engine_that_cannot_preview_at_confirmation_is_not_a_change(settings, admin_client):
    """The engine answered the page's preview and cannot be asked at the confirmation: nothing
    is said to have changed (r101: "This conversation changed"); the delete is recorded and
    sent once the engine answers, as from a page shown without figures."""
    b = bound()
    up = {"answering": True}

    def deletion_preview(_headers):
        return (200, preview()) if up["answering"] else (503, b"<html>down</html>")

    with scripted_engine({("GET", "/v1/threads/"): deletion_preview}) as (url, _seen):
        point_at(settings, url)
        url_delete = f"/engine/conversations/{b.public_id}/delete/"
        page = admin_client.get(url_delete, **HOST).content.decode()
        form = {name: re.search(rf'name="{name}" value="([^"]+)"', page).group(1) for name in ("key", "seen")}
        up["answering"] = False
        confirmed = admin_client.post(url_delete, form, **HOST)
    op = BoundDelete.objects.get()
    assert (confirmed.status_code, confirmed["Location"]) == (302, f"/engine/deletes/{op.public_id}/")


def test_a_confirmation_from_a_page_shown_before_someone_elses_delete_says_it_did_nothing_more(settings, admin_client):
    """A delete requested by someone else after the page was shown: the confirmation joins that
    delete and sends nothing; the page it leads to says so (it said nothing, and read as if this
    press had requested it). The form sent again with its own key says it once, not again."""
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t" * 40  # nothing listens: never asked
    b = bound()
    other = BoundDelete.objects.create(key="k-first", binding=b, binding_ref=b.public_id, engine_id=TARGET,
                                       owner_kind="account", owner_id=1, scope="bound", thread_id="t1",
                                       state="pending", waiting_on="engine")
    BoundDeleteKey.objects.create(key=other.key, delete=other)
    form_url = f"/engine/conversations/{b.public_id}/delete/"
    late = admin_client.post(form_url, {"key": "ui-shown-before", "seen": "x"}, follow=True, **HOST)
    assert late.redirect_chain == [(f"/engine/deletes/{other.public_id}/", 302)]
    assert "had already been requested: your confirmation did nothing more" in late.content.decode()
    assert list(BoundDelete.objects.values_list("pk", "attempts")) == [(other.pk, 0)]
    assert BoundDeleteKey.objects.get(key="ui-shown-before").delete_id == other.pk
    again = admin_client.post(form_url, {"key": "ui-shown-before", "seen": "x"}, follow=True, **HOST)
    assert again.redirect_chain == [(f"/engine/deletes/{other.public_id}/", 302)]
    assert "had already been requested" not in again.content.decode()
    with translation.override("es"):
        spanish = admin_client.post(form_url, {"key": "ui-es", "seen": "x"}, follow=True, HTTP_ACCEPT_LANGUAGE="es",
                                    **HOST).content.decode()
    assert "ya se había solicitado: su confirmación" in text(spanish)


def test_a_delete_someone_requests_while_a_confirmation_is_on_its_way_is_said_to_be_theirs(settings, admin_client,
                                                                                             monkeypatch):
    """r134: the page read no pending delete, then another admin's request committed before this
    one's: it joined theirs (right) and said nothing, reading as this press's delete. Told by the
    delete's own key now, whenever theirs came in."""
    from remote import views

    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t" * 40  # nothing listens
    b = bound()
    original = views.request_bound_delete

    def racing(binding, *, key, actor):
        original(binding, key="ui-the-other-admins", actor=None)  # theirs lands first
        return original(binding, key=key, actor=actor)

    monkeypatch.setattr(views, "request_bound_delete", racing)
    late = admin_client.post(f"/engine/conversations/{b.public_id}/delete/", {"key": "ui-mine"}, follow=True, **HOST)
    theirs = BoundDelete.objects.get()
    assert theirs.key == "ui-the-other-admins"
    assert late.redirect_chain == [(f"/engine/deletes/{theirs.public_id}/", 302)]
    assert "had already been requested: your confirmation did nothing more" in late.content.decode()
    assert BoundDeleteKey.objects.get(key="ui-mine").delete_id == theirs.pk


def test_the_delete_that_let_a_binding_go_is_found_through_an_index():
    """A form or API request sent again after its binding is gone looks its delete up by the
    binding's id: an index read, never a scan of every bound delete."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from remote.delivery import released_delete

    op = completed(RECEIPT)
    with CaptureQueriesContext(connection) as queries:
        assert released_delete(op.binding_ref) == op
    (query,) = queries.captured_queries
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # a table this small: else any plan is as good
        cursor.execute(("EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN ") + query["sql"])
        plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
    assert "bound_delete_released_idx" in plan, plan


def test_a_bound_delete_waiting_on_a_stopped_job_cluster_says_so_not_that_it_is_being_sent(admin_client, api):
    """r129: with no job cluster running, a bound delete's page and the API said "the request is
    being sent" or "it is tried again within a minute", though nothing would send it: this
    console's cluster sends it, follows the engine's erasure and acknowledges its receipt."""
    from ops.models import JobStat

    op = unreachable_for_now()
    url = f"/engine/deletes/{op.public_id}/"
    never = ("Waiting for this console: no job has finished recently, so its job cluster seems to be stopped; "
             "nothing is sent to the engine or read from it until it runs again.")
    shown = text(admin_client.get(url, **HOST).content.decode())
    assert f"Waiting on: this console {never}" in shown and "Waiting on: the engine" not in shown
    answer = api.get(f"/api/v1/bound-deletes/{op.public_id}").json()
    assert (answer["waiting_on"], answer["waiting_message"]) == ("console", never)
    cluster_runs()
    JobStat.objects.update(last_finished_at=timezone.now() - timedelta(minutes=10))  # stopped since
    page = text(admin_client.get(url, **HOST).content.decode())
    assert "Waiting for this console: no job has finished since" in page and "cannot be reached" not in page
    with translation.override("es"):
        spanish = text(admin_client.get(url, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode())
    assert "ningún trabajo ha terminado desde" in spanish.lower(), spanish[:3000]
    # Gone once a cluster runs again, and the page's poll takes the change (it answered 204,
    # unchanged, for as long as the delete's own fields were the same).
    polled = html.unescape(re.search(r'hx-get="[^"?]*\?v=([^"]*)"', admin_client.get(url, **HOST).content.decode()).group(1))
    from urllib.parse import unquote

    assert admin_client.get(url, {"v": unquote(polled)}, HTTP_HX_REQUEST="true", **HOST).status_code == 204
    cluster_runs()
    page = text(admin_client.get(url, **HOST).content.decode())
    assert "cannot be reached" in page and "Waiting for this console" not in page and "Waiting on: the engine" in page
    assert api.get(f"/api/v1/bound-deletes/{op.public_id}").json()["waiting_on"] == "engine"
    assert admin_client.get(url, {"v": unquote(polled)}, HTTP_HX_REQUEST="true", **HOST).status_code == 200
