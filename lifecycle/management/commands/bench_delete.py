from __future__ import annotations

import json
import random
import shutil
import statistics
import time
import tracemalloc
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from django.utils import timezone

from lifecycle import fence
from lifecycle import models as m
from lifecycle.actions.append_item import append_item
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor
from lifecycle.enginefs import EngineHome, jsonl
from lifecycle.registry import STORES, RetentionClass
from lifecycle.seeding import _corpus
from ops.bench import settle
from retention.reducer import encode, measure_item

ITEM_COLUMNS = ("conversation_id, turn_id, seq, role, tool_kind, tool_call_id, status, title, content, payload, "
                "payload_bytes, removable_bytes, payload_skip, revision, created_at, updated_at")
ITEMS_PER_TURN = 5


class Command(BaseCommand):
    help = ("Benchmark: erase conversations of N items with their files, against a raw DELETE plus file "
            "removal of a copy of the same data; and an item append's p50/p99 with and without the fence "
            "triggers. Prints JSON. Leaves nothing behind. Run it on a scratch database: it turns the fence "
            "triggers off for a moment to time appends without them.")

    def add_arguments(self, parser):
        parser.add_argument("--sizes", default="1000,10000,100000", help="Items per conversation, comma-separated.")
        parser.add_argument("--appends", type=int, default=400, help="Timed appends per fence setting.")
        parser.add_argument("--repeat", type=int, default=3,
                            help="Erase and raw-delete this many copies per size; the minimum is the figure "
                                 "(least disturbed by other work on the machine), the median is shown too.")
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args, sizes: str, appends: int, repeat: int, seed: int, **options):
        try:
            counts = [int(s) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise CommandError("--sizes takes whole numbers, e.g. 1000,10000") from None
        self.repeat = repeat
        if not counts or min(counts) < 1 or appends < 10 or not 1 <= repeat <= 20:
            raise CommandError("Give at least one size of 1 or more items and 10 or more appends.")
        if m.DeleteOperation.objects.outstanding().exists():
            # The append figures need the fence triggers off for a moment: never beside a real delete.
            raise CommandError("A delete is pending in this database; run the benchmark on a scratch database.")
        self.rng = random.Random(seed)
        self.corpus = _corpus(random.Random(seed), 1 << 19)
        self.home = EngineHome()
        self.account = m.Account.objects.create(name=f"bench-delete-{seed}-{time.time_ns()}")
        try:
            result = {
                "engine": connection.vendor,
                "sizes": [self.size(n) for n in counts],
                "append": self.appends(appends),
                "targets": {"erase_vs_raw_ratio_max": 1.5, "fence_append_overhead_pct_max": 5},
            }
        finally:
            self.clean_up()
        self.stdout.write(json.dumps(result, indent=1))

    # Data ----------------------------------------------------------------------------------------

    def text(self, size: int) -> str:
        start = self.rng.randrange(0, len(self.corpus) - size - 1)
        return self.corpus[start:start + size]

    def conversation(self, items: int) -> m.Conversation:
        """A conversation of `items` items in turns, with its engine files, written in bulk."""
        now = timezone.now()
        conversation = m.Conversation.objects.create(
            scope=m.Scope.BOUND, account=self.account, thread_id=f"bench_{time.time_ns()}", title="Benchmark",
            created_at=now - timedelta(days=2), last_activity_at=now - timedelta(days=1),
        )
        turns = m.Turn.objects.bulk_create(
            [m.Turn(conversation=conversation, seq=n + 1) for n in range((items + ITEMS_PER_TURN - 1) // ITEMS_PER_TURN)]
        )
        rows = []
        for seq in range(1, items + 1):
            turn = turns[(seq - 1) // ITEMS_PER_TURN].pk
            if seq % 3:
                rows.append((conversation.pk, turn, seq, "assistant", "", "", "", "", self.text(400), None, 0, 0, ""))
            else:
                payload = {"command": "pytest -q", "cwd": "/w", "exit_code": 0, "stdout": self.text(1200), "stderr": ""}
                size, removable, skip = measure_item("shell", payload)
                rows.append((conversation.pk, turn, seq, "tool", "shell", f"call_{seq}", "completed", "Run",
                             "", encode(payload), size, removable, skip))
        self.insert_items(rows, now)
        key = conversation.storage_key
        self.home.write_atomic(self.home.events_path(key), jsonl([{"turn": t.seq} for t in turns]))
        self.home.write_atomic(self.home.receipts_path(key), jsonl([{"seq": r[2]} for r in rows if r[3] == "tool"]))
        self.home.write_atomic(self.home.artifacts_dir(key) / "output.txt", self.text(200).encode() * (items // 10 + 1))
        settle()  # as a conversation written some time ago is
        return conversation

    def insert_items(self, rows: list[tuple], at) -> None:
        table = m.Item._meta.db_table
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                with cursor.cursor.copy(f"COPY {table} ({ITEM_COLUMNS}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row((*row, 1, at, at))
            else:
                stamp = connection.ops.adapt_datetimefield_value(at)
                sql = f"INSERT INTO {table} ({ITEM_COLUMNS}) VALUES ({', '.join(['%s'] * 16)})"
                for start in range(0, len(rows), 2000):
                    cursor.executemany(sql, [(*row, 1, stamp, stamp) for row in rows[start:start + 2000]])

    # Measurements ----------------------------------------------------------------------------------

    def erase(self, conversation: m.Conversation) -> float:
        started = time.perf_counter()
        op = request_deletion(conversation, key=f"bench-{conversation.pk}", acting_user=None)
        if executor.run_erasure(op.pk, budget=10**9) != "completed":
            raise CommandError(f"the erasure of {op.public_id} did not complete")
        return time.perf_counter() - started

    def raw_delete(self, conversation: m.Conversation) -> float:
        """The limit: one DELETE per erase table and one UPDATE per compact table in a transaction,
        then the folders removed."""
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            for s in sorted((s for s in STORES if s.fenced), key=lambda s: s.key != "lifecycle.Item"):
                if s.retention == RetentionClass.ERASE:
                    cursor.execute(f"DELETE FROM {s.db_table} WHERE conversation_id = %s", [conversation.pk])
                else:
                    cleared = ", ".join(f"{c} = NULL" for c in s.content_columns())
                    cursor.execute(f"UPDATE {s.db_table} SET {cleared} WHERE conversation_id = %s", [conversation.pk])
        for folder in self.home.conversation_paths(conversation.storage_key):
            shutil.rmtree(folder, ignore_errors=True)
        return time.perf_counter() - started

    def size(self, items: int) -> dict:
        erase, raw = [], []
        for _ in range(self.repeat):
            # Each timed delete comes right after its own conversation was written, so both find
            # their rows equally warm. Written one after the other, the second (the raw delete's)
            # stayed in PostgreSQL's buffer cache (128 MB by default, about one conversation of
            # 100,000 items) while the first was read back from the OS, about twice as slowly.
            copy = self.conversation(items)
            raw.append(self.raw_delete(copy))
            erased = self.conversation(items)
            files, size = self.home.conversation_usage(erased.storage_key)
            erase.append(self.erase(erased))
        probe = self.conversation(items)
        tracemalloc.start()
        self.erase(probe)
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"items": items, "engine_files": files, "engine_bytes": size, "runs": self.repeat,
                "erase_seconds": round(min(erase), 3), "raw_seconds": round(min(raw), 3),
                "ratio": round(min(erase) / min(raw), 2) if min(raw) else None,
                "erase_median_seconds": round(statistics.median(erase), 3),
                "raw_median_seconds": round(statistics.median(raw), 3),
                "erase_peak_python_kib": round(peak / 1024)}

    def appends(self, count: int) -> dict:
        conversation = m.Conversation.objects.create(scope=m.Scope.BOUND, account=self.account,
                                                     thread_id=f"bench_append_{time.time_ns()}")
        timings: dict[bool, list[float]] = {True: [], False: []}
        rounds = 4
        for _round in range(rounds):
            for fenced in (False, True):
                if fenced:
                    fence.install_fence_triggers(connection)
                else:
                    fence.remove_fence_triggers(connection)
                for _ in range(count // rounds):
                    started = time.perf_counter()
                    append_item(conversation, role="user", content=self.text(300))
                    timings[fenced].append((time.perf_counter() - started) * 1000)
        fence.install_fence_triggers(connection)

        def figures(values: list[float]) -> dict:
            values = sorted(values)
            return {"p50_ms": round(statistics.median(values), 3),
                    "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 3)}

        with_fence, without = figures(timings[True]), figures(timings[False])
        return {"samples": len(timings[True]), "with_fence": with_fence, "without_fence": without,
                "overhead_p50_pct": round(100 * (with_fence["p50_ms"] / without["p50_ms"] - 1), 1),
                "overhead_p99_pct": round(100 * (with_fence["p99_ms"] / without["p99_ms"] - 1), 1)}

    def clean_up(self) -> None:
        """Remove every row the benchmark made, tombstones included (only it may)."""
        fence.install_fence_triggers(connection)
        mine = m.Conversation.objects.filter(account=self.account)
        ids = list(mine.values_list("pk", flat=True))
        public_ids = list(mine.values_list("public_id", flat=True))
        ops = set(m.DeleteOperation.objects.filter(conversation_id__in=ids).values_list("pk", flat=True))
        with transaction.atomic():
            # The erase jobs each delete queued (run here, in the command, instead; r22: they were
            # left in the queue for a cluster to pick up)
            from django_q.models import OrmQ

            OrmQ.objects.filter(pk__in=[job.pk for job in OrmQ.objects.all() if job.task.get("func") ==
                                        "lifecycle.tasks.erase" and tuple(job.task.get("args") or ())[:1]
                                        in {(pk,) for pk in ops}]).delete()
            m.DeleteOperation.objects.filter(conversation_id__in=ids).delete()
            m.AuditFact.objects.filter(conversation_id__in=ids).delete()
            for s in STORES:
                if s.fenced:
                    s.model_class.objects.filter(conversation_id__in=ids)._raw_delete(connection.alias)
            m.DeletionFence.objects.filter(conversation_id__in=ids).delete()
            m.Conversation.objects.filter(pk__in=ids).delete()
            self.account.delete()
        for public_id in public_ids:
            for folder in self.home.conversation_paths(public_id):
                shutil.rmtree(folder, ignore_errors=True)
