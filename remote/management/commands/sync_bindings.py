from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from lifecycle.errors import ActionRefused
from remote.sync import refresh, rejected_text


class Command(BaseCommand):
    help = "Read the conversations of the engine at ENGINE_URL (or --engine-url) and keep their bindings."

    def add_arguments(self, parser):
        parser.add_argument("--engine-url", default="", help="Another engine listed in ENGINE_TOKENS.")

    def handle(self, *args, engine_url: str, **options):
        from django.conf import settings

        if not engine_url and not settings.ENGINE_URL:
            raise CommandError("Set ENGINE_URL (and ENGINE_TOKEN) first: the embedded engine needs no bindings.")
        try:
            counts = refresh(engine_url.rstrip("/"))
        except ActionRefused as exc:
            from remote.sync import failed_read_text

            raise CommandError(f"{exc.code}: {failed_read_text(exc)}") from None
        self.stdout.write(f"{counts['created']} created, {counts['updated']} updated"
                          + (f", {counts['returned']} back after a completed delete (delete them again)"
                             if counts["returned"] else ""))
        if counts["rejected"]:
            # The others were read; these rows are not conversations this console can keep.
            self.stdout.write(f"{counts['rejected']} left out (the engine's row is not in the form expected; the "
                              "field not taken is named): "
                              + rejected_text(counts["rejected_conversations"], counts["rejected"]))
