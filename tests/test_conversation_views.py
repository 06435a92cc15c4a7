from __future__ import annotations

import re

import pytest

from lifecycle.models import Account
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}


def test_it_sends_anonymous_visitors_to_the_login_page(client, conversation):
    for url in ("/conversations/", f"/conversations/{conversation.public_id}/", "/settings/system/data-storage/"):
        response = client.get(url, **HOST)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")


def test_it_signs_in_through_the_login_form(client, admin_user):
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-for-tests"}, **HOST)
    assert response.status_code == 302
    assert client.get("/conversations/", **HOST).status_code == 200
    wrong = client.post("/accounts/login/", {"username": "alice", "password": "nope"}, **HOST)
    assert wrong.status_code == 200 and b"do not match" in wrong.content


def test_it_renders_the_whole_page_or_only_the_results_for_htmx(member_client, conversation):
    full = member_client.get("/conversations/", **HOST)
    assert full.status_code == 200 and b"<html" in full.content and b"Fix flaky login test" in full.content
    fragment = member_client.get("/conversations/", **HX)
    assert fragment.status_code == 200
    assert b"<html" not in fragment.content
    assert fragment.content.strip().startswith(b'<section id="results"')
    assert b"Fix flaky login test" in fragment.content


def test_it_filters_by_tab_owner_and_search(member_client):
    account, computer = factories.make_account("Acme"), factories.make_computer("box")
    factories.make_conversation(account, title="Recent deploy")
    factories.make_conversation(account, title="Archived deploy", archived=True)
    factories.make_conversation(computer, title="Closed build", closed=True)
    factories.make_conversation(computer, title="Local notes")

    def titles(query):
        content = member_client.get("/conversations/?" + query, **HX).content.decode()
        return {t for t in ("Recent deploy", "Archived deploy", "Closed build", "Local notes") if t in content}

    assert titles("") == {"Recent deploy", "Local notes"}
    assert titles("view=archived") == {"Archived deploy"}
    assert titles("view=closed") == {"Closed build"}
    assert titles(f"owner=computer:{computer.pk}") == {"Local notes"}
    assert titles(f"owner=account:{account.pk}&view=archived") == {"Archived deploy"}
    assert titles("q=deploy") == {"Recent deploy"}
    assert titles("view=nonsense&owner=planet:x") == {"Recent deploy", "Local notes"}
    assert titles("owner=account:%C2%B2") == {"Recent deploy", "Local notes"}
    # r82: the box takes what the list searches for (200 characters), not a paste the server cuts
    # without a word or the server refuses as a request line too long.
    page = member_client.get("/conversations/", **HOST).content.decode()
    assert re.search(r'<input id="q" type="search" name="q" value="" maxlength="200"', page)


def test_a_link_to_an_owner_that_is_not_here_lists_every_owner_and_says_so(member_client):
    account = factories.make_account("Acme")
    factories.make_conversation(account, title="Recent deploy")
    missing = account.pk + 100
    page = member_client.get(f"/conversations/?owner=account:{missing}", **HOST).content.decode()
    assert 'data-testid="unknown-owner"' in page and "Recent deploy" in page and "1 conversation" in page
    assert "selected" not in re.search(r'<select id="owner".*?</select>', page, re.S).group(0)
    known = member_client.get(f"/conversations/?owner=account:{account.pk}", **HOST).content.decode()
    assert 'data-testid="unknown-owner"' not in known and f'value="account:{account.pk}" selected' in known
    plain = member_client.get("/conversations/", **HOST).content.decode()
    assert 'data-testid="unknown-owner"' not in plain


def test_it_paginates_the_list(member_client):
    account = factories.make_account()
    for n in range(30):
        factories.make_conversation(account, title=f"Conv {n:02d}", days_idle=n)
    first = member_client.get("/conversations/", **HOST).content.decode()
    assert "Conv 00" in first and "Conv 24" in first and "Conv 25" not in first
    assert "Page 1 of 2" in first
    next_url = re.search(r'href="([^"]+)"[^>]*data-pager="next"', first).group(1).replace("&amp;", "&")
    second = member_client.get("/conversations/" + next_url, **HOST).content.decode()
    assert "Conv 25" in second and "Conv 29" in second and "Conv 24" not in second
    assert "Page 2 of 2" in second


