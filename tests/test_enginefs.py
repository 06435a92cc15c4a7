from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

from lifecycle.enginefs import EngineHome


def _bump(root: str, times: int) -> None:
    home = EngineHome(root)
    for _ in range(times):
        def change(rows):
            counter = next((r for r in rows if r["agent_id"] == "counter"), None)
            if counter is None:
                return [*rows, {"agent_id": "counter", "n": 1}]
            counter["n"] += 1
            return rows

        home.update_fleet(change)


def _write_forever(root: str, path: str) -> None:
    home = EngineHome(root)
    n = 0
    while True:
        n += 1
        # Large enough that a kill often lands mid-write.
        home.write_atomic(Path(path), json.dumps({"n": n, "fill": "x" * 400_000}).encode())


def test_it_writes_atomically_and_leaves_no_temporary_file(tmp_path):
    home = EngineHome(tmp_path)
    target = home.events_path("c_1")
    home.write_atomic(target, b"first\n")
    home.write_atomic(target, b"second\n")
    assert target.read_bytes() == b"second\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["events.jsonl", "events.jsonl.lock"]


def test_it_serializes_concurrent_fleet_updates_across_processes(tmp_path):
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_bump, args=(str(tmp_path), 40)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    rows = EngineHome(tmp_path).read_fleet()
    assert rows == [{"agent_id": "counter", "n": 160}]


def test_it_keeps_a_whole_file_when_the_writer_is_killed_mid_write(tmp_path):
    target = tmp_path / "state" / "doc.json"
    EngineHome(tmp_path).write_atomic(target, json.dumps({"n": 0, "fill": ""}).encode())
    ctx = multiprocessing.get_context("fork")
    seen = set()
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        writer = ctx.Process(target=_write_forever, args=(str(tmp_path), str(target)))
        writer.start()
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        document = json.loads(target.read_bytes())  # never torn
        seen.add(document["n"])
        # A killed writer may leave a temporary file; the sweep removes it and nothing else.
        EngineHome(tmp_path).sweep_temporaries()
        assert [p.name for p in target.parent.iterdir() if ".tmp-" in p.name] == []
        assert target.exists()
    assert max(seen) > 0


def test_it_appends_whole_lines_and_sets_a_torn_tail_aside(tmp_path):
    home = EngineHome(tmp_path)
    log = home.receipts_path("c_2")
    home.append_jsonl(log, [{"a": 1}, {"a": 2}])
    with open(log, "ab") as handle:
        handle.write(b'{"a": 3, "trunc')  # a crash in the middle of a line
    torn = home.recover_torn_tail(log)
    assert torn is not None and torn.name == "approval_receipts.jsonl.torn-1"
    assert torn.read_bytes() == b'{"a": 3, "trunc'
    assert home.read_jsonl(log) == [{"a": 1}, {"a": 2}]
    assert home.recover_torn_tail(log) is None


def test_it_reports_usage_per_conversation(tmp_path):
    home = EngineHome(tmp_path)
    home.write_atomic(home.events_path("c_a"), b"12345")
    home.write_atomic(home.artifacts_dir("c_a") / "out.txt", b"123")
    home.write_atomic(home.events_path("c_b"), b"1")
    files, size = home.conversation_usage("c_a")
    # Lock files are zero bytes and count as files the conversation owns.
    assert size == 8
    assert files == 4


def test_it_never_sweeps_the_temporary_file_of_a_writer_that_holds_the_lock(tmp_path):
    import threading

    home = EngineHome(tmp_path)
    target = home.fleet_path
    target.parent.mkdir(parents=True)
    tmp = target.with_name(target.name + ".tmp-live")
    tmp.write_bytes(b"{}")
    swept = []
    with home.locked(home.fleet_lock):  # a live writer, mid-write
        sweeper = threading.Thread(target=lambda: swept.append(home.sweep_temporaries()))
        sweeper.start()
        sweeper.join(0.5)
        assert sweeper.is_alive() and tmp.exists()
    sweeper.join(5)
    assert swept == [1] and not tmp.exists()
