from __future__ import annotations

from django.core.management.base import BaseCommand

from console.fields import whole_number
from console.management.commands.api_tokens import issue


class Command(BaseCommand):
    help = "Create an API token for a user and print it once (same as `api_tokens create`)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="Default: “<user> token”.")
        parser.add_argument("--days", type=whole_number, default=None,
                            help="Days until it expires (default API_TOKEN_DAYS).")

    def handle(self, *args, username: str, name: str, days: int | None, **options):
        default = f"{username} token"
        if len(default) > 120:  # a name's limit; the operator gave none, so none is refused (r45)
            default = f"{username[:113]}… token"
        self.stdout.write(issue(username, name=name or default, days=days))
