"""The delete benchmark runs at a small size in every test run, and leaves nothing behind."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from lifecycle import fence
from lifecycle import models as m

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_prints_erase_raw_and_append_figures_at_small_size(engine_home):
    from django_q.models import OrmQ
    from django_q.tasks import async_task

    async_task("lifecycle.tasks.erase", 424242, q_options={"ack_failure": True})  # someone else's job: kept
    out = io.StringIO()
    call_command("bench_delete", "--sizes", "30,120", "--appends", "40", "--repeat", "2", stdout=out)
    result = json.loads(out.getvalue())
    assert result["engine"] == connection.vendor
    assert [s["items"] for s in result["sizes"]] == [30, 120]
    for s in result["sizes"]:
        assert s["erase_seconds"] > 0 and s["raw_seconds"] > 0 and s["ratio"] > 0 and s["runs"] == 2
        assert s["erase_median_seconds"] >= s["erase_seconds"]
        assert s["engine_files"] == 6 and s["erase_peak_python_kib"] > 0  # three files and their locks
    append = result["append"]
    assert append["samples"] == 40 and append["with_fence"]["p50_ms"] > 0 and append["without_fence"]["p99_ms"] > 0
    # Nothing left behind, and the fence is back in place.
    assert not m.Conversation.objects.exists() and not m.Account.objects.exists()
    assert not m.DeleteOperation.objects.exists() and not m.Item.objects.exists()
    assert not any(engine_home.rglob("*.jsonl"))
    assert fence.installed_triggers(connection) == fence.trigger_names(connection)
    # Its erase jobs too (r22: left queued for a cluster), and no other
    assert [job.task["args"] for job in OrmQ.objects.all()] == [(424242,)]
