"""`manage.py users`: the console's people, for operators (there is no user screen).

Two roles: an admin (a staff user, console/auth.py) acts; a member reads everything and
changes nothing. A new install has no user: `users create NAME --role admin` makes the first.
Passwords are asked for on a terminal (twice, not echoed) or read from standard input with
`--password-stdin` (one line), never taken as an argument (it would stay in the shell's history
and in the process list), and must pass the password rules in settings. The last active admin
cannot be made a member or deactivated: nobody could act on the console then. Deactivating
someone ends their sessions (their stored sessions are deleted: activating them again does not
sign a kept cookie back in, r96) and stops their API tokens at once (a token checks the account
on each request); activating them again brings back the tokens that have not expired.

A name is taken in the normal form the sign-in form reads it in (Unicode NFKC, the user model's
`normalize_username`: a full-width `ｆｕｌｌ` is `full`, an accent typed as a combining mark is
the accented letter), for `create` and for every command that names a user (r123: a name
stored as typed could never sign in; console 0005 stored the names made before in that form,
but for one whose normal form another user has or would be too long). A new name that differs from a user's only in case is
refused, as Django's own user creation form refuses it: the two would be taken for each other,
and they share a sign-in lock (console/throttle.py counts failures by the name case-folded).
Two creates at once take turns (`_one_create_at_a_time`), so neither misses the other's name.
"""

from __future__ import annotations

import getpass
import sys

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from console.models import ApiToken

ROLES = ("admin", "member")
CREATE_LOCK = 0x4C455355  # "LESU": the advisory lock a create holds while it checks the names and saves (PostgreSQL)


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "never"


def _end_sessions(user) -> int:
    """Delete the user's stored sessions (a session names its user inside its signed data, so
    each unexpired one is read); how many."""
    from django.contrib.auth import SESSION_KEY
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    ids = str(user.pk)
    theirs = [session.pk for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator()
              if session.get_decoded().get(SESSION_KEY) == ids]
    for start in range(0, len(theirs), 500):  # (SQLite takes a bounded number of values a statement)
        Session.objects.filter(pk__in=theirs[start:start + 500]).delete()
    return len(theirs)


def named(username: str, *, lock: bool = False):
    """The user a typed name names, or None: the name in its normal form (NFKC, as the sign-in
    form reads it and `users create` stores it), else as typed (a name stored before names were
    normalised, r123); locked until the transaction ends with `lock`."""
    model = get_user_model()
    normal = model.normalize_username(username)
    users = model.objects.filter(username__in={normal, username})
    if lock:
        users = users.select_for_update()
    found = {user.get_username(): user for user in users}
    return found.get(normal) or found.get(username)


