from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from insight.models import (
    HISTORY_DAYS,
    ConversationSize,
    DailySize,
    Measurement,
    OwnerSize,
    ToolKindSize,
)
from insight.schedules import ensure_schedules
from insight.tasks import engine_bytes_by_key, measure_storage
from lifecycle.enginefs import EngineHome
from lifecycle.models import Conversation, Item
from retention.storage import database_size
from tests import factories
from tests.permissions import unreadable
from tests.swapping import attempts_until, swapping
from tests.test_jobs import ROOT, database_url

HOST = {"HTTP_HOST": "127.0.0.1"}
PAGE = "/settings/system/data-storage/"
MEASURE = PAGE + "storage-insight/measure/"


def stored_db_bytes(conversation: Conversation) -> int:
    """Computed here from the stored rows, independently of the job's SQL."""
    return sum(len(i.content.encode()) + len(i.title.encode()) + i.payload_bytes
               for i in Item.objects.filter(conversation=conversation))


def chart_svg(page: str) -> str:
    start = page.rindex("<svg", 0, page.index('data-testid="size-chart"'))
    return page[start:page.index("</svg>", start)]


def build_fleet():
    """Two accounts' conversations and one computer's, with items and real engine files."""
    home = EngineHome()
    north, south = factories.make_account("Northwind"), factories.make_account("Southwind")
    laptop = factories.make_computer("laptop")
    big = factories.make_conversation(north, title="Big one")
    factories.add_message(big, content="héllo wörld")  # non-ASCII: bytes, not characters
    factories.add_tool(big)
    factories.add_tool(big, kind="read_file", payload={"path": "/a", "content": "y" * 5000})
    home.write_atomic(home.events_path(big.storage_key), b"e" * 1000)
    home.write_atomic(home.artifacts_dir(big.storage_key) / "out.txt", b"a" * 4000)
    small = factories.make_conversation(north, title="Small one")
    factories.add_message(small, content="hi")
    local = factories.make_conversation(laptop, title="Local one")
    factories.add_tool(local, kind="http", payload={"url": "https://x", "status": 200, "body": "z" * 3000})
    home.write_atomic(home.events_path(local.storage_key), b"l" * 700)
    empty = factories.make_conversation(south, title="Nothing stored")
    # Engine files of no known conversation, and shared state: counted only in the total.
    home.write_atomic(home.events_path("c_" + "f" * 20), b"o" * 300)
    home.write_atomic(home.fleet_path, b'{"version":1,"agents":[]}')
    return {"north": north, "south": south, "laptop": laptop, "big": big, "small": small, "local": local,
            "empty": empty}


def expected_sizes(fleet) -> dict[int, tuple[int, int]]:
    home = EngineHome()
    return {c.pk: (stored_db_bytes(c), home.conversation_usage(c.storage_key)[1])
            for c in (fleet["big"], fleet["small"], fleet["local"], fleet["empty"])}


