from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from lifecycle.registry import markdown_table

DOC = Path(settings.BASE_DIR) / "docs" / "retention-classes.md"


class Command(BaseCommand):
    help = "Write docs/retention-classes.md from the retention class registry."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="Fail if the file is out of date.")

    def handle(self, *args, check: bool, **options):
        text = markdown_table()
        if check:
            if not DOC.exists() or DOC.read_text() != text:
                raise SystemExit("docs/retention-classes.md is out of date; run manage.py retention_table")
            return
        DOC.write_text(text)
        self.stdout.write(f"Wrote {DOC.relative_to(settings.BASE_DIR)}")
