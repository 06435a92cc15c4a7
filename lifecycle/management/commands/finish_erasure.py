from __future__ import annotations

import json

from django.core.management.base import BaseCommand
from django.db import connection

from lifecycle.deletion.rewrite import finish_waiting_erasures


class Command(BaseCommand):
    help = ("Finish the physical erasure of completed deletes (and, on a console of a remote engine, of its "
            "copies of bound-deleted titles): checkpoint the write-ahead log (SQLite) or rewrite the tables they "
            "touched with VACUUM FULL (PostgreSQL; locks one table at a time, run it when the console is quiet). "
            "Receipts then say physically erased.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, json: bool = False, **options):
        result = finish_waiting_erasures()
        if json:
            self.stdout.write(_dumps(result.as_dict()))
            return
        if not result.waiting:
            self.stdout.write("No delete is waiting for its physical erasure.")
            return
        if result.held_by:
            self.stdout.write(f"{result.held_by} sessions still hold snapshots older than the deletes, so a "
                              "rewrite would keep the erased rows: nothing was rewritten. Run it again when "
                              "they have ended.")
        if connection.vendor == "sqlite" and result.still_pending:
            self.stdout.write("The write-ahead log could not be folded back into the database file completely: "
                              "another connection is still reading an older state (a long read, a backup being "
                              "made). Run this again when it has ended.")
        if result.tables:
            self.stdout.write(f"Rewrote {len(result.tables)} tables: {', '.join(result.tables)}")
        self.stdout.write(f"Physically erased: {result.erased} of {result.waiting}; still pending: "
                          f"{result.still_pending}")


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True)