@pytest.mark.django_db
def test_it_measures_exact_sums_per_conversation_owner_and_tool_kind(engine_home):
    fleet = build_fleet()
    expected = expected_sizes(fleet)
    assert expected[fleet["big"].pk][1] == 5000 and expected[fleet["local"].pk][1] == 700
    assert expected[fleet["big"].pk][0] > 13 + 5000  # "héllo wörld" is 13 bytes, 11 characters
    result = measure_storage()

    stored = {r.conversation_id: (r.db_bytes, r.engine_bytes, r.total_bytes) for r in ConversationSize.objects.all()}
    assert stored == {pk: (db, engine, db + engine) for pk, (db, engine) in expected.items()}
    assert stored[fleet["empty"].pk] == (0, 0, 0)  # nothing stored: a row of zeros (a delete since subtracts it)
    big, small, local = (expected[fleet[k].pk] for k in ("big", "small", "local"))
    owners = {(o.kind, o.owner_id): (o.conversations, o.db_bytes, o.engine_bytes, o.total_bytes)
              for o in OwnerSize.objects.all()}
    assert owners == {
        ("account", fleet["north"].pk): (2, big[0] + small[0], big[1], sum(big) + sum(small)),
        ("account", fleet["south"].pk): (1, 0, 0, 0),
        ("computer", fleet["laptop"].pk): (1, local[0], local[1], sum(local)),
    }
    tools = Item.objects.filter(role="tool")
    kinds = {k.tool_kind: (k.items, k.payload_bytes, k.removable_bytes) for k in ToolKindSize.objects.all()}
    assert kinds == {kind: (tools.filter(tool_kind=kind).count(),
                            sum(i.payload_bytes for i in tools.filter(tool_kind=kind)),
                            sum(i.removable_bytes for i in tools.filter(tool_kind=kind)))
                     for kind in ("shell", "read_file", "http")}
    assert sum(k.removable_bytes for k in ToolKindSize.objects.all()) > 0  # the column is not all zeros

    m = Measurement.load()
    engine_files, engine_total = EngineHome().usage()
    assert (m.engine_files, m.engine_bytes) == (engine_files, engine_total)
    assert m.unattributed_engine_bytes == engine_total - big[1] - local[1] > 300
    assert m.payload_bytes == sum(i.payload_bytes for i in Item.objects.all())
    assert m.removable_bytes == sum(i.removable_bytes for i in Item.objects.all())
    assert m.text_bytes == sum(len(i.content.encode()) + len(i.title.encode()) for i in Item.objects.all())
    day = DailySize.objects.get()
    assert day.day == m.measured_at.date() == timezone.now().date()
    assert (day.engine_bytes, day.payload_bytes, day.removable_bytes) == (engine_total, m.payload_bytes,
                                                                          m.removable_bytes)
    assert day.database_bytes == m.database_bytes > 0
    assert result["conversations"] == 4 and result["engine_bytes"] == engine_total  # the empty one too


@pytest.mark.django_db
def test_measure_now_also_gives_the_engine_folder_figure_the_database_card_shows(engine_home, admin_client):
    """Data & storage showed two engine folder figures at once (the 15-minute measure's and
    Measure now's): a measurement updates the card's figure too, unless that one is newer."""
    from retention.models import StorageSnapshot
    from retention.tasks import measure_engine_folder

    build_fleet()
    measure_engine_folder()
    before = StorageSnapshot.load()
    files = [p for p in engine_home.rglob("*") if p.is_file()]
    files[0].unlink()  # the folder changes after the 15-minute measure
    result = measure_storage()
    after = StorageSnapshot.load()
    assert (after.engine_files, after.engine_bytes) == (before.engine_files - 1, result["engine_bytes"])
    assert after.measured_at > before.measured_at
    page = admin_client.get("/settings/system/data-storage/", HTTP_HOST="127.0.0.1").content.decode()
    assert page.count(f"{after.engine_files} files, ") >= 1 and f"{before.engine_files} files, " not in page
    # a newer 15-minute measure is not replaced by an older measurement's figures
    StorageSnapshot.objects.filter(id=1).update(measured_at=timezone.now() + timedelta(hours=1), engine_files=1)
    measure_storage()
    assert StorageSnapshot.load().engine_files == 1


@pytest.mark.django_db
def test_a_rerun_the_same_day_replaces_that_day_and_counts_nothing_twice(engine_home):
    fleet = build_fleet()
    measure_storage()
    first = DailySize.objects.get()
    factories.add_tool(fleet["small"], kind="search", payload={"query": "q", "results": ["r" * 900]})
    measure_storage()
    measure_storage()
    assert DailySize.objects.count() == 1
    day = DailySize.objects.get()
    assert day.pk == first.pk and day.payload_bytes == sum(i.payload_bytes for i in Item.objects.all())
    assert day.payload_bytes > first.payload_bytes
    assert ConversationSize.objects.count() == 4 and OwnerSize.objects.count() == 3
    assert ConversationSize.objects.get(conversation_id=fleet["small"].pk).db_bytes == stored_db_bytes(fleet["small"])
    assert Measurement.objects.count() == 1


@pytest.mark.django_db
def test_it_keeps_a_bounded_history(engine_home):
    today = timezone.now().date()
    DailySize.objects.bulk_create([DailySize(day=today - timedelta(days=n), measured_at=timezone.now(),
                                             database_bytes=n) for n in range(1, HISTORY_DAYS + 6)])
    measure_storage()
    days = list(DailySize.objects.values_list("day", flat=True))
    assert len(days) == HISTORY_DAYS
    assert days[0] == today - timedelta(days=HISTORY_DAYS - 1) and days[-1] == today


