"""Search finds what people type: any case, any accents, the same on SQLite and PostgreSQL."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Concat
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from lifecycle.models import Account, Computer, Conversation, Scope
from lifecycle.search import fold
from lifecycle.seeding import Seeder
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}

TITLES = {
    "ecole": "École d'été à Genève",
    "ubersicht": "Übersicht der Änderungen",
    "greek": "Ελληνικά: σημειώσεις συνάντησης",
    "strasse": "Straße und Plätze",
    "cyrillic": "Отчёт о сборке",
    "percent": "100% done_now",
    "kana": "がっこう schedule",
}


@pytest.fixture
def titled(db) -> dict[str, Conversation]:
    account = factories.make_account()
    return {key: factories.make_conversation(account, title=title) for key, title in TITLES.items()}


def found(text: str) -> set[str]:
    titles = {title: key for key, title in TITLES.items()}
    return {titles.get(c.title, c.title) for c in Conversation.objects.search(text)}


def test_it_folds_case_accents_and_compatibility_forms():
    assert fold("École") == fold("ecole") == fold("ÉCOLE") == "ecole"
    assert fold("ÜBERSICHT") == "ubersicht"
    assert fold("ΕΛΛΗΝΙΚΆ") == fold("ελληνικά") == "ελληνικα"
    assert fold("Straße") == fold("STRASSE") == "strasse"
    assert fold("ﬁle Ｆｕｌｌ") == "file full"
    assert fold("İstanbul") == fold("Istanbul") == "istanbul"
    assert fold("Łódź Øresund Æther") == "lodz oresund aether"
    assert fold("ΟΔΟΣ") == fold("οδος") == fold("οδοσ")  # final sigma is a sigma
    assert fold("が") != fold("か")  # a voicing mark changes the letter: kept
    assert fold("  two\t\nwords ") == "two words"
    for text in TITLES.values():
        assert fold(fold(text)) == fold(text)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("école", {"ecole"}),
        ("ecole", {"ecole"}),
        ("ÉCOLE", {"ecole"}),
        ("geneve", {"ecole"}),
        ("übersicht", {"ubersicht"}),
        ("UBERSICHT", {"ubersicht"}),
        ("änderungen", {"ubersicht"}),
        ("ελληνικά", {"greek"}),
        ("ΕΛΛΗΝΙΚΑ", {"greek"}),
        ("ΣΗΜΕΙΩΣΕΙΣ", {"greek"}),
        ("strasse", {"strasse"}),
        ("STRASSE", {"strasse"}),
        ("straße", {"strasse"}),
        ("ОТЧЕТ", {"cyrillic"}),
        ("%", {"percent"}),
        ("e_n", {"percent"}),
        ("が", {"kana"}),
        ("か", set()),
        ("  ecole   d'ete ", {"ecole"}),
    ],
)
def test_it_matches_titles_ignoring_case_and_accents(titled, query, expected):
    assert found(query) == expected


def test_it_matches_thread_ids_but_never_across_title_and_thread_id(db):
    conv = factories.make_conversation(title="Alpha", thread_id="THR_Äbc_01")
    assert found("thr_abc") == {"Alpha"}
    assert found("äBC_0") == {"Alpha"}
    assert found("alpha thr") == set()
    assert (conv.search_title, conv.search_thread) == ("alpha", "thr_abc_01")


def folded(conv: Conversation) -> tuple[str, str]:
    stored = Conversation.objects.get(pk=conv.pk)
    return stored.search_title, stored.search_thread


def test_it_keeps_the_search_columns_in_step_on_every_write(db):
    account = factories.make_account()
    conv = factories.make_conversation(account, title="Before")

    conv.title = "Café society"
    conv.save(update_fields=["title"])
    assert folded(conv) == ("cafe society", fold(conv.thread_id))
    conv.thread_id = "THR_Ωmega"
    conv.save(update_fields=["thread_id"])
    assert folded(conv) == ("cafe society", "thr_ωmega")
    assert found("ΩMEGA") == {"Café society"}

    Conversation.objects.filter(pk=conv.pk).update(title="Ünïcode")
    assert found("unicode") == {"Ünïcode"}
    assert found("cafe") == set()

    created = Conversation.objects.bulk_create(
        [Conversation(scope=Scope.BOUND, account=account, thread_id=f"thr_bulk_{n}", title=f"Bulk Ärger {n}")
         for n in range(3)]
    )
    assert found("arger") == {"Bulk Ärger 0", "Bulk Ärger 1", "Bulk Ärger 2"}

    for row in created:
        row.title = row.title.replace("Ärger", "Œuvre")
    Conversation.objects.bulk_update(created, ["title"])
    assert found("oeuvre") == found("ŒUVRE") == {"Bulk Œuvre 0", "Bulk Œuvre 1", "Bulk Œuvre 2"}

    # An update by expression folds what it stored.
    Conversation.objects.filter(pk=conv.pk).update(title=Concat(Value("Ñandú "), "thread_id"))
    assert folded(conv) == ("nandu thr_ωmega", "thr_ωmega")

    # Erasing a title (what a tombstone does) erases its folded copy in the same statement,
    # and leaves the conversation findable by thread id.
    with CaptureQueriesContext(connection) as queries:
        Conversation.objects.filter(pk=conv.pk).update(title="")
    assert len([q for q in queries if q["sql"].startswith("UPDATE")]) == 1
    assert folded(conv) == ("", "thr_ωmega")
    assert found("nandu") == set() and found("omega") == set() and found("ωmega") == {""}


def test_the_seeder_and_the_data_migration_fill_the_column(db, engine_home):
    from lifecycle.enginefs import EngineHome

    Seeder(seed=3, anchor=timezone.now(), messages=4, home=EngineHome(engine_home)).run(6)
    rows = list(Conversation.objects.all())
    assert rows and all((r.search_title, r.search_thread) == (fold(r.title), fold(r.thread_id)) for r in rows)

    # Rows written before the columns existed are filled by the migration.
    Conversation.objects.update(search_title=None, search_thread=None)
    assert not Conversation.objects.search(rows[0].title).exists()
    migration = importlib.import_module("lifecycle.migrations.0003_conversation_search_columns")
    migration.fill(apps, type("Editor", (), {"connection": connection})())
    assert all((r.search_title, r.search_thread) == (fold(r.title), fold(r.thread_id))
               for r in Conversation.objects.all())


def test_the_list_and_the_api_search_the_same_way(member_client, titled):
    page = member_client.get("/conversations/?q=ECOLE", **HX).content.decode()
    assert "École d&#x27;été à Genève" in page and "Übersicht" not in page
    api = member_client.get("/v1/threads?q=%C3%BCbersicht", **HOST).json()["results"]
    assert [r["title"] for r in api] == [TITLES["ubersicht"]]


def test_it_treats_an_empty_or_blank_query_as_no_filter(db):
    factories.make_conversation(Account.objects.create(name="A"), title="Anything")
    assert Conversation.objects.search("   ").count() == Conversation.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_owners_named_before_their_folded_names_existed_are_found_after_the_migration():
    """0027 folds the names of the owners already there (the Owner finder searches the folded
    names: an owner left without one would never be found)."""
    from django.db.migrations.executor import MigrationExecutor

    def migrate(target: str):
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate([("lifecycle", target)])
        return executor.loader.project_state([("lifecycle", target)]).apps

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        old = migrate("0026_item_client_key_digest")
        account = old.get_model("lifecycle", "Account").objects.create(name="ÑANDÚ Álvarez")
        computer = old.get_model("lifecycle", "Computer").objects.create(name="École Straße")
        migrate("0027_owner_search_name")
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(latest)
    assert Account.objects.get(pk=account.pk).search_name == "nandu alvarez"
    assert Computer.objects.get(pk=computer.pk).search_name == "ecole strasse"
    renamed = Account.objects.filter(pk=account.pk)
    renamed.update(name="Über GmbH")
    assert renamed.get().search_name == "uber gmbh"
