"""The tool payload benchmark runs at a small size in every test run, in its own scratch database."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from lifecycle.models import Conversation, Item
from retention.models import ToolPayloadOperation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("writer", ["append", "update"])
def test_it_prints_analysis_cleanup_statement_append_and_memory_figures(engine_home, writer):
    name = connection.settings_dict["NAME"]
    out = io.StringIO()
    call_command("bench_tool_payloads", "--messages", "600", "--per-conversation", "30", "--output-bytes", "500",
                 "--alone-seconds", "0.5", "--writer", writer, stdout=out)
    result = json.loads(out.getvalue())
    assert result["foreground_writer"] == writer
    assert result["engine"] == connection.vendor and result["messages"] == 600 and result["conversations"] == 20
    assert result["eligible_messages"] == 18 * 10  # nine in ten conversations are old; every third message a tool
    assert result["analysis"]["exact"] is True and result["analysis"]["eligible_messages"] == 180
    assert result["cleanup"]["state"] == "succeeded" and result["cleanup"]["removed_messages"] == 180
    assert result["cleanup"]["seconds"] > 0 and result["single_statement"]["seconds"] > 0
    # Appends alone (half a second before the cleanup) and beside it, apart: a tiny cleanup may
    # see none beside it, and then has no figures rather than the ones from before it.
    alone, during = result["foreground_append_alone"], result["foreground_append"]
    assert alone["samples"] > 0 and alone["p99_ms"] > 0 and alone["seconds"] == 0.5
    assert (during["p99_ms"] is None) == (during["samples"] == 0)
    assert "cleanup_rss_growth_mb" in result["memory"]
    # The configured database is untouched and in use again.
    assert connection.settings_dict["NAME"] == name
    assert not Conversation.objects.exists() and not Item.objects.exists()
    assert not ToolPayloadOperation.objects.exists()