def test_it_shows_a_transcript_with_a_row_per_tool_kind(member_client, conversation):
    factories.add_message(conversation, "user", "Please run the tests")
    factories.add_message(conversation, "assistant", "Running them now")
    payloads = {
        "shell": {"command": "pytest -q", "cwd": "/w", "exit_code": 1, "stdout": "1 failed", "stderr": ""},
        "read_file": {"path": "src/app.py", "line_count": 12, "content": "print('hi')"},
        "edit_file": {"changes": [{"path": "src/app.py", "change_type": "modify", "diff": "-a\n+b"}]},
        "search": {"query": "needle_term", "scope": "workspace", "file_count": 2, "matches": ["a.py", "b.py"]},
        "http": {"url": "https://example.test/x", "method": "GET", "status": 418, "response": "not here"},
        "generic": {"tool_name": "lint_tool", "input": {}, "output": "clean"},
        "plan": {"steps": [{"text": "Write the fix", "done": False}]},
    }
    for kind, payload in payloads.items():
        factories.add_tool(conversation, kind, payload, title=f"{kind} call")
    content = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    for expected in ("Please run the tests", "Running them now", "pytest -q", "Exit code", "src/app.py",
                     "needle_term", "Files found", "GET https://example.test/x", "<code><bdi>418</bdi></code>", "lint_tool",
                     "Write the fix",
                     "kind-shell", "kind-read_file", "kind-edit_file", "kind-search", "kind-http", "kind-generic"):
        assert expected in content, expected
    assert "Lifecycle actions are for admins only." in content


def test_show_full_output_names_the_outputs_own_size(member_client, conversation):
    # A 700-character output beside a 98 KB input: the button tells the output's size.
    factories.add_tool(conversation, "generic", {"tool_name": "lint", "input": "x" * 98_000, "output": "é" * 700})
    page = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert "Show full output (1.4\xa0KB)" in page


def test_it_loads_large_outputs_on_demand(member_client, conversation):
    big = "line of output\n" * 400
    item = factories.add_tool(conversation, payload={"command": "cat big", "cwd": "/", "exit_code": 0, "stdout": big})
    page = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert big not in page and "Show full output" in page
    url = f"/conversations/{conversation.public_id}/items/{item.pk}/output/"
    fragment = member_client.get(url, **HX).content.decode()
    assert big.strip() in fragment and "<html" not in fragment
    full = member_client.get(url, **HOST).content.decode()
    assert "<html" in full and big.strip() in full


def test_it_pages_long_transcripts(member_client, conversation):
    for n in range(55):
        factories.add_message(conversation, content=f"message number {n}.")
    first = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert "message number 49." in first and "message number 50." not in first
    assert "Show later messages" in first
    more = member_client.get(f"/conversations/{conversation.public_id}/?after=50", **HX).content.decode()
    assert "message number 50." in more and "message number 54." in more and "<html" not in more
    assert "message number 49." not in more and "Show later messages" not in more
    assert 'data-testid="earlier-left-out"' not in more and 'data-testid="earlier-left-out"' not in first
    # The same link followed without the script: a whole page that says what it leaves out.
    page = member_client.get(f"/conversations/{conversation.public_id}/?after=50", **HOST).content.decode()
    assert "message number 50." in page and "message number 49." not in page
    assert "The first 50 messages are not shown on this page." in page
    assert f'href="/conversations/{conversation.public_id}/#transcript-h"' in page


def test_it_answers_404_for_unknown_conversations_and_items(member_client, conversation):
    assert member_client.get("/conversations/c_nope/", **HOST).status_code == 404
    other = factories.add_message(factories.make_conversation())
    url = f"/conversations/{conversation.public_id}/items/{other.pk}/output/"
    assert member_client.get(url, **HOST).status_code == 404
    # A message of this conversation has no tool output: 404, not an empty output page.
    message = factories.add_message(conversation, content="Just a message.")
    url = f"/conversations/{conversation.public_id}/items/{message.pk}/output/"
    assert member_client.get(url, **HOST).status_code == 404
    assert member_client.get(url, **HX).status_code == 404


