from __future__ import annotations

import json
from datetime import UTC, datetime

from retention.reducer import MARKER_KEY, Skip, apply, encoded_size, measure, plan

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_it_removes_shell_output_and_keeps_the_command():
    payload = {"command": "make", "cwd": "/w", "exit_code": 2, "truncated": False, "stdout": "o" * 500, "stderr": "e" * 20}
    reduced, result = apply("shell", payload, removed_at=NOW)
    assert set(reduced) == {"command", "cwd", "exit_code", "truncated", MARKER_KEY}
    assert reduced[MARKER_KEY]["removed_fields"] == ["stdout", "stderr"]
    assert result.removed_bytes == encoded_size("o" * 500) + encoded_size("e" * 20)
    assert "ooo" not in json.dumps(reduced)


def test_it_removes_each_edit_change_content_and_keeps_paths_and_lines():
    payload = {"changes": [{"path": "a.py", "change_type": "modify", "start_line": 3, "end_line": 9,
                            "old_content": "old", "new_content": "new", "diff": "-old\n+new"}]}
    reduced, result = apply("edit_file", payload, removed_at=NOW)
    assert reduced["changes"] == [{"path": "a.py", "change_type": "modify", "start_line": 3, "end_line": 9}]
    assert result.removed_fields == ("changes[0].old_content", "changes[0].new_content", "changes[0].diff")


def test_it_keeps_what_each_kind_keeps():
    cases = {
        "read_file": ({"path": "p", "range": [1, 2], "line_count": 2, "content": "x"}, {"path", "range", "line_count"}),
        "search": ({"query": "q", "scope": "s", "file_count": 1, "matches": ["f"]}, {"query", "scope", "file_count"}),
        "http": ({"url": "u", "method": "GET", "status": 200, "response": "r"}, {"url", "method", "status"}),
        "generic": ({"tool_name": "t", "input": {"a": 1}, "output": "text"}, {"tool_name"}),
    }
    for kind, (payload, kept) in cases.items():
        reduced, _ = apply(kind, payload, removed_at=NOW)
        assert set(reduced) - {MARKER_KEY} == kept, kind


def test_it_skips_what_it_must_not_reduce():
    assert plan("plan", {"steps": []}).skip == Skip.PROTECTED
    assert plan("monitor", {"x": 1}).skip == Skip.PROTECTED
    assert plan("generic", {"tool_name": "t", "output": {"rows": 3}}).skip == Skip.PROTECTED
    assert plan("shell", None).skip == Skip.NO_PAYLOAD
    assert plan("shell", "not an object").skip == Skip.MALFORMED
    assert plan("shell", {MARKER_KEY: {}, "command": "x"}).skip == Skip.ALREADY_REMOVED
    assert plan("teleport", {"x": 1}).skip == Skip.UNSUPPORTED
    assert plan("edit_file", {"changes": "nope"}).skip == Skip.MALFORMED
    assert plan("shell", {"command": "x", "stdout": "a" * 100}, size=17 * 1024 * 1024).skip == Skip.OVERSIZE


def test_it_measures_sizes_when_an_item_is_written():
    payload = {"command": "ls", "stdout": "abc"}
    size, removable = measure("shell", payload)
    assert size == encoded_size(payload)
    assert removable == encoded_size("abc")
    assert measure("plan", {"steps": [1]})[1] == 0
    assert measure("shell", None) == (0, 0)