@pytest.mark.django_db
def test_a_deleted_conversation_drops_out_of_the_next_measurement(engine_home):
    fleet = build_fleet()
    measure_storage()
    Item.objects.filter(conversation=fleet["small"]).delete()
    Conversation.objects.filter(pk=fleet["small"].pk).update(state="deleted", title="")
    measure_storage()
    assert not ConversationSize.objects.filter(conversation_id=fleet["small"].pk).exists()
    assert OwnerSize.objects.get(kind="account", owner_id=fleet["north"].pk).conversations == 1


@pytest.mark.django_db
def test_it_creates_the_daily_schedule_once_by_name_and_heals_duplicates():
    ensure_schedules()
    ensure_schedules()
    assert Schedule.objects.filter(name="measure-storage").count() == 1
    Schedule.objects.create(name="measure-storage", func="old.func", schedule_type=Schedule.HOURLY)
    Schedule.objects.filter(name="measure-storage").update(func="old.func")
    ensure_schedules()
    schedule = Schedule.objects.get(name="measure-storage")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == ("insight.tasks.measure_storage",
                                                                         Schedule.DAILY, -1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_migrations_leave_one_schedule():
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def create() -> None:
        try:
            barrier.wait(timeout=10)
            ensure_schedules()
        except BaseException as error:  # reported below: a thread's exception would be lost
            errors.append(error)
        finally:
            connection.close()

    Schedule.objects.filter(name="measure-storage").delete()
    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert Schedule.objects.filter(name="measure-storage").count() == 1


@pytest.mark.django_db
def test_the_page_says_not_measured_yet_and_measures_nothing(admin_client, engine_home):
    build_fleet()
    page = admin_client.get(PAGE, **HOST).content.decode()
    assert "Not measured yet." in page and 'id="storage-insight"' in page
    assert 'action="/settings/system/data-storage/storage-insight/measure/"' in page
    assert not DailySize.objects.exists() and not ConversationSize.objects.exists()
    assert OrmQ.objects.count() == 0


@pytest.mark.django_db
def test_the_section_lists_the_largest_with_delete_and_cleanup_links(admin_client, engine_home):
    fleet = build_fleet()
    more = [factories.make_conversation(fleet["south"], title=f"Filler {n}") for n in range(21)]
    for n, c in enumerate(more):
        factories.add_message(c, content="m" * (10 + n))
    measure_storage()
    Conversation.objects.filter(pk=more[-1].pk).update(state="deleted")  # measured, then deleted
    page = admin_client.get(PAGE, **HOST).content.decode()
    section = page[page.index('data-testid="largest-conversations"'):page.index('data-testid="tool-kinds"')]
    links = re.findall(r'href="/conversations/(c_[0-9a-f]{20})/delete/"', section)
    assert len(links) == 20
    assert links[:3] == [fleet["big"].public_id, fleet["local"].public_id, more[-2].public_id]
    assert more[-1].public_id not in links
    kinds = page[page.index('data-testid="tool-kinds"'):page.index('data-testid="account-sizes"')]
    assert kinds.count('href="/settings/system/data-storage/#tool-card"') == 3
    assert kinds.index("Read file") < kinds.index("Web request") < kinds.index("Shell")
    assert "Northwind" in page and "laptop" in page
    assert "Measure now" in page


@pytest.mark.django_db
def test_a_conversation_deleted_after_the_measurement_leaves_its_owners_figures_at_once(admin_client, engine_home):
    """r53: the conversation list dropped it at once, its account kept counting it (and an owner
    all of whose conversations were deleted stayed listed) until the next measurement."""
    from insight.figures import _deleted_since, _owners
    from lifecycle.models import Account, Computer

    fleet = build_fleet()
    measure_storage()
    sizes = {c.pk: ConversationSize.objects.get(conversation_id=c.pk) for c in (fleet["big"], fleet["small"])}
    north = OwnerSize.objects.get(kind="account", owner_id=fleet["north"].pk)
    Conversation.objects.filter(pk__in=[fleet["small"].pk, fleet["local"].pk]).update(state="deleted", title="")
    [shown] = [row.size for row in _owners("account", Account, _deleted_since()) if row.size.owner_id == fleet["north"].pk]
    assert (shown.conversations, shown.db_bytes, shown.engine_bytes, shown.total_bytes) == (
        1, north.db_bytes - sizes[fleet["small"].pk].db_bytes, north.engine_bytes - sizes[fleet["small"].pk].engine_bytes,
        sizes[fleet["big"].pk].total_bytes)
    assert _owners("computer", Computer, _deleted_since()) == []  # its one conversation is deleted
    Conversation.objects.filter(pk=fleet["empty"].pk).update(state="deleted", title="")  # r58: measured empty
    assert [row.size.owner_id for row in _owners("account", Account, _deleted_since())] == [fleet["north"].pk]
    page = admin_client.get(PAGE, **HOST).content.decode()
    accounts = page[page.index('data-testid="account-sizes"'):page.index('data-testid="computer-sizes"')]
    assert "Northwind<" in accounts.replace("</bdi>", "<") and "· 1 conversation<" in accounts
    assert "No computer has conversations." in page
    # r55: the tool kinds' figures are the whole measurement's, and say they still count them
    assert "As measured: these figures do not follow the 3 conversations deleted since" in page
    measure_storage()
    assert 'data-testid="tool-kinds-deleted-since"' not in admin_client.get(PAGE, **HOST).content.decode()


@pytest.mark.django_db
def test_the_chart_has_a_point_for_each_day_in_each_series(admin_client, engine_home):
    today = timezone.now().date()
    DailySize.objects.bulk_create([DailySize(day=today - timedelta(days=n), measured_at=timezone.now(),
                                             database_bytes=1000 * n, engine_bytes=10 * n) for n in (1, 2, 5)])
    measure_storage()
    page = admin_client.get(PAGE, **HOST).content.decode()
    svg = chart_svg(page)
    assert "<title" in svg and "<desc" in svg and 'role="img"' in svg
    days = [(today - timedelta(days=n)).isoformat() for n in (5, 2, 1, 0)]
    for series in ("database_bytes", "engine_bytes", "payload_bytes"):
        group = svg[svg.index(f'data-series="{series}"'):]
        group = group[:group.index("</g>")]
        assert re.findall(r'data-day="([0-9-]+)"', group) == days
        points = re.findall(r"<polyline points=\"([0-9., ]+)\"", group)[0].split()
        assert len(points) == 4
        # x follows the date: days 5, 2, 1 and 0 ago sit at 0, 3/5, 4/5 and all of the width
        xs = [float(point.split(",")[0]) for point in points]
        assert [round((x - xs[0]) / (xs[-1] - xs[0]), 3) for x in xs] == [0, 0.6, 0.8, 1]
    table = page[page.index('data-testid="size-table"'):]
    assert table[:table.index("</table>")].count('<th scope="row">') == 4


@pytest.mark.django_db
@pytest.mark.parametrize("days", [1, 2])
def test_the_charts_days_are_said_to_be_utc_days_with_one_day_measured_too(admin_client, engine_home, days):
    """r67: with one day measured the caption gave the day alone, under a measured time shown
    in the viewer's zone (+14: the 7th above, the 6th below)."""
    today = timezone.now().date()
    if days == 2:
        DailySize.objects.create(day=today - timedelta(days=1), measured_at=timezone.now(), database_bytes=1)
    measure_storage()
    page = admin_client.get(PAGE, **HOST).content.decode()
    caption = page[page.index('<figcaption class="chart-scale'):]
    caption = " ".join(caption[:caption.index("</figcaption>")].split())
    assert ("(a day in UTC)" if days == 1 else "(days in UTC)") in caption


@pytest.mark.django_db
def test_figures_follow_the_viewers_locale_and_coordinates_stay_numbers(admin_client, engine_home):
    build_fleet()
    today = timezone.now().date()
    DailySize.objects.create(day=today - timedelta(days=1), measured_at=timezone.now(), database_bytes=3)
    measure_storage()
    page = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Almacenamiento" in page and "Medir ahora" in page and "Revisar eliminación" in page
    totals = page[page.index('data-testid="insight-totals"'):]
    totals = totals[:totals.index("</dl>")]
    assert re.search(r"\d,\d\xa0KB", totals), totals  # a decimal comma
    assert not re.search(r"\d\.\d\xa0KB", totals)
    svg = chart_svg(page)
    for value in re.findall(r'(?:cx|cy|y1|y2)="([^"]*)"', svg):
        assert re.fullmatch(r"[0-9]+(\.[0-9])?", value), value
    for value in re.findall(r'points="([^"]*)"', svg):
        assert re.fullmatch(r"[0-9.]+,[0-9.]+( [0-9.]+,[0-9.]+)*", value), value
    # every line of the scale with its unit, the bottom one too (r38: "línea inferior 0.")
    assert re.search(r"Línea superior [0-9,]+ \w+, línea central [0-9,]+ \w+, línea inferior 0 bytes\.", page)


@pytest.mark.django_db
def test_a_member_sees_it_read_only_and_cannot_measure(member_client, engine_home):
    build_fleet()
    measure_storage()
    page = member_client.get(PAGE, **HOST).content.decode()
    assert 'data-testid="largest-conversations"' in page and "Measure now" not in page
    assert 'data-testid="measure-admins-only"' in page  # r53: the note where the action would be
    response = member_client.post(MEASURE, **HOST)
    assert response.status_code == 403
    assert OrmQ.objects.count() == 0 and Measurement.load().requested_at is None


@pytest.mark.django_db
def test_an_admin_queues_one_measurement_and_sees_it_pending(admin_client, engine_home):
    response = admin_client.post(MEASURE, **HOST)
    assert response.status_code == 302 and response["Location"].endswith("/data-storage/")
    assert OrmQ.objects.count() == 1 and Measurement.load().pending
    admin_client.post(MEASURE, **HOST)  # a second press while one waits queues nothing more
    assert OrmQ.objects.count() == 1
    page = admin_client.get(PAGE, **HOST).content.decode()
    assert 'data-testid="insight-pending"' in page and "Not measured yet." in page
    measure_storage()
    assert not Measurement.load().pending
    assert 'data-testid="insight-pending"' not in admin_client.get(PAGE, **HOST).content.decode()


@pytest.mark.django_db
def test_the_measure_endpoint_only_takes_posts(admin_client):
    assert admin_client.get(MEASURE, **HOST).status_code == 405
    assert OrmQ.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_measurements_at_once_leave_one_complete_snapshot(engine_home):
    fleet = build_fleet()
    expected = expected_sizes(fleet)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            measure_storage()
        except BaseException as error:  # reported below: a thread's exception would be lost
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert {r.conversation_id: (r.db_bytes, r.engine_bytes) for r in ConversationSize.objects.all()} == expected
    assert OwnerSize.objects.count() == 3 and DailySize.objects.count() == 1 and Measurement.objects.count() == 1
    assert ToolKindSize.objects.count() == 3


KILL_POINTS = ["insight.read_database", "insight.read_engine", "insight.write", "insight.committed"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_measurement_killed_with_sigkill_leaves_the_last_snapshot_and_reruns_exactly(point, engine_home, tmp_path):
    fleet = build_fleet()
    measure_storage()
    before = sorted(ConversationSize.objects.values_list("conversation_id", "total_bytes"))
    factories.add_tool(fleet["small"], kind="search", payload={"query": "q", "results": ["r" * 900]})
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "LETHE_TEST_KILL_AT": point,
           "LETHE_TEST_KILL_DIR": str(kills)}
    connection.close()  # SQLite: let the other process write
    command = [sys.executable, "manage.py", "measure_storage"]
    killed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    after_kill = sorted(ConversationSize.objects.values_list("conversation_id", "total_bytes"))
    if point == "insight.committed":
        assert after_kill != before  # it had committed the new snapshot before it died
    else:
        assert after_kill == before  # nothing half-written
    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    expected = expected_sizes(fleet)
    stored = {r.conversation_id: (r.db_bytes, r.engine_bytes) for r in ConversationSize.objects.all()}
    assert stored == expected
    assert DailySize.objects.count() == 1
    assert DailySize.objects.get().payload_bytes == sum(i.payload_bytes for i in Item.objects.all())
    assert database_size().file_bytes > 0


@pytest.mark.parametrize("language", ["en", "es"])
def test_the_fast_size_format_matches_filesizeformat(language):
    from django.template.defaultfilters import filesizeformat
    from django.utils import translation

    from insight.chart import SizeFormat

    values = [0, 1, 1023, 1024, 1075, 1126, 10**6, 2**20 - 1, 2**20, 2**30 - 1, 2**30, 5 * 2**40 + 12345, 3 * 2**50]
    values += [int(1.37**n) for n in range(150)]
    with translation.override(language):
        size = SizeFormat()
        assert [size(v) for v in values] == [filesizeformat(v) for v in values]


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_measurement_on_a_real_cluster_leaves_it_pending_and_the_redelivery_finishes(
        engine_home, tmp_path):
    import time

    from insight.actions import FUNC, request_measurement
    from tests.test_erasure_crash import stop_group

    fleet = build_fleet()
    measure_storage()
    first = Measurement.load().measured_at
    before = sorted(ConversationSize.objects.values_list("conversation_id", "total_bytes"))
    factories.add_tool(fleet["local"], kind="search", payload={"query": "q", "results": ["r" * 900]})
    assert request_measurement() is True
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1",
           "LETHE_TEST_KILL_AT": "insight.write", "LETHE_TEST_KILL_DIR": str(kills)}
    connection.close()
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (kills / "insight.write").exists():
            time.sleep(0.3)
        assert (kills / "insight.write").exists(), "the worker never reached the kill point"
        time.sleep(2)  # the killed worker's transaction is rolled back; nothing new commits
        measurement = Measurement.load()
        assert measurement.pending and measurement.measured_at == first  # still pending, never shown done
        assert sorted(ConversationSize.objects.values_list("conversation_id", "total_bytes")) == before
        # The task waits for redelivery (the cluster's scheduler may have queued its own tasks
        # beside it by now; only the measurement's matters here).
        waiting = [q.pk for q in OrmQ.objects.all() if q.task.get("func") == FUNC]
        assert len(waiting) == 1
        # The broker redelivers once the task's lock expires (`retry`, 660 s): expire it now.
        OrmQ.objects.filter(pk__in=waiting).update(lock=timezone.now() - timedelta(seconds=1))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and Measurement.load().pending:
            time.sleep(0.3)
    finally:
        stop_group(cluster)
    assert not Measurement.load().pending
    stored = {r.conversation_id: (r.db_bytes, r.engine_bytes) for r in ConversationSize.objects.all()}
    assert stored == expected_sizes(fleet)
    assert DailySize.objects.count() == 1
    assert DailySize.objects.get().payload_bytes == sum(i.payload_bytes for i in Item.objects.all())


