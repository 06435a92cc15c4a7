"""`manage.py bench_tool_payloads --messages N`: tool payload analysis and cleanup figures.

Builds N messages in a scratch database of the configured engine (a temporary SQLite file, or
a temporary PostgreSQL database next to the configured one), then measures:
- analysis seconds (the real job, exact bytes checked against the rows);
- cleanup seconds, messages/s and MB/s (the real job, batches and pauses included), while
  another process (as the web server is) appends an item to a live conversation every 20 ms:
  append p50/p99 during the cleanup, and for `--alone-seconds` before it with nothing else
  running (what this machine's appends cost by themselves); with `--writer update` the
  foreground process instead updates the live conversation's title outside a transaction
  (SQLite: a write that waits on the busy handler, not on console/sqlite's polling BEGIN);
- the same rewrite as one SQL statement on a copy of the same rows (the engine's limit), and
  the ratio cleanup/statement;
- the resident memory growth during cleanup (flat in N: batches are bounded).
Prints JSON. The scratch database is removed afterwards; the configured one is not touched.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections, transaction
from django.utils import timezone

from ops.bench import settle

ITEM_COLUMNS = ("conversation_id, seq, role, tool_kind, tool_call_id, status, title, content, payload, "
                "payload_bytes, removable_bytes, payload_skip, removal_plan, revision, created_at, updated_at")
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega build test lint deploy error warning passed failed retry").split()


def _rss_bytes() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextlib.contextmanager
def scratch_database():
    """Point the default connection at a new, migrated database of the same engine; remove it after."""
    default = connections["default"]
    settings_dict = default.settings_dict
    original = settings_dict["NAME"]
    vendor = default.vendor
    folder = None
    if vendor == "sqlite":
        folder = tempfile.mkdtemp(prefix="lethe-bench-")
        scratch = str(Path(folder) / "bench.sqlite3")
    elif vendor == "postgresql":
        scratch = f"{original}_bench_{os.getpid()}"[:63]
        default.ensure_connection()
        with default.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
            cursor.execute(f'CREATE DATABASE "{scratch}"')
    else:
        raise CommandError("The benchmark supports SQLite and PostgreSQL.")
    default.close()
    settings_dict["NAME"] = scratch
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield scratch
    finally:
        for alias in connections:
            connections[alias].close()
        settings_dict["NAME"] = original
        if vendor == "postgresql":
            with default.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
        if folder:
            for path in Path(folder).iterdir():
                path.unlink()
            os.rmdir(folder)


class Command(BaseCommand):
    help = ("Benchmark tool payload analysis and cleanup on N messages in a scratch database of the "
            "configured engine, against one SQL statement doing the same rewrite. Prints JSON.")

    def add_arguments(self, parser):
        parser.add_argument("--messages", type=int, default=200_000, help="Messages to build (default 200000).")
        parser.add_argument("--per-conversation", type=int, default=100, help="Messages per conversation.")
        # DESIGN.md section 9's shape: 60,000 eligible payloads of 200,000 messages, 696 MB removable
        parser.add_argument("--output-bytes", type=int, default=11600, help="Size of each shell output.")
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--alone-seconds", type=float, default=5.0,
                            help="Seconds of appends with no cleanup running, before it (default 5).")
        parser.add_argument("--writer", choices=("append", "update"), default="append",
                            help="What the foreground process writes every 20 ms: an item appended in a "
                                 "transaction (default, as the API does), or the live conversation's title "
                                 "updated outside any transaction (as Django saves a row outside atomic()).")

    def handle(self, *args, messages: int, per_conversation: int, output_bytes: int, seed: int,
               alone_seconds: float, writer: str = "append", **options):
        if messages < 10 or per_conversation < 3 or not 10 <= output_bytes <= 1_000_000:
            raise CommandError("Give at least 10 messages, 3 per conversation, and 10 to 1000000 output bytes.")
        if not 0 < alone_seconds <= 600:
            raise CommandError("Give more than 0 and at most 600 seconds of appends alone.")
        self.rng = random.Random(seed)
        self.alone_seconds = alone_seconds
        self.writer = writer
        with scratch_database():
            result = self.measure(messages, per_conversation, output_bytes)
        self.stdout.write(json.dumps(result, indent=1))

    # Data ---------------------------------------------------------------------------------------

    def text(self, size: int) -> str:
        words = []
        length = 0
        while length < size:
            word = self.rng.choice(WORDS)
            words.append(word)
            length += len(word) + 1
        return " ".join(words)[:size]

    def build(self, messages: int, per_conversation: int, output_bytes: int) -> dict:
        from lifecycle.item_payload import payload_columns
        from lifecycle.models import Account, Conversation, Scope
        from retention.reducer import encode

        now = timezone.now()
        account = Account.objects.create(name="bench")
        conversations = (messages + per_conversation - 1) // per_conversation
        rows_conversations = []
        for n in range(conversations):
            # nine in ten are old enough for a 3-month policy (one conversation alone is old); the rest are recent
            idle = timedelta(days=5 if n % 10 == 9 else 200)
            rows_conversations.append(Conversation(
                scope=Scope.BOUND, account=account, thread_id=f"bench_{n:07d}", title=f"Bench {n}",
                created_at=now - idle - timedelta(days=1), last_activity_at=now - idle,
            ))
        Conversation.objects.bulk_create(rows_conversations, batch_size=2000)
        ids = list(Conversation.objects.order_by("id").values_list("id", flat=True))
        outputs = [self.text(output_bytes) for _ in range(16)]
        table = "lifecycle_item"
        stamp = now - timedelta(days=300)
        made = 0
        with transaction.atomic(), connection.cursor() as cursor:
            batch = []

            def flush():
                if not batch:
                    return
                if connection.vendor == "postgresql":
                    with cursor.cursor.copy(f"COPY {table} ({ITEM_COLUMNS}) FROM STDIN") as copy:
                        for row in batch:
                            copy.write_row(row)
                else:
                    cursor.executemany(
                        f"INSERT INTO {table} ({ITEM_COLUMNS}) VALUES ({', '.join(['%s'] * 16)})",
                        [(*row[:14], connection.ops.adapt_datetimefield_value(row[14]),
                          connection.ops.adapt_datetimefield_value(row[15])) for row in batch],
                    )
                batch.clear()

            for conversation_id in ids:
                for seq in range(1, per_conversation + 1):
                    if made >= messages:
                        break
                    made += 1
                    if seq % 3:
                        batch.append((conversation_id, seq, "assistant", "", "", "", "", self.text(200), None,
                                      0, 0, "", None, 1, stamp, stamp))
                    else:
                        payload = {"command": f"make test {seq}", "cwd": "/w", "exit_code": seq % 2,
                                   "stdout": outputs[seq % 16], "stderr": outputs[(seq + 1) % 16][:200],
                                   "truncated": False}
                        cols = payload_columns("tool", "shell", payload)
                        batch.append((conversation_id, seq, "tool", "shell", f"call_{seq}", "completed", "Run",
                                      "", encode(cols["payload"]), cols["payload_bytes"], cols["removable_bytes"],
                                      cols["payload_skip"], cols["removal_plan"], 1, stamp, stamp))
                    if len(batch) >= 2000:
                        flush()
            flush()
        with connection.cursor() as cursor:
            # the steady state autovacuum keeps: statistics, and (PostgreSQL) the visibility map
            # that lets analysis read its sums from the indexes alone
            cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
        return {"conversations": len(ids), "messages": made}

    # Measurements -------------------------------------------------------------------------------

    def measure(self, messages: int, per_conversation: int, output_bytes: int) -> dict:
        from django.db.models import Count, Sum

        from lifecycle.models import Item
        from retention import jobs
        from retention.models import ToolPayloadOperation, ToolPayloadPolicy

        jobs.STEP_SECONDS = 10**9  # one run to the end, in this process
        built = self.build(messages, per_conversation, output_bytes)
        ToolPayloadPolicy.objects.get_or_create(id=1)
        ToolPayloadPolicy.objects.filter(id=1).update(enabled=True, backup_choice="skip", preparation_state="ready")
        policy = ToolPayloadPolicy.load()
        cutoff = jobs.cutoff_for(timezone.now(), 3, "months")
        expected = Item.objects.filter(
            removable_bytes__gt=0, conversation__in=jobs.eligible_conversations(cutoff).values("id")
        ).aggregate(n=Count("id"), b=Sum("removable_bytes"))

        # Analysis
        op = ToolPayloadOperation.objects.create(kind="analysis", age_value=3, age_unit="months",
                                                 policy_revision=policy.revision)
        started = time.perf_counter()
        jobs.run_operation(op.pk)
        analysis_seconds = time.perf_counter() - started
        analysis = ToolPayloadOperation.objects.get(pk=op.pk)

        # One statement on a copy of the same rows: a replica with the table's indexes and
        # triggers (the limit), and a bare copy (one index, no trigger; what earlier runs printed)
        statement_seconds = self.single_statement(cutoff, replica=True)
        bare_seconds = self.single_statement(cutoff, replica=False)

        # Cleanup with a foreground writer
        live = self.live_conversation()
        # The foreground writer is another process (as the web server is), with its own connection:
        # a new interpreter (forking a process that has threads, a test server's say, can leave a
        # lock held in the child), told which database to use, started before the timing.
        context = multiprocessing.get_context("spawn")
        stop, ready = context.Event(), context.Event()
        results = context.Queue()
        writer = context.Process(target=_foreground, daemon=True,
                                 args=(str(connection.settings_dict["NAME"]), live.pk, stop, ready, results,
                                       self.writer))
        op = ToolPayloadOperation.objects.create(kind="cleanup", age_value=3, age_unit="months",
                                                 policy_revision=policy.revision)
        settle()  # as the single statement found its copy
        stored_before = Item.objects.aggregate(s=Sum("payload_bytes"))["s"]
        rss_before = _rss_bytes()
        rss_peak = [rss_before]
        sampler_stop = threading.Event()

        def sample():
            while not sampler_stop.wait(0.1):
                rss_peak[0] = max(rss_peak[0], _rss_bytes())

        writer.start()
        if not ready.wait(300):
            writer.kill()
            raise CommandError("The appending process did not start.")
        time.sleep(self.alone_seconds)  # the appends with nothing else running: what the ones beside it compare to
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        begun = time.monotonic()
        started = time.perf_counter()
        while jobs.run_operation(op.pk) == "more":
            pass
        cleanup_seconds = time.perf_counter() - started
        ended = time.monotonic()
        stop.set()
        appends = results.get(timeout=60)
        alone = [seconds for at, seconds in appends if at + seconds <= begun]
        latencies = [seconds for at, seconds in appends if at < ended and at + seconds > begun]
        writer.join(30)
        sampler_stop.set()
        sampler.join()
        cleanup = ToolPayloadOperation.objects.get(pk=op.pk)
        stored_after = Item.objects.aggregate(s=Sum("payload_bytes"))["s"]
        removed_mb = cleanup.payload_bytes / 1e6
        return {
            "engine": connection.vendor,
            **built,
            "eligible_messages": expected["n"] or 0,
            "removable_mb": round((expected["b"] or 0) / 1e6, 1),
            "analysis": {
                "seconds": round(analysis_seconds, 3),
                "eligible_messages": analysis.eligible_messages,
                "payload_bytes": analysis.payload_bytes,
                "exact": analysis.payload_bytes == (expected["b"] or 0) == cleanup.payload_bytes
                == stored_before - stored_after,
            },
            "cleanup": {
                "state": cleanup.state,
                "seconds": round(cleanup_seconds, 3),
                "removed_messages": cleanup.removed_messages,
                "messages_per_second": round(cleanup.removed_messages / cleanup_seconds, 1),
                "mb_per_second": round(removed_mb / cleanup_seconds, 2),
                "batch_items": jobs.BATCH_ITEMS,
                "pause_seconds": jobs.SQLITE_PAUSE if connection.vendor == "sqlite" else 0,
            },
            "single_statement": {"seconds": round(statement_seconds, 3),
                                 "ratio_cleanup_to_statement": round(cleanup_seconds / statement_seconds, 2),
                                 "on": "a replica of the item table: its indexes and fence triggers",
                                 "bare_copy_seconds": round(bare_seconds, 3),
                                 "ratio_cleanup_to_bare_copy": round(cleanup_seconds / bare_seconds, 2)},
            "foreground_writer": self.writer,
            "foreground_append": _figures(latencies),
            "foreground_append_alone": {**_figures(alone), "seconds": self.alone_seconds},
            "memory": {"rss_before_mb": round(rss_before / 1e6, 1),
                       "cleanup_rss_growth_mb": round((rss_peak[0] - rss_before) / 1e6, 1)},
            "targets": {"ratio_max": 0.6 if connection.vendor == "sqlite" else 1.1,
                        "append_p99_ms_max": 25 if connection.vendor == "sqlite" else 10,
                        "analysis_seconds_max_200k": 1.0},
        }

    def live_conversation(self):
        from lifecycle.models import Account, Conversation, Scope

        return Conversation.objects.create(scope=Scope.BOUND, account=Account.objects.first(),
                                           thread_id="bench_live", title="Live")

    def single_statement(self, cutoff, *, replica: bool) -> float:
        """The same rewrite as one UPDATE on a copy of the item table (the engine's limit).

        replica: the copy has the item table's indexes and its fence triggers, so the statement
        maintains what any rewrite of this table must; else a bare copy (one index, no trigger).
        """
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_item_copy")
            if connection.vendor == "postgresql" and replica:
                cursor.execute("CREATE TABLE bench_item_copy (LIKE lifecycle_item INCLUDING ALL)")
                cursor.execute("INSERT INTO bench_item_copy SELECT * FROM lifecycle_item")
                cursor.execute("CREATE TRIGGER bench_fence_update BEFORE UPDATE ON bench_item_copy FOR EACH ROW "
                               "EXECUTE FUNCTION lethe_fence_update()")
                cursor.execute("VACUUM ANALYZE bench_item_copy")
            elif replica:  # SQLite: the table's own definition (keys, constraints), indexes and triggers
                cursor.execute("SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'lifecycle_item' "
                               "AND sql IS NOT NULL ORDER BY type = 'table' DESC")
                for _kind, name, sql in cursor.fetchall():
                    copied = sql.replace('"lifecycle_item"', '"bench_item_copy"')
                    if name != "lifecycle_item":
                        copied = copied.replace(name, f"bench_{name}", 1)
                    cursor.execute(copied)
                    if _kind == "table":
                        cursor.execute("INSERT INTO bench_item_copy SELECT * FROM lifecycle_item")
                cursor.execute("ANALYZE bench_item_copy")
            else:
                cursor.execute("CREATE TABLE bench_item_copy AS SELECT * FROM lifecycle_item")
                cursor.execute("CREATE INDEX bench_copy_conv ON bench_item_copy (conversation_id)")
        settle()  # the copy as old as the table the cleanup rewrites (see ops.bench.settle)
        with connection.cursor() as cursor:
            removed_at = timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            eligible = "SELECT id FROM lifecycle_conversation WHERE last_activity_at < %s"
            if connection.vendor == "sqlite":
                sql = (
                    "UPDATE bench_item_copy SET payload = json_set(json_remove(payload, '$.stdout', '$.stderr'), "
                    "'$.retention', json_object('version', 1, 'removed_at', %s, 'removed_fields', "
                    "json_array('stderr', 'stdout'), 'removed_bytes', removable_bytes)), "
                    "payload_bytes = payload_bytes - removable_bytes, removable_bytes = 0, removal_plan = NULL, "
                    "payload_skip = 'already_removed', revision = revision + 1 "
                    f"WHERE removable_bytes > 0 AND conversation_id IN ({eligible})"
                )
            else:
                sql = (
                    "UPDATE bench_item_copy SET payload = (payload - 'stdout' - 'stderr') || jsonb_build_object("
                    "'retention', jsonb_build_object('version', 1, 'removed_at', %s::text, 'removed_fields', "
                    "jsonb_build_array('stderr', 'stdout'), 'removed_bytes', removable_bytes)), "
                    "payload_bytes = payload_bytes - removable_bytes, removable_bytes = 0, removal_plan = NULL, "
                    "payload_skip = 'already_removed', revision = revision + 1 "
                    f"WHERE removable_bytes > 0 AND conversation_id IN ({eligible})"
                )
            started = time.perf_counter()
            with transaction.atomic():
                cursor.execute(sql, [removed_at, connection.ops.adapt_datetimefield_value(cutoff)])
            seconds = time.perf_counter() - started
            cursor.execute("DROP TABLE bench_item_copy")
        return seconds


def _foreground(database: str, conversation_id: int, stop, ready, results, writer: str = "append") -> None:
    """A runtime appending an item every 20 ms, in its own process and connection (or, with
    writer "update", the conversation's title updated every 20 ms outside a transaction)."""
    import django

    django.setup()  # a new interpreter: the settings module comes from the environment
    connections["default"].settings_dict["NAME"] = database

    from lifecycle.actions.append_item import append_item
    from lifecycle.models import Conversation

    appends: list[tuple[float, float]] = []  # (when it started, seconds): the clock is the machine's
    try:
        conversation = Conversation.objects.get(pk=conversation_id)
        ready.set()
        n = 0
        while not stop.is_set():
            at = time.monotonic()
            started = time.perf_counter()
            if writer == "update":
                n += 1
                Conversation.objects.filter(pk=conversation_id).update(title=f"Live {n}")  # autocommit
            else:
                append_item(conversation, role="assistant", content="still working")
            appends.append((at, time.perf_counter() - started))
            stop.wait(0.02)
    finally:
        results.put(appends)
        connections.close_all()


def _figures(latencies: list[float]) -> dict:
    return {
        "samples": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(_percentile(latencies, 99) * 1000, 2) if latencies else None,
        "max_ms": round(max(latencies) * 1000, 2) if latencies else None,
    }


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))
    return ordered[index]
