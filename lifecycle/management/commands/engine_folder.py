"""`manage.py engine_folder [--adopt [--take-from-other-database]]`: whether ENGINE_HOME is the
engine folder this database uses (lifecycle.engine_folder), and, with --adopt, make the folder
there the one (one marked as another database's only with --take-from-other-database)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils.translation import gettext

from console.management.cli import io_error
from lifecycle import engine_folder
from lifecycle.enginefs import EngineHome

TAKE = " --take-from-other-database"


class Command(BaseCommand):
    help = ("Say whether ENGINE_HOME is the engine folder this database uses. --adopt makes the folder there "
            "the one (marking it if it has no mark): for a folder replaced on purpose, after you checked it "
            "holds what it should (deletes erase in it, and check it, from then on). A folder marked as another "
            "database's is refused unless --take-from-other-database is given too.")

    def add_arguments(self, parser):
        parser.add_argument("--adopt", action="store_true", help="Make the folder at ENGINE_HOME this database's.")
        parser.add_argument("--take-from-other-database", action="store_true",
                            help="With --adopt: adopt it even if it is marked as another database's engine folder. "
                                 "It gets a new mark, and that database's deletes wait from then on.")

    def handle(self, *args, adopt: bool, take_from_other_database: bool, **options):
        if settings.ENGINE_URL:
            raise CommandError("This console's engine is remote (ENGINE_URL): it keeps no engine folder.")
        if take_from_other_database and not adopt:
            raise CommandError(gettext("--take-from-other-database goes with --adopt; nothing was changed."),
                               returncode=2)
        home = EngineHome()
        if adopt:
            if home.root.exists() and not home.root.is_dir():
                raise CommandError(f"ENGINE_HOME ({home.root}) is not a folder.", returncode=2)
            # (r42: a misspelt path was made and taken as an empty folder; a new install, with no
            # conversation whose files could be elsewhere, still gets its folder made)
            if not home.root.exists() and engine_folder.holds_conversations():
                raise CommandError(gettext(
                    "%(folder)s does not exist, so nothing was adopted: a wrong ENGINE_HOME taken as an empty folder "
                    "would have the files of this database's conversations counted as gone. Set ENGINE_HOME to the "
                    "folder that holds them. If that folder was lost for good, create an empty one there (mkdir) and "
                    "run this again.") % {"folder": home.root}, returncode=2)
            try:
                folder_id = engine_folder.adopt(home, force=True, take_from_other=take_from_other_database)
            except engine_folder.EngineFolderUnavailable as exc:
                if exc.reason == "not_this_folder":  # two databases erasing in one folder: never unasked
                    raise CommandError(gettext(
                        "%(folder)s is another database's engine folder (mark %(mark)s): adopting it would have two "
                        "databases erase in one folder, so nothing was adopted. If that database no longer uses it, "
                        "run manage.py engine_folder --adopt --take-from-other-database: the folder gets a new mark "
                        "and that database's deletes wait.") % {
                            "folder": exc.root, "mark": engine_folder.folder_mark(home) or "?"},
                        returncode=2) from None
                raise CommandError(f"{exc.root}: {engine_folder.described(exc.root, exc.reason)}.", returncode=2) from None
            except OSError as exc:  # a read-only mount, a folder of another user: one line
                if not os.path.isabs(str(exc.filename or "")):  # the folder, not one step of its path (r46)
                    exc.filename = str(home.root)
                raise io_error(exc, "Nothing was adopted", returncode=2) from None
            self.stdout.write(f"{home.root} is this database's engine folder now (mark {folder_id}).")
            if engine_folder.holds_undeleted_conversations() and not engine_folder.holds_files_of_known_conversations(
                    home):
                self.stdout.write(gettext(
                    "Note: it holds no file of any conversation this database has not deleted. If their files are "
                    "in another folder, set ENGINE_HOME to that one and run this again there: deletes erase in "
                    "the folder adopted last, and their checks look in it."))
            return
        reason = engine_folder.problem(home)
        recorded = engine_folder.recorded()
        if reason and recorded is None:
            why = ("it holds conversations, whose files must be somewhere" if reason == "missing"
                   else "it carries another database's mark" if reason == "not_this_folder"
                   and not engine_folder.holds_undeleted_conversations()
                   else "it holds none of the files of this database's conversations")
            then = ("Set ENGINE_HOME to the folder that holds their files (or mount it)." if reason == "missing" else
                    "Check that it is the right folder (or set ENGINE_HOME to the right one), then run manage.py "
                    f"engine_folder --adopt{TAKE if reason == 'not_this_folder' else ''}.")
            self.stdout.write(f"{home.root}: {engine_folder.described(home.root, reason)}. This database has recorded no engine folder "
                              f"yet and does not take this one by itself: {why}. Deletes wait. {then}")
            raise SystemExit(1)
        if reason == "not_this_folder" and engine_folder.is_copy():
            self.stdout.write(
                f"{home.root}: another database's engine folder. This database is a copy of the one that marked it "
                f"(mark {recorded}): that one was elsewhere (this one was restored from its backup into another "
                "database, or its file was moved or copied), and it may still erase in the folder. Deletes wait. If "
                f"this copy is the one to use the folder from now on, run manage.py engine_folder --adopt{TAKE}: the "
                "folder gets a new mark and the other's deletes wait.")
            raise SystemExit(1)
        if reason:
            self.stdout.write(f"{home.root}: {engine_folder.described(home.root, reason)} (this database's mark is {recorded}). "
                              "Deletes wait until it is back."
                              + (f" If this database is to use it and the other no longer does, run manage.py "
                                 f"engine_folder --adopt{TAKE}." if reason == "not_this_folder" else ""))
            raise SystemExit(1)
        if recorded is None:
            self.stdout.write(f"{home.root}: this database has recorded no engine folder yet; the first delete "
                              "or serve records this one.")
            return
        self.stdout.write(f"{home.root} is this database's engine folder (mark {recorded}).")
