from __future__ import annotations

from django.core.management.base import BaseCommand

from insight.tasks import measure_storage


class Command(BaseCommand):
    help = "Measure storage now (what the daily job does) and print the totals."

    def handle(self, *args, **options) -> None:
        result = measure_storage()
        self.stdout.write(" ".join(f"{key}={value}" for key, value in result.items()))