# ---- From an outside review: figures that were not what the page said ------------------------


def _totals(page: str) -> str:
    start = page.index('data-testid="insight-totals"')
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page[start:page.index("</dl>", start)]))


@pytest.mark.django_db
def test_a_missing_engine_folder_is_said_not_measured_not_empty(admin_client, engine_home, settings):
    home = EngineHome()
    conversation = factories.make_conversation(title="c")
    home.write_atomic(home.events_path(conversation.storage_key), b"e" * 10_000)
    measure_storage()
    assert Measurement.load().engine_bytes >= 10_000 and not Measurement.load().engine_missing
    settings.ENGINE_HOME = engine_home.parent / "unmounted"  # a disk not mounted, a wrong path
    measure_storage()
    assert Measurement.load().engine_missing
    totals = _totals(admin_client.get(PAGE, **HOST).content.decode())
    assert "Not found when measured" in totals and "0 bytes in 0 files" not in totals


def _beyond_path_max(folder) -> None:
    """A folder nested deeper than the system's path length limit, with a file at the bottom:
    it cannot be listed by its path (ENAMETOOLONG), only through its parent's descriptor."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        for _level in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            inner = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        leaf = os.open("hidden.bin", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(leaf, b"h" * 7000)
        os.close(leaf)
    finally:
        os.close(fd)


@pytest.mark.django_db
def test_what_cannot_be_read_makes_the_measurement_incomplete_not_smaller(admin_client, engine_home):
    from retention.models import StorageSnapshot
    from retention.tasks import measure_engine_folder

    home = EngineHome()
    conversation = factories.make_conversation(title="Deep")
    folder = home.artifacts_dir(conversation.storage_key)
    home.write_atomic(folder / "seen.bin", b"s" * 5000)
    _beyond_path_max(folder / "deep")  # reached through descriptors: counted
    home.write_atomic(folder / "locked" / "inside.bin", b"i" * 3000)
    with unreadable(folder / "locked"):
        result = measure_storage()
        engine_folder_size = measure_engine_folder()
    measurement = Measurement.load()
    assert result["engine_unreadable"] >= 1 and measurement.engine_unreadable == result["engine_unreadable"]
    # What could be read: the file beside it and the one beyond the path length limit.
    assert ConversationSize.objects.get(conversation_id=conversation.pk).engine_bytes == 5000 + 7000
    totals = _totals(admin_client.get(PAGE, **HOST).content.decode())
    assert "Incomplete:" in totals and "could not be read" in totals
    # The engine folder size Data & storage and /metrics show is not replaced by a smaller one.
    assert engine_folder_size["unreadable"] >= 1
    assert not StorageSnapshot.objects.filter(engine_bytes__gt=0).exists()

    assert measure_storage()["engine_unreadable"] == 0  # readable again: complete
    assert ConversationSize.objects.get(conversation_id=conversation.pk).engine_bytes == 5000 + 7000 + 3000


OUTSIDE_SIZE = 1 << 30  # sparse: a figure that counts it cannot be mistaken
KEY, STRANGER = "c_" + "a" * 20, "c_" + "5" * 20


def _area_and_link(tmp_path):
    """An engine folder with one conversation's events (10 bytes) in `threads`, and beside that
    area `threads.link`, a link to a folder outside holding another conversation's folder
    (OUTSIDE_SIZE bytes)."""
    home = EngineHome(tmp_path / "engine")
    home.write_atomic(home.events_path(KEY), b"e" * 10)
    outside = tmp_path / "outside"
    (outside / STRANGER).mkdir(parents=True)
    with open(outside / STRANGER / "events.jsonl", "wb") as handle:
        handle.truncate(OUTSIDE_SIZE)
    link = home.root / "threads.link"
    link.symlink_to(outside)
    return home, home.root / "threads", link


def test_the_figures_per_conversation_never_list_an_area_behind_a_link(tmp_path):
    """os.scandir(area) followed a link at the area: the folders outside were listed as the
    engine folder's conversations."""
    home, _threads, link = _area_and_link(tmp_path)
    (home.root / "artifacts").symlink_to(link.readlink())
    problems: list[OSError] = []
    assert engine_bytes_by_key(home, problems) == {KEY: 10}
    assert problems and {p.errno for p in problems} == {errno.ELOOP}  # not followed: the figure says incomplete
    assert engine_bytes_by_key(home) == {KEY: 10}


