from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from insight.tasks import measure_storage


class Command(BaseCommand):
    help = "Measure storage now (what the daily job does) and print the totals."

    def handle(self, *args, **options) -> None:
        started = time.perf_counter()
        result = measure_storage()
        seconds = time.perf_counter() - started
        self.stdout.write(" ".join(f"{key}={value}" for key, value in result.items()) + f" seconds={seconds:.2f}")