def _one_create_at_a_time() -> None:
    """Make a second create wait until this transaction ends. Locking the users' rows does not:
    a name not yet saved has no row, so two creates of `ana` and `Ana` at once on PostgreSQL each
    found neither and both were made. SQLite's IMMEDIATE transactions already take turns."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CREATE_LOCK])


def _role(user) -> str:
    return "admin" if user.is_staff else "member"


class Command(BaseCommand):
    help = ("List the console's users, create one (the first admin of a new install too), change a role or a "
            "password, deactivate or activate one. Passwords are asked for, or read from standard input.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="Every user with role, state, last sign-in and active API tokens.")
        create = sub.add_parser("create", help="Make a user (admin acts; member reads only).")
        create.add_argument("username")
        create.add_argument("--role", choices=ROLES, required=True)
        create.add_argument("--password-stdin", action="store_true",
                            help="Read the password from standard input (one line) instead of asking.")
        role = sub.add_parser("set-role", help="Make a user an admin or a member.")
        role.add_argument("username")
        role.add_argument("role", choices=ROLES)
        password = sub.add_parser("set-password", help="Give a user a new password (their sessions end).")
        password.add_argument("username")
        password.add_argument("--password-stdin", action="store_true",
                              help="Read the password from standard input (one line) instead of asking.")
        for name, text in (("deactivate", "Stop a user from signing in; their sessions and API tokens stop now."),
                           ("activate", "Let a deactivated user sign in again.")):
            sub.add_parser(name, help=text).add_argument("username")

    def handle(self, *args, action: str, **options):
        getattr(self, "do_" + action.replace("-", "_"))(**options)

    # ---- actions

    def do_list(self, **options):
        users = list(get_user_model().objects.order_by("username"))
        tokens: dict[int, int] = {}
        for token in ApiToken.objects.filter(user__in=users):
            if token.state().value == "active":
                tokens[token.user_id] = tokens.get(token.user_id, 0) + 1
        lines = [f"{'USERNAME':20}  {'ROLE':6}  {'STATE':11}  {'LAST SIGN-IN':20}  TOKENS"]
        for user in users:
            lines.append(f"{user.get_username():20}  {_role(user):6}  {'active' if user.is_active else 'deactivated':11}  "
                         f"{_when(user.last_login):20}  {tokens.get(user.pk, 0)}")
        self.stdout.write("\n".join(lines))

    def do_create(self, username: str, role: str, password_stdin: bool, **options):
        model = get_user_model()
        field = model._meta.get_field(model.USERNAME_FIELD)
        typed = username
        try:
            username = field.clean(model.normalize_username(username), None)
        except ValidationError as error:
            raise CommandError(f"Not a username: {' '.join(error.messages)}") from None
        self._refuse_taken(username)
        user = model(username=username, is_staff=role == "admin", is_active=True)
        user.set_password(self._password(user, password_stdin))
        with transaction.atomic():
            _one_create_at_a_time()
            self._refuse_taken(username, lock=True)
            user.save()
        shown = f"; typed as {typed!r}, it is kept in the form the sign-in page reads" if username != typed else ""
        self.stdout.write(f"Created {username} ({role}){shown}.")

    def do_set_role(self, username: str, role: str, **options):
        with transaction.atomic():
            self._lock_admins()
            user = self._user(username)
            if role == "member" and user.is_staff and user.is_active:
                self._keep_an_admin(user, "make them a member")
            user.is_staff = role == "admin"
            user.save(update_fields=["is_staff"])
        self.stdout.write(f"{user.get_username()} is now {'an admin' if role == 'admin' else 'a member'}.")

    def do_set_password(self, username: str, password_stdin: bool, **options):
        user = self._user(username)
        user.set_password(self._password(user, password_stdin))
        user.save(update_fields=["password"])
        self.stdout.write(f"New password set for {user.get_username()}; their sessions have ended.")

    def do_deactivate(self, username: str, **options):
        with transaction.atomic():
            self._lock_admins()
            user = self._user(username)
            if user.is_staff and user.is_active:
                self._keep_an_admin(user, "deactivate them")
            user.is_active = False
            user.save(update_fields=["is_active"])
            _end_sessions(user)
        self.stdout.write(f"{user.get_username()} is deactivated: they cannot sign in, and their API tokens stop working.")

    def do_activate(self, username: str, **options):
        user = self._user(username)
        if user.is_active:  # (r22: "can sign in again" of a user never deactivated)
            self.stdout.write(f"{user.get_username()} is active already: nothing changed.")
            return
        user.is_active = True
        user.save(update_fields=["is_active"])
        self.stdout.write(f"{user.get_username()} can sign in again.")

    # ---- helpers

    def _user(self, username: str):
        """The user by name (`named`); locked until the caller's transaction ends when there is
        one."""
        user = named(username, lock=transaction.get_connection().in_atomic_block)
        if user is None:
            raise CommandError(f"No user named {username!r} (users list shows them).")
        return user

    @staticmethod
    def _refuse_taken(username: str, *, lock: bool = False) -> None:
        """Refuse a new name that a user has already, or that differs from a user's name only in
        case (both in their normal form). Every name is compared here, not in the database:
        SQLite's case-insensitive match folds ASCII only."""
        model = get_user_model()
        users = model.objects.select_for_update() if lock else model.objects.all()
        names = list(users.order_by("pk").values_list("username", flat=True))
        if username in names:
            raise CommandError(f"There is already a user named {username!r}.")
        wanted = username.casefold()
        for taken in names:
            if model.normalize_username(taken).casefold() == wanted:
                raise CommandError(f"There is already a user named {taken!r}, the same name but for case or the "
                                   f"width of its characters; nothing was changed.")

    @staticmethod
    def _lock_admins() -> None:
        """Lock the active admins' rows, in one order, before anything else: two commands at once
        (each taking away one of the last two admins) then wait for each other instead of each
        locking one row and deadlocking on the other."""
        list(get_user_model().objects.select_for_update().filter(is_staff=True, is_active=True)
             .order_by("pk").values_list("pk", flat=True))

    def _keep_an_admin(self, user, doing: str) -> None:
        """Refuse to leave the console without an active admin (the rows are locked: two commands
        at once cannot each take away one of the last two)."""
        model = get_user_model()
        others = list(model.objects.select_for_update().filter(is_staff=True, is_active=True).exclude(pk=user.pk))
        if not others:
            raise CommandError(f"{user.get_username()} is the only active admin: make another user an admin "
                               f"first, then {doing}.")

    def _password(self, user, from_stdin: bool) -> str:
        if from_stdin:
            # One line of UTF-8, read as bytes (the text layer would pass undecodable bytes on as
            # surrogates); its line ending, LF or CRLF (a file written on Windows), is not part of it.
            raw = getattr(sys.stdin, "buffer", None)
            line = raw.readline() if raw is not None else sys.stdin.readline().encode("utf-8", "surrogateescape")
            try:
                password = line.decode("utf-8")
            except UnicodeDecodeError:
                raise CommandError("The password on standard input is not UTF-8 text; nothing was changed.") from None
            password = password.removesuffix("\n").removesuffix("\r")
            if not password:
                raise CommandError("No password on standard input.")
        else:
            if not sys.stdin.isatty():
                raise CommandError("Standard input is not a terminal: give the password with --password-stdin.")
            try:
                password = getpass.getpass("Password: ")
                again = getpass.getpass("Password (again): ")
            except EOFError:  # Ctrl-D at the prompt (r98: a traceback)
                raise CommandError("No password was given (end of input); nothing was changed.") from None
            if again != password:
                raise CommandError("The two passwords differ; nothing was changed.")
        if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in password):
            # A NUL, a tab, a stray carriage return...: the sign-in form could never send it
            raise CommandError("The password holds a control character, which cannot be typed at sign-in; nothing "
                               "was changed.")
        try:
            password_validation.validate_password(password, user)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages) + " Nothing was changed.") from None
        return password
