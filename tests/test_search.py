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


# Invisible characters (r123) -----------------------------------------------------------------

def test_it_drops_the_default_ignorable_code_points():
    """Zero-width spaces and joiners, the soft hyphen, the byte order mark, direction marks,
    embeddings and isolates, variation selectors, tags: nothing shows them, so search ignores
    them, in a stored title and in a query alike."""
    assert fold("Pro\u200bject\u200d alpha\ufeff") == "project alpha"
    assert fold("Dra\u200dft") == fold("Dra\u00adft") == fold("Dra\u200cft") == fold("Dra\u2060ft") == "draft"
    assert fold("\u200fשלום\u200e \u202bעולם\u202c \u2067x\u2069 \u061cم") == "שלום עולם x م"
    assert fold("a\u034fb \u180ec") == "ab c"
    assert fold("\u2764\ufe0f") == fold("\u2764") and fold("\U0001f469\u200d\U0001f4bb") == "\U0001f469\U0001f4bb"
    assert fold("\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f") == "\U0001f3f4"
    assert fold("a \u200b b") == "a b" and fold("\u200b\ufeff") == ""
    assert fold("\u0600\u0661") == "\u0600\u0661"  # a format character that is drawn (an Arabic number sign)


def test_invisible_characters_neither_hide_a_title_nor_a_query(member_client, db):
    account = factories.make_account()
    hidden = factories.make_conversation(account, title="Pro\u200bject\u200d alpha\ufeff")
    draft = factories.make_conversation(account, title="Draft release notes")
    coder = factories.make_conversation(account, title="\U0001f469\u200d\U0001f4bb laptop script")
    factories.make_conversation(account, title="Something else")
    assert folded(hidden)[0] == "project alpha"
    for query, expected in [("project", {hidden}), ("PROJECT ALPHA", {hidden}), ("pro\u200bject", {hidden}),
                            ("Dra\u200dft", {draft}), ("Dra\u00adft", {draft}), ("\ufeffdraft\u200e", {draft}),
                            ("Draft", {draft}), ("\U0001f469\u200d\U0001f4bb", {coder}), ("\u200b", None)]:
        matched = set(Conversation.objects.search(query))
        assert matched == (expected if expected is not None else set(Conversation.objects.all())), query
    # The list and the API the same way
    page = member_client.get("/conversations/?q=project", **HX).content.decode()
    assert "Pro[U+200B]ject" in page and "Draft release notes" not in page
    api = member_client.get("/v1/threads", {"q": "Dra\u200dft"}, **HOST).json()["results"]
    assert [r["title"] for r in api] == ["Draft release notes"]


def test_the_owner_finder_ignores_invisible_characters(db):
    from lifecycle.views import _named

    hidden = factories.make_account("Nort\u200bhwind\u00ad Ltd")
    plain = factories.make_computer("Build box")
    assert Account.objects.get(pk=hidden.pk).search_name == "northwind ltd"
    assert [o.pk for o in _named(Account, fold("northwind"), 10)] == [hidden.pk]
    assert [o.pk for o in _named(Computer, fold("Bu\u200dild"), 10)] == [plain.pk]


def test_the_migration_folds_the_stored_columns_again_but_not_a_fenced_title(db):
    """0028 folds again what an earlier fold stored (invisible characters kept in it), leaving a
    conversation behind the delete fence its folded title (the fence refuses a new one)."""
    from lifecycle.models import DeletionFence

    account = factories.make_account("Nort\u200bhwind")
    live = factories.make_conversation(account, title="Pro\u200bject alpha", thread_id="thr\u200d_01")
    fenced = factories.make_conversation(account, title="Pro\u200bject beta", thread_id="thr\u200d_02")
    plain = factories.make_conversation(account, title="Plain", thread_id="thr_03")
    # As the earlier fold stored them: the invisible characters kept
    for conv in (live, fenced):
        Conversation.objects.filter(pk=conv.pk).update(search_title=conv.title.casefold(),
                                                       search_thread=conv.thread_id.casefold())
    Account.objects.filter(pk=account.pk).update(search_name="nort\u200bhwind")
    DeletionFence.objects.create(conversation_id=fenced.pk, operation_id=0)
    Conversation.objects.filter(pk=fenced.pk).update(state="pending_delete")
    assert not Conversation.objects.search("project").exists()

    from tests.migrated import run_data_migration

    run_data_migration("lifecycle", "0028_refold_ignorable_characters", "refold")
    assert folded(live) == ("project alpha", "thr_01") and folded(plain) == ("plain", "thr_03")
    assert folded(fenced) == ("pro\u200bject beta", "thr_02")
    assert [c.pk for c in Conversation.objects.search("project")] == [live.pk]
    assert [c.pk for c in Conversation.objects.search("thr_02")] == [fenced.pk]
    assert Account.objects.get(pk=account.pk).search_name == "northwind"
