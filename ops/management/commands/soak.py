"""`manage.py soak`: two web servers and two job clusters on one PostgreSQL database under a
bounded mixed API load, one cluster killed and restarted; checks the books and prints JSON
figures (see ops/soak.py and docs/deploy.md). Exits 1 on any violation.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/lethe_soak ENGINE_HOME=var/soak-engine \\
        manage.py soak --seconds 180 --clients 4

The database named by DATABASE_URL is dropped and recreated (its name must contain "soak"),
and the engine folder emptied (its path must contain "soak").
"""

from __future__ import annotations

import json
import signal
import sys

from django.core.management.base import BaseCommand, CommandError

from ops.soak import Soak, SoakFailed


class Command(BaseCommand):
    help = ("Soak two web servers and two job clusters on one PostgreSQL database (recreated) with a mixed "
            "API load; print JSON figures; exit 1 on lost or duplicated work, errors or erasure residue.")
    # The database may not exist yet: the soak creates it, so nothing may touch it first.
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=180.0, help="How long the load runs.")
        parser.add_argument("--clients", type=int, default=4, help="Concurrent API clients.")
        parser.add_argument("--settle-seconds", type=float, default=300.0,
                            help="How long to wait, after the load, for every delete to complete.")

    def handle(self, *args, seconds: float, clients: int, settle_seconds: float, **options):
        if not 5 <= seconds <= 3600 or not 1 <= clients <= 64:
            raise CommandError("--seconds must be between 5 and 3600 and --clients between 1 and 64.")
        soak = Soak(seconds=seconds, clients=clients, settle_seconds=settle_seconds,
                    out=lambda line: self.stderr.write(line))

        def stopped(signum, frame):
            raise SoakFailed(f"stopped by signal {signum}")

        # Told to stop: the run ends as a failure, and every process it started is stopped.
        signal.signal(signal.SIGTERM, stopped)
        try:
            figures = soak.run()
        except SoakFailed as exc:
            soak.figures["failed"] = str(exc)
            self.stdout.write(json.dumps(soak.figures, indent=1))
            self.stderr.write(f"soak FAILED: {exc}")
            sys.exit(1)
        self.stdout.write(json.dumps(figures, indent=1))
        self.stderr.write("soak passed: no lost or duplicated work, every delete Completed, erasure verified.")
