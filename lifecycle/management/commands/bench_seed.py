from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from lifecycle.engine_folder import CLAIM_NAME, MARK_NAME
from lifecycle.enginefs import EngineHome
from lifecycle.models import Conversation
from lifecycle.seeding import Seeder


class Command(BaseCommand):
    help = "Benchmark: seed N items (100 per conversation) into an empty database and print the figures."

    def add_arguments(self, parser):
        parser.add_argument("--items", type=int, default=100_000)
        parser.add_argument("--seed", type=int, default=1)

    def handle(self, *args, items: int, seed: int, **options):
        if Conversation.objects.exists():
            raise CommandError("Run the benchmark on an empty database (make bench-seed does).")
        home = EngineHome()
        if home.root.exists() and any(entry.name not in (MARK_NAME, CLAIM_NAME) for entry in home.root.iterdir()):
            # It writes conversations' files and the subagent state file: never into a folder in use.
            raise CommandError(f"Run the benchmark with an empty engine folder ({home.root} holds files; "
                               "make bench-seed uses one of its own).")
        conversations = max(2, items // 100)
        started = time.perf_counter()
        report = Seeder(seed=seed, anchor=timezone.now(), messages=100, home=home).run(conversations)
        elapsed = time.perf_counter() - started
        # Fresh statistics, as a long-running database would have from autovacuum.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        self.stdout.write(
            f"seed benchmark ({connection.vendor}): {report.items} items in {report.conversations} conversations, "
            f"{report.files} engine files: {elapsed:.1f} s, {report.items / elapsed:,.0f} items/s"
        )
