from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from console.fields import whole_number
from console.management.commands.users import named
from console.models import ApiToken
from console.tokens import create_token, revoke_token


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "never"


class Command(BaseCommand):
    help = "List, create or revoke API tokens. A new token is printed once; only its hash is kept."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="Every token with its state and last use.")
        listing.add_argument("--user", default="", help="Only this user's tokens.")
        create = sub.add_parser("create", help="Make a token for a user and print it once.")
        create.add_argument("username")
        create.add_argument("--name", required=True)
        create.add_argument("--days", type=whole_number, default=None, help="Days until it expires (default API_TOKEN_DAYS).")
        revoke = sub.add_parser("revoke", help="Revoke a token by its id or its whole prefix (lethe_xxxxxx).")
        revoke.add_argument("token")

    def handle(self, *args, action: str, **options):
        getattr(self, f"do_{action}")(**options)

    def do_list(self, user: str, **options):
        tokens = ApiToken.objects.select_related("user")
        if user:
            found = named(user)
            if found is None:
                raise CommandError(f"No user named {user!r}.")
            tokens = tokens.filter(user=found)
        # Read before the header is written: a database that cannot be read leaves standard
        # output empty (manage.py's one line on standard error says why), not a table's header.
        tokens = list(tokens)
        self.stdout.write(f"{'ID':>5}  {'PREFIX':12}  {'STATE':8}  {'USER':16}  {'EXPIRES':20}  {'LAST USED':20}  NAME")
        for t in tokens:
            self.stdout.write(f"{t.pk:>5}  {t.prefix:12}  {t.state().value:8}  {t.user.get_username():16}  "
                              f"{_when(t.expires_at):20}  {_when(t.last_used_at):20}  {t.name}")

    def do_create(self, username: str, name: str, days: int | None, **options):
        self.stdout.write(issue(username, name=name, days=days))

    def do_revoke(self, token: str, **options):
        # An id, or a token's whole prefix (`list` shows both). Revoking cannot be undone, so the
        # start of a prefix is never enough: it only helps to name the tokens meant.
        if not token.strip():
            raise CommandError("Give a token's id or its prefix (api_tokens list shows both).")
        # ASCII digits only: str.isdigit also passes "²" (int() refuses it) and "٣" (int() reads 3)
        is_id = token.isascii() and token.isdigit()
        if is_id:
            found = list(ApiToken.objects.filter(pk=int(token)))
        else:
            found = list(ApiToken.objects.filter(prefix=token).order_by("pk"))
        if not found:
            # Prefixes are case-sensitive and SQLite's LIKE is not: the match is finished here.
            starting = [t for t in ApiToken.objects.filter(prefix__istartswith=token).order_by("pk")
                        if t.prefix.startswith(token)] if not is_id else []
            if starting:
                raise CommandError(f"No token has the prefix {token!r}; {_listed(starting)} start with it. Give a "
                                   f"whole prefix or an id; nothing was revoked.")
            raise CommandError(f"No token matches {token!r}.")
        if len(found) > 1:
            raise CommandError(f"{len(found)} tokens have the prefix {token!r}: {_listed(found)}. Give the id; "
                               f"nothing was revoked.")
        if revoke_token(found[0]):
            self.stdout.write(f"Revoked {found[0].prefix} ({found[0].name}).")
        else:
            self.stdout.write(f"{found[0].prefix} was already revoked.")


def issue(username: str, *, name: str, days: int | None) -> str:
    """Create a token for `username` and return the raw token (CommandError for bad input)."""
    user = named(username)
    if user is None:
        raise CommandError(f"No user named {username!r}.")
    if not user.is_active:  # every request with it would be refused
        raise CommandError(f"The user {username!r} is inactive: a token of theirs would be refused. Nothing was made.")
    try:
        _token, raw = create_token(user, name=name, days=days)
    except ValidationError as error:  # each message with what it is about (r42: "--days 0" said only its rule)
        raise CommandError(" ".join(f"--{field}: {message}" if field in ("name", "days") else message
                                    for field, messages in error.message_dict.items() for message in messages)) from error
    return raw


def _listed(tokens) -> str:
    return ", ".join(f"{t.prefix} (id {t.pk})" for t in tokens[:5]) + (", …" if len(tokens) > 5 else "")