def test_the_figures_per_conversation_never_count_outside_while_an_area_is_swapped_for_a_link(tmp_path):
    home, threads, link = _area_and_link(tmp_path)

    def leaked() -> bool:
        found = engine_bytes_by_key(home, [])
        return STRANGER in found or sum(found.values()) >= OUTSIDE_SIZE

    with swapping(threads, link):
        attempts, seen = attempts_until(leaked)
    assert not seen, f"a folder outside was listed after {attempts} attempts"
    assert attempts > 1 and engine_bytes_by_key(home) == {KEY: 10}


@pytest.mark.django_db
def test_a_request_that_did_not_finish_is_not_shown_as_waiting_for_ever(admin_client, engine_home):
    measure_storage()
    admin_client.post(MEASURE, **HOST)
    page = admin_client.get(PAGE, **HOST).content.decode()
    assert "is waiting for the background job" in page
    now = timezone.now()
    Measurement.objects.filter(pk=1).update(requested_at=now - timedelta(hours=6),
                                            measured_at=now - timedelta(hours=7))
    page = admin_client.get(PAGE, **HOST).content.decode()
    assert "did not finish" in page and "is waiting for the background job" not in page
    spanish = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Se solicitó una medición el " in spanish and "medición a las" not in spanish  # r53: "a las 6 de diciembre"
    assert admin_client.post(MEASURE, **HOST).status_code == 302  # queued again
    assert "is waiting for the background job" in admin_client.get(PAGE, **HOST).content.decode()


