from __future__ import annotations

import statistics
import time
import uuid

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test import Client

from lifecycle.models import Conversation, Item
from lifecycle.paging import snapshot_page
from lifecycle.views import PAGE_SIZE, list_scope_of
from ops.static import ensure_static_files


class Command(BaseCommand):
    help = "Benchmark: render the main pages and API reads N times each and print p50/p95 in ms."

    def add_arguments(self, parser):
        parser.add_argument("--requests", type=int, default=40, help="Requests per page, from 1 to 100000.")

    def handle(self, *args, requests: int, **options):
        if not 1 <= requests <= 100_000:
            raise CommandError(f"--requests must be from 1 to 100000 (requests per page); got {requests}.")
        if ensure_static_files():
            self.stdout.write("Collected the static files first (pages need their manifest).")
        conversation = Conversation.objects.order_by("-last_activity_at").first()
        if conversation is None:
            raise CommandError("Seed some conversations first (manage.py seed_demo).")
        # A throwaway reader, removed again so the benchmark leaves no account behind.
        user = get_user_model().objects.create_user(username=f"bench-reader-{uuid.uuid4().hex[:8]}")
        try:
            self.measure(user, conversation, requests)
        finally:
            user.delete()

    def measure(self, user, conversation: Conversation, requests: int) -> None:
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        paths = [
            "/conversations/",
            "/conversations/?view=archived&q=test",
            self.third_page(),
            f"/conversations/{conversation.public_id}/",
            "/settings/system/data-storage/",
            "/v1/threads?limit=50",
            f"/v1/threads/{conversation.public_id}/items?limit=100",
        ]
        items = Item.objects.count()
        self.stdout.write(f"page benchmark ({connection.vendor}, {items:,} items, {requests} requests each)")
        for path in paths:
            client.get(path)  # warm
            timings = []
            for _ in range(requests):
                started = time.perf_counter()
                response = client.get(path)
                timings.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    raise CommandError(f"{path} answered {response.status_code}")
            timings.sort()
            p95 = timings[min(len(timings) - 1, int(len(timings) * 0.95))]
            label = path if "cursor=" not in path else path.split("cursor=")[0] + "cursor=<page 3>"
            self.stdout.write(f"  {label:<60} p50 {statistics.median(timings):7.1f} ms   p95 {p95:7.1f} ms")
        client.logout()

    @staticmethod
    def third_page() -> str:
        """The list's third page, reached by its cursor (pages are listed against a snapshot)."""
        qs = Conversation.objects.recent()
        cursor = None
        for _ in range(2):
            cursor = snapshot_page(qs, cursor, PAGE_SIZE, count=False, scope=list_scope_of("recent", "", "")).next
            if cursor is None:
                return "/conversations/"
        return f"/conversations/?cursor={cursor.encode()}"
