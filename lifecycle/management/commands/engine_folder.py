"""`manage.py engine_folder [--adopt]`: whether ENGINE_HOME is the engine folder this database
uses (lifecycle.engine_folder), and, with --adopt, make the folder there the one."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from console.management.cli import io_error
from lifecycle import engine_folder
from lifecycle.enginefs import EngineHome


class Command(BaseCommand):
    help = ("Say whether ENGINE_HOME is the engine folder this database uses. --adopt makes the folder there "
            "the one (marking it if it has no mark): for a folder replaced on purpose, after you checked it "
            "holds what it should (deletes erase in it, and check it, from then on).")

    def add_arguments(self, parser):
        parser.add_argument("--adopt", action="store_true", help="Make the folder at ENGINE_HOME this database's.")

    def handle(self, *args, adopt: bool, **options):
        if settings.ENGINE_URL:
            raise CommandError("This console's engine is remote (ENGINE_URL): it keeps no engine folder.")
        home = EngineHome()
        if adopt:
            if home.root.exists() and not home.root.is_dir():
                raise CommandError(f"ENGINE_HOME ({home.root}) is not a folder.")
            try:
                folder_id = engine_folder.adopt(home, force=True)
            except engine_folder.EngineFolderUnavailable as exc:
                raise CommandError(f"{exc.root}: {engine_folder.WORDS[exc.reason]}.", returncode=2) from None
            except OSError as exc:  # a read-only mount, a folder of another user: one line
                raise io_error(exc, "Nothing was adopted", returncode=2) from None
            self.stdout.write(f"{home.root} is this database's engine folder now (mark {folder_id}).")
            return
        reason = engine_folder.problem(home)
        recorded = engine_folder.recorded()
        if reason and recorded is None:
            why = ("it holds conversations, whose files must be somewhere" if reason == "missing"
                   else "it holds none of the files of this database's conversations")
            self.stdout.write(f"{home.root}: {engine_folder.WORDS[reason]}. This database has recorded no engine folder "
                              f"yet and does not take this one by itself: {why}. Deletes wait. Check that it is the "
                              "right folder (or set ENGINE_HOME to the right one), then run manage.py engine_folder "
                              "--adopt.")
            raise SystemExit(1)
        if reason:
            self.stdout.write(f"{home.root}: {engine_folder.WORDS[reason]} (this database's mark is {recorded}). "
                              "Deletes wait until it is back.")
            raise SystemExit(1)
        if recorded is None:
            self.stdout.write(f"{home.root}: this database has recorded no engine folder yet; the first delete "
                              "or serve records this one.")
            return
        self.stdout.write(f"{home.root} is this database's engine folder (mark {recorded}).")
