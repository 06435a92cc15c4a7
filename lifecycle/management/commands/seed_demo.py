from __future__ import annotations

import os
import secrets
import time
from contextlib import contextmanager
from datetime import date

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from console.management.cli import io_error
from lifecycle import engine_folder
from lifecycle.enginefs import EngineHome
from lifecycle.faults import kill_point
from lifecycle.models import Conversation
from lifecycle.seeding import Seeder

CREDENTIALS_FILE = "demo-credentials.txt"
DEMO_USERS = ("admin", "member")
SEED_LOCK = 0x4C455345  # "LESE": the advisory lock one seed holds while it checks and seeds (PostgreSQL)


@contextmanager
def alone():
    """A transaction a second seed's waits for: on SQLite its IMMEDIATE BEGIN takes the write
    lock; on PostgreSQL an advisory lock held to its end."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEED_LOCK])
        yield


class Command(BaseCommand):
    help = "Seed deterministic demo conversations in the database and the engine folder."

    def add_arguments(self, parser):
        parser.add_argument("--conversations", type=int, default=60)
        parser.add_argument("--messages", type=int, default=40, help="Average messages per conversation.")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--anchor", type=date.fromisoformat, default=None,
                            help="The day the data is 'now' for (YYYY-MM-DD, its noon UTC), for identical output; default the current moment.")
        parser.add_argument("--if-empty", action="store_true",
                            help="Seed only a new install: nothing when the database has accounts other than "
                                 "the demo ones; when conversations exist, only the demo users.")
        parser.add_argument("--no-users", action="store_true")

    def handle(self, *args, conversations, messages, seed, anchor, if_empty, no_users, **options):
        if not 2 <= conversations <= 1_000_000 or not 1 <= messages <= 10_000:
            # (a typo's 20-digit count ran until killed)
            raise CommandError("Seed 2 to 1,000,000 conversations with 1 to 10,000 messages each.")
        if settings.ENGINE_URL:  # (r22: it seeded local conversations and an engine folder here)
            words = ("Nothing was seeded: this console reaches a remote engine (ENGINE_URL) and keeps no "
                     "conversations of its own. Run seed_demo on the engine's host.")
            if if_empty:  # (make run: the console still starts)
                self.stdout.write(words)
                return
            raise CommandError(words, returncode=2)
        if if_empty and get_user_model().objects.exclude(username__in=DEMO_USERS).exists():
            # An install with accounts of its own, with or without conversations yet (r22, r24:
            # `make run` on it added a known-password admin account and demo conversations)
            self.stdout.write("This database has accounts of its own: no demo data or users were added or changed.")
            return
        if not no_users:
            self.check_chosen_password()
        self.logins: list[str] = []  # said once what made them is committed
        if self.seeded_already(if_empty, no_users):  # (no wait behind a seed running now, see below)
            self.say_logins()
            return
        home = EngineHome()
        started = time.perf_counter()
        kill_point("seed.checked")
        seeder = Seeder(seed=seed, anchor=anchor or timezone.now(), messages=messages, home=home)
        try:
            # Each step again under a lock a second seed started meanwhile waits for (r70: both
            # passed the check above and both seeded, or one died on a duplicate id; r71: one's
            # folder check met the other's half-made mark): the folder check (its mark committed
            # before the seed, so a seed killed later is run again into the same folder), then the
            # demo users and the seed, committed together: a seed that fails (a full disk) leaves
            # neither, nor the engine files it wrote, and prints no logins.
            with alone():
                done = self.seeded_already(if_empty, no_users)
                if not done:
                    self.check_folder(home)
            if not done:
                with alone():
                    done = self.seeded_already(if_empty, no_users)
                    if not done:
                        if not no_users:  # after the folder check: a refused seed creates no users either (r20)
                            self.users()
                        report = seeder.run(conversations)
        except BaseException as exc:
            seeder.discard()  # the transaction that held the seed's rows did not commit
            self.logins.clear()
            if isinstance(exc, OperationalError) and "locked" in str(exc):
                raise CommandError("Nothing was seeded: another process held the database's write lock for more "
                                   "than its wait (another seed?). Run seed_demo again when it ends.") from None
            if isinstance(exc, OSError):  # the engine folder's (or var's) disk full, read-only...
                raise io_error(exc, "Nothing was seeded", returncode=2) from None
            raise  # a full database: manage.py says so in one line (`full`)
        self.say_logins()
        if done:
            return
        elapsed = time.perf_counter() - started
        self.stdout.write(
            f"Seeded {report.conversations} conversations, {report.items} items and "
            f"{report.files} engine files in {elapsed:.1f} s."
        )

    def seeded_already(self, if_empty: bool, no_users: bool) -> bool:
        """Whether conversations exist: said (with --if-empty, the demo users made all the same),
        or refused."""
        if not Conversation.objects.exists():
            return False
        if not if_empty:
            raise CommandError("Conversations already exist; seed into an empty database.")
        if not no_users:
            self.users()
        self.stdout.write("Demo data already present; not seeding again.")
        return True

    @staticmethod
    def check_folder(home: EngineHome) -> None:
        """A new database takes (or makes) its engine folder here: never another database's."""
        try:
            engine_folder.check(home)
        except engine_folder.EngineFolderUnavailable as exc:
            # (r18: seeding wrote this database's files and subagent rows into another's folder,
            # replaced its legacy subagent file, and then took the folder as its own)
            advice = (" If no other database uses it any more (the one it was made with is gone), run manage.py "
                      "engine_folder --adopt --take-from-other-database, then seed again; otherwise set "
                      "ENGINE_HOME to another folder." if exc.reason == "not_this_folder" else
                      " Set ENGINE_HOME to this database's folder (or mount it)." if exc.reason == "missing" else
                      " Set ENGINE_HOME to this database's folder, or check it and run manage.py engine_folder --adopt.")
            raise CommandError(f"Nothing was seeded: the engine folder {exc.root} is {engine_folder.described(exc.root, exc.reason)}."
                               + advice, returncode=2) from None

    @staticmethod
    def check_chosen_password() -> None:
        """LETHE_DEMO_PASSWORD, when set, is one the password rules (AUTH_PASSWORD_VALIDATORS)
        accept, and not only blanks; else one line, exit 2, before anything is seeded or changed
        (r114: "a" and "   " became the demo users' passwords). The value is not shown."""
        chosen = os.environ.get("LETHE_DEMO_PASSWORD", "")
        if not chosen:
            return
        if not chosen.strip():
            why = "It is only blanks."
        else:
            try:
                validate_password(chosen)
                return
            except ValidationError as error:
                why = " ".join(error.messages)
        raise CommandError(f"Nothing was seeded or changed: LETHE_DEMO_PASSWORD is not a password Lethe accepts: "
                           f"{why} Set another one, or unset it to have one generated.", returncode=2)

    def say_logins(self) -> None:
        for line in self.logins:
            self.stdout.write(line)
        self.logins.clear()

    def users(self) -> None:
        """Create the demo users, and say (`say_logins`, once committed) only a password that
        signs them in.

        The password is LETHE_DEMO_PASSWORD (set on both users every run), else the one kept
        in var/demo-credentials.txt, else a new one, generated only while it can be set on
        a user being created now: an existing user's password is never replaced by a guess.
        """
        User = get_user_model()
        path = settings.VAR_DIR / CREDENTIALS_FILE
        chosen = os.environ.get("LETHE_DEMO_PASSWORD", "")
        password = chosen or (path.read_text().split()[-1] if path.exists() else "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(9)
        demo = []
        for username, staff in zip(DEMO_USERS, (True, False), strict=True):
            user, created = User.objects.get_or_create(username=username, defaults={"is_staff": staff})
            if created or chosen:
                user.set_password(password)
                user.is_staff = staff
                user.save()
            demo.append(user)
        valid = [u for u in demo if u.check_password(password)]
        if generated and valid:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"password {password}\n")
            path.chmod(0o600)
        if valid:
            logins = ", ".join(f"{u.username} / {password} ({'admin' if u.is_staff else 'read-only member'})"
                               for u in valid)
            self.logins.append(f"Demo logins: {logins}")
        for user in demo:
            if user not in valid:
                self.logins.append(
                    f"Demo login {user.username!r}: its password is not on record here "
                    f"({path} is missing or out of date), so it is not shown and was left unchanged. "
                    "Run with LETHE_DEMO_PASSWORD=... to set one."
                )