def test_it_lists_the_conversations_subagents_with_localized_states(member_client, conversation, engine_home):
    from lifecycle.enginefs import EngineHome

    other = factories.make_conversation()
    EngineHome().update_fleet(lambda rows: [
        {"agent_id": "sa_mine", "origin": {"conversation": conversation.public_id}, "status": "completed"},
        {"agent_id": "sa_theirs", "origin": {"conversation": other.public_id}, "status": "running"},
        {"agent_id": "sa_legacy", "origin": None, "status": "completed"},
    ])
    english = member_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
    assert "sa_mine" in english and "Completed" in english
    assert "sa_theirs" not in english and "sa_legacy" not in english
    spanish = member_client.get(f"/conversations/{conversation.public_id}/", HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert "Completado" in spanish.content.decode()


def test_it_renders_localized_error_pages(member_client, client):
    missing = member_client.get("/conversations/c_nope/", **HOST)
    assert missing.status_code == 404 and "Not found" in missing.content.decode()
    spanish = member_client.get("/conversations/c_nope/", HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert spanish.status_code == 404 and "No encontrado" in spanish.content.decode()
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    expired = strict.post("/accounts/login/", {"username": "x", "password": "y"}, **HOST)
    assert expired.status_code == 403 and "Form expired" in expired.content.decode()


def test_it_answers_htmx_history_restores_with_the_whole_page(member_client, conversation):
    restore = member_client.get(
        "/conversations/?q=flaky", HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HX
    )
    assert restore.status_code == 200
    content = restore.content.decode()
    assert "<html" in content and 'class="sidenav"' in content and "Fix flaky login test" in content
    # Caches must keep the page and the fragment of one address apart.
    assert {"HX-Request", "HX-History-Restore-Request"} <= {v.strip() for v in restore["Vary"].split(",")}


def test_the_same_search_again_adds_no_history_entry(member_client, conversation):
    url = "/conversations/?view=recent&owner=&q=flaky"
    again = member_client.get(url, HTTP_HX_CURRENT_URL="http://127.0.0.1" + url, **HX)
    assert again["HX-Push-Url"] == "false"
    new = member_client.get(url, HTTP_HX_CURRENT_URL="http://127.0.0.1/conversations/", **HX)
    assert "HX-Push-Url" not in new
    for unreadable in ("http://[", "http://[::1", "http://127.0.0.1:99999999/"):  # r51: a 500
        answer = member_client.get(url, HTTP_HX_CURRENT_URL=unreadable, **HX)
        assert answer.status_code == 200 and "HX-Push-Url" not in answer, unreadable
        assert 'id="results"' in answer.content.decode()


def test_titles_are_shown_isolated_with_their_invisible_characters_written_out(admin_client):
    """A title with a right-to-left override ("Invoice <RLO>FDP.exe" shows as "Invoice exe.PDF")
    or a zero-width space could pass for another name, on the page that deletes it for good."""
    spoof = factories.make_conversation(title="Invoice \u202eFDP.exe")
    hidden = factories.make_conversation(title="Re\u200bport \u2066x\u2069")
    arabic = factories.make_conversation(title="\u062a\u0642\u0631\u064a\u0631\u200f 2026")  # a plain RLM stays
    pages = {
        "list": admin_client.get("/conversations/", **HOST).content.decode(),
        "detail": admin_client.get(f"/conversations/{spoof.public_id}/", **HOST).content.decode(),
        "delete": admin_client.get(f"/conversations/{spoof.public_id}/delete/", **HOST).content.decode(),
    }
    for name, page in pages.items():
        assert "\u202e" not in page, name
        assert "<bdi>Invoice [U+202E]FDP.exe</bdi>" in page, name
    assert "<title>Invoice [U+202E]FDP.exe" in pages["detail"]
    assert "Delete “<bdi>Invoice [U+202E]FDP.exe</bdi>”?" in pages["delete"]
    assert "<bdi>Re[U+200B]port [U+2066]x[U+2069]</bdi>" in pages["list"]
    assert f"<bdi>{arabic.title}</bdi>" in pages["list"]
    assert hidden.title == "Re\u200bport \u2066x\u2069"  # shown written out, stored as it came



def test_ids_owner_names_and_tool_summaries_are_shown_with_their_invisible_characters_written_out(admin_client):
    """The same spoof through what the runtime names besides titles: a thread id on the Delete
    page ("thr<RLO>gnitset"), an owner's name, a claim's label, a command in a tool summary."""
    from lifecycle.models import RuntimeClaim

    owner = factories.make_account(name="Acme \u202eliame")
    conversation = factories.make_conversation(owner, thread_id="thr\u202egnitset", title="Plain")
    factories.add_tool(conversation, payload={"command": "rm \u202etxt.exe", "cwd": "/w", "exit_code": 0,
                                              "stdout": "ok", "stderr": ""})
    RuntimeClaim.objects.create(conversation=conversation, kind="task", label="task \u202eowned")
    pages = {
        "list": admin_client.get("/conversations/", **HOST).content.decode(),
        "detail": admin_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode(),
        "delete": admin_client.get(f"/conversations/{conversation.public_id}/delete/", **HOST).content.decode(),
    }
    for name, page in pages.items():
        assert "<bdi>thr[U+202E]gnitset</bdi>" in page, name
        assert "<bdi>Acme [U+202E]liame</bdi>" in page, name
    assert "<option value=" in pages["list"] and ">Acme [U+202E]liame</option>" in pages["list"]
    assert "<bdi>rm [U+202E]txt.exe</bdi>" in pages["detail"]
    assert "<bdi>task [U+202E]owned</bdi>" in pages["detail"]
    for name, page in pages.items():
        # what is left raw is inside attribute values and form fields only (never shown as text)
        shown = re.sub(r'<[^>]*>', "", page)
        assert "\u202e" not in shown, name


def test_it_counts_a_long_transcript_only_up_to_a_cap_and_says_more_than(member_client, conversation, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from lifecycle import runtime_status

    monkeypatch.setattr(runtime_status, "COUNT_CAP", 5)
    for n in range(4):
        factories.add_message(conversation, content=f"message number {n}.")
    url = f"/conversations/{conversation.public_id}/"
    page = member_client.get(url, **HOST).content.decode()
    assert "<dt>Messages</dt><dd>4</dd>" in page
    for n in range(4, 60):
        factories.add_message(conversation, content=f"message number {n}.")
    with CaptureQueriesContext(connection) as captured:
        page = member_client.get(url, **HOST).content.decode()
    assert "<dt>Messages</dt><dd>More than 5</dd>" in page
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"] and "lifecycle_item" in q["sql"]]
    assert counts and all("LIMIT 6" in sql for sql in counts)  # never every row of the conversation
    later = member_client.get(f"{url}?after=50", **HOST).content.decode()
    assert "More than 5 earlier messages are not shown on this page." in later and "message number 50." in later
    few = member_client.get(f"{url}?after=3", **HOST).content.decode()
    assert "The first 3 messages are not shown on this page." in few


def test_past_a_hundred_owners_the_owner_list_is_narrowed_by_name(member_client, monkeypatch):
    """r78: every account and computer was an option (536 KB of a 625 KB page at 8,000 owners).
    Past OWNER_CHOICES the list offers that many, a "Find an owner" field narrows it by name (as
    it is typed, or with Apply), and the chosen owner is always among the options."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from lifecycle import views

    monkeypatch.setattr(views, "OWNER_CHOICES", 3)
    accounts = [factories.make_account(f"Acct {n}") for n in range(4)]
    north = factories.make_computer("north-box")
    chosen = accounts[3]
    factories.make_conversation(chosen, title="Chosen one's")

    def options(page: str) -> list[str]:
        start = page.index('<select id="owner"')
        select = page[start:page.index("</select>", start)]
        return re.findall(r'<option value="([^"]+)"', select)

    page = member_client.get("/conversations/", **HOST).content.decode()
    assert options(page) == [a.owner_key for a in accounts[:3]]
    assert 'id="owner-find"' in page and "Listing 3 of 5 owners: type part of a name to find the others." in page
    narrowed = member_client.get("/conversations/?owner_find=NORTH", **HOST).content.decode()  # Apply
    assert options(narrowed) == [north.owner_key] and "1 owner has “NORTH” in its name." in narrowed
    # The chosen owner is always an option, selected, and its conversations listed
    page = member_client.get(f"/conversations/?owner={chosen.owner_key}&owner_find=north", **HOST).content.decode()
    assert options(page) == [chosen.owner_key, north.owner_key] and "Chosen one&#x27;s" in page
    assert f'<option value="{chosen.owner_key}" selected>' in page
    assert "1 owner has “north” in its name." in page  # r79: the chosen owner, offered, was counted a match
    nothing = member_client.get(f"/conversations/?owner={chosen.owner_key}&owner_find=zzz", **HOST).content.decode()
    assert options(nothing) == [chosen.owner_key] and "No owner has “zzz” in its name." in nothing
    # As it is typed: the options alone, with the note out of band; a query per kind, whatever the count
    with CaptureQueriesContext(connection) as seen:
        part = member_client.get("/conversations/?owner_options=1&owner_find=acct", HTTP_HX_REQUEST="true",
                                 **HOST).content.decode()
    assert options("<select id=\"owner\">" + part + "</select>") == [a.owner_key for a in accounts[:3]]
    # r105: only its words, into the live region already in the page (a region put in whole is not read out)
    assert 'id="owner-find-note" hx-swap-oob="innerHTML"' in part and "Listing the first 3 owners with “acct”" in part
    assert "<form" not in part and len([q for q in seen.captured_queries if "lifecycle_" in q["sql"]]) <= 5
    none = member_client.get("/conversations/?owner_options=1&owner_find=zzz", HTTP_HX_REQUEST="true", **HOST)
    assert "No owner has “zzz” in its name." in none.content.decode()
    spanish = member_client.get("/conversations/", HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Buscar un propietario" in spanish and "Se muestran 3 de 5 propietarios" in spanish


def test_the_owner_finder_ignores_case_and_accents_the_same_on_both_databases(member_client, monkeypatch):
    """Names as the conversation search compares them (r95: on SQLite "ñandú" found nothing,
    LIKE folding ASCII only; on neither database did "alvarez" find "Álvarez"), and offered in
    the order people read them, lower case among upper case."""
    from lifecycle import views

    monkeypatch.setattr(views, "OWNER_CHOICES", 3)
    for n in range(4):
        factories.make_account(f"Filler {n}")
    nandu = factories.make_account("ÑANDÚ Álvarez")
    ecole = factories.make_computer("École Straße")
    izmir = factories.make_account("İZMİR Ltd")

    def options(page: str) -> list[str]:
        start = page.index('<select id="owner"')
        return re.findall(r'<option value="([^"]+)"', page[start:page.index("</select>", start)])

    for typed, found in [("ñandú", [nandu]), ("Ñandú", [nandu]), ("nandu", [nandu]), ("ALVAREZ", [nandu]),
                         ("école", [ecole]), ("ECOLE", [ecole]), ("strasse", [ecole]), ("izmir", [izmir]),
                         ("Á", [nandu, ecole]), ("zz", [])]:
        page = member_client.get(f"/conversations/?owner_find={typed}", **HOST).content.decode()
        assert (typed, options(page)) == (typed, [o.owner_key for o in found])
    many = member_client.get("/conversations/?owner_find=filler", **HOST).content.decode()
    assert options(many) == [Account.objects.get(name=f"Filler {n}").owner_key for n in range(3)]


def test_a_few_owners_are_offered_in_reading_order(member_client):
    names = ["zulu labs", "Ángela SA", "abeja srl", "Zeta Corp", "Beta"]
    owners = {name: factories.make_account(name) for name in names}
    page = member_client.get("/conversations/", **HOST).content.decode()
    start = page.index('<select id="owner"')
    shown = re.findall(r'<option value="([^"]+)"', page[start:page.index("</select>", start)])
    assert shown == [owners[n].owner_key for n in ["abeja srl", "Ángela SA", "Beta", "Zeta Corp", "zulu labs"]]


def test_a_few_owners_are_all_offered_without_a_finder(member_client):
    owners = [factories.make_account(f"A{n}") for n in range(3)]
    page = member_client.get("/conversations/", **HOST).content.decode()
    assert 'id="owner-find"' not in page and all(f'value="{o.owner_key}"' in page for o in owners)