@pytest.mark.django_db
def test_an_older_run_never_overwrites_a_newer_measurement(engine_home):
    """Two runs read at different times; the one that started later may commit first. The
    earlier one then writes nothing: its figures are older."""
    factories.make_conversation(title="x")
    later = timezone.now() + timedelta(minutes=5)  # a run that started after this one committed
    Measurement.objects.update_or_create(id=1, defaults={"measured_at": later, "engine_bytes": 12345})
    assert measure_storage() == {"superseded": 1}
    measurement = Measurement.load()
    assert (measurement.measured_at, measurement.engine_bytes) == (later, 12345)
    assert not DailySize.objects.exists()


@pytest.mark.django_db
def test_what_cannot_be_read_is_named_by_its_place_in_the_engine_folder(admin_client, engine_home):
    """Listings through descriptors named an unreadable folder by its last name only ("private")
    on the conversation page; they name its path in the engine folder, as before; and the
    delete's figures of that folder say they are not known rather than leave it out."""
    from lifecycle.deletion import files

    home = EngineHome()
    conversation = factories.make_conversation(title="Private reports")
    folder = home.artifacts_dir(conversation.storage_key)
    home.write_atomic(folder / "reports" / "private" / "inside.bin", b"i" * 3000)
    place = f"artifacts/{conversation.storage_key}/reports/private"
    with unreadable(folder / "reports" / "private"):
        page = admin_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
        with pytest.raises(PermissionError) as refused:
            files.usage(home, folder)
        preview = admin_client.get(f"/v1/threads/{conversation.public_id}/deletion-preview", **HOST).json()
    assert f"<code>{place}</code>" in page
    assert refused.value.filename == str(folder / "reports" / "private")
    artifacts = [s for s in preview["stores"] if s["store"] == "artifacts"]
    assert artifacts and artifacts[0]["records"] is None
    assert files.usage(home, folder) == (2, 3000)  # readable again: the file and its lock file


@pytest.mark.django_db
def test_an_unreadable_folder_whose_name_is_not_utf8_is_named_with_escapes_on_the_page_and_in_the_api(admin_client):
    """r143: a folder Lethe cannot read whose name's bytes are not UTF-8 made the conversation's
    page fail (500) and its runtime answer carry lone surrogates (invalid JSON text)."""
    home = EngineHome()
    conversation = factories.make_conversation(title="Odd names")
    folder = home.artifacts_dir(conversation.storage_key)
    home.write_atomic(folder / "seen.bin", b"s" * 10)
    odd = os.fsdecode(os.fsencode(folder) + b"/bad\xff\xfedir")
    os.mkdir(odd)
    shown = f"artifacts/{conversation.storage_key}/bad\\xff\\xfedir"
    with unreadable(Path(odd)):
        page = admin_client.get(f"/conversations/{conversation.public_id}/", **HOST)
        runtime = admin_client.get(f"/v1/threads/{conversation.public_id}/runtime", **HOST)
    assert page.status_code == 200 and f"<code>{shown}</code>" in page.content.decode()
    assert runtime.status_code == 200
    text = runtime.content.decode("utf-8")  # strict: no lone surrogate escaped in the JSON either
    assert "\\ud" not in text.lower()
    assert json.loads(text)["engine_problems"] == [{"path": shown, "code": "unreadable", "message": "cannot be read"}]


@pytest.mark.django_db
def test_a_folder_mounted_in_a_conversations_folder_is_not_counted_as_its_files(admin_client, tmp_path):
    """r145: a folder bound (mount --bind) in a conversation's folder was counted as its files on
    its page, in the runtime answer and in the storage ranking (the delete already refused it)."""
    import subprocess

    home = EngineHome()
    conversation = factories.make_conversation(title="Mounted")
    folder = home.artifacts_dir(conversation.storage_key)
    home.write_atomic(folder / "own.bin", b"o" * 10)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"b" * 50000)
    (folder / "mnt").mkdir()
    if subprocess.run(["mount", "--bind", str(outside), str(folder / "mnt")], capture_output=True).returncode:
        pytest.skip("a bind mount needs root")
    try:
        runtime = admin_client.get(f"/v1/threads/{conversation.public_id}/runtime", **HOST).json()
        page = admin_client.get(f"/conversations/{conversation.public_id}/", **HOST).content.decode()
        measure_storage()
        ranked = ConversationSize.objects.get(conversation_id=conversation.pk).engine_bytes
    finally:
        subprocess.run(["umount", str(folder / "mnt")], check=True)
    shown = f"artifacts/{conversation.storage_key}/mnt"
    assert runtime["engine_bytes"] < 50000 and runtime["engine_complete"] is False
    assert runtime["engine_problems"] == [{"path": shown, "code": "mounted",
                                           "message": "has another disk or folder mounted at it, so it was not read"}]
    assert f"<code>{shown}</code>" in page
    assert ranked < 50000
