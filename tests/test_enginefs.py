from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource
import secrets
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from lifecycle.enginefs import (
    EngineHome,
    EnginePathError,
    InvalidStorageKey,
    UnreadableEngineFile,
    UnsafeEnginePath,
)
from tests.swapping import FORK, attempts_until, swapping

A = "c_" + "a" * 20
B = "c_" + "b" * 20


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


def _write_forever(root: str, path: str, wrote) -> None:
    home = EngineHome(root)
    n = 0
    while True:
        n += 1
        # Large enough that a kill often lands mid-write.
        home.write_atomic(Path(path), json.dumps({"n": n, "fill": "x" * 400_000}).encode())
        wrote.set()


def _run(target, *args, timeout: float = 60) -> int:
    child = FORK.Process(target=target, args=args)
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        raise AssertionError("child did not finish")
    return child.exitcode


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# Paths ------------------------------------------------------------------------------------

BAD_KEYS = ["/etc", "../etc", "..", "", "c_1", "c_" + "A" * 20, "c_" + "a" * 19, "c_" + "a" * 21,
            "c_" + "a" * 20 + "\n", "c_" + "g" * 20, "c_" + "a" * 18 + "/.", "x_" + "a" * 20, None, 7]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_it_refuses_anything_but_a_public_id_as_a_storage_key(tmp_path, key):
    home = EngineHome(tmp_path / "refusing")
    helpers = [home.thread_dir, home.events_path, home.session_dir, home.receipts_path,
               home.artifacts_dir, home.conversation_paths, home.conversation_usage]
    for helper in helpers:
        with pytest.raises(InvalidStorageKey) as refused:
            helper(key)
        assert isinstance(refused.value, ValueError)
    assert not (tmp_path / "refusing").exists()


def test_it_returns_resolved_folders_inside_the_engine_folder(tmp_path):
    real = tmp_path / "real-engine"
    real.mkdir()
    (tmp_path / "eng").symlink_to(real)  # the engine folder itself may be reached by a link
    home = EngineHome(tmp_path / "eng")
    paths = home.conversation_paths(A)
    assert paths == [real / "threads" / A, real / "sessions" / A, real / "artifacts" / A]
    assert all(p.resolve() == p and p.is_relative_to(real) for p in paths)


def test_it_never_hands_out_a_conversation_folder_behind_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_bytes(b"keep me")
    home = EngineHome(tmp_path / "eng")
    home.write_atomic(home.events_path(B), b"bbb\n")
    (tmp_path / "eng" / "threads" / A).symlink_to(outside)
    (tmp_path / "eng" / "sessions").mkdir()
    (tmp_path / "eng" / "sessions" / A).symlink_to(home.thread_dir(B))  # another conversation's
    for helper in (home.conversation_paths, home.thread_dir, home.events_path, home.session_dir):
        with pytest.raises(UnsafeEnginePath):
            helper(A)
    with pytest.raises(UnsafeEnginePath):
        home.write_atomic(home.events_path(A), b"x")
    assert home.conversation_usage(A) == (0, 0)  # links are not followed, not counted
    assert (outside / "precious.txt").read_bytes() == b"keep me"
    assert names(outside) == ["precious.txt"]


def test_it_refuses_an_area_folder_that_is_a_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / A).mkdir(parents=True)
    (tmp_path / "eng").mkdir()
    (tmp_path / "eng" / "artifacts").symlink_to(elsewhere)
    home = EngineHome(tmp_path / "eng")
    with pytest.raises(UnsafeEnginePath):
        home.conversation_paths(A)
    assert home.thread_dir(A) == tmp_path / "eng" / "threads" / A


# Whole-file writes --------------------------------------------------------------------------

def test_it_writes_atomically_and_leaves_no_temporary_file(tmp_path):
    home = EngineHome(tmp_path)
    target = home.events_path(A)
    home.write_atomic(target, b"first\n")
    home.write_atomic(target, b"second\n")
    assert target.read_bytes() == b"second\n"
    assert names(target.parent) == ["events.jsonl", "events.jsonl.lock"]


def test_it_serializes_concurrent_fleet_updates_across_processes(tmp_path):
    workers = [FORK.Process(target=_bump, args=(str(tmp_path), 40)) for _ in range(4)]
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
    seen = set()
    for delay in (0.05, 0.11, 0.17, 0.23, 0.31):
        wrote = FORK.Event()
        writer = FORK.Process(target=_write_forever, args=(str(tmp_path), str(target), wrote))
        writer.start()
        assert wrote.wait(60)  # however slow the start, the kill lands among writes
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        document = json.loads(target.read_bytes())  # never torn
        seen.add(document["n"])
        # A killed writer may leave a temporary file; the sweep removes it and nothing else.
        EngineHome(tmp_path).sweep_temporaries()
        assert names(target.parent) == ["doc.json", "doc.json.lock"]
    assert max(seen) > 0


def _limited(limit: int, die: bool) -> None:
    """A real size limit: writes past `limit` bytes fail (EFBIG), or kill the process (SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL if die else signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _write_limited(root: str, path: str, limit: int) -> None:
    _limited(limit, die=False)
    try:
        EngineHome(root).write_atomic(Path(path), b"n" * 50_000)
    except OSError as error:
        os._exit(10 if error.errno == errno.EFBIG else 11)
    os._exit(0)


def test_a_failed_write_removes_its_temporary_and_keeps_the_old_file(tmp_path):
    home = EngineHome(tmp_path)
    target = home.artifacts_dir(A) / "out.txt"
    home.write_atomic(target, b"old contents")
    assert _run(_write_limited, str(tmp_path), str(target), 20_000) == 10
    assert target.read_bytes() == b"old contents"
    assert names(target.parent) == ["out.txt", "out.txt.lock"]


def test_it_refuses_to_write_a_file_named_like_its_own_temporaries(tmp_path):
    home = EngineHome(tmp_path)
    with pytest.raises(UnsafeEnginePath):
        home.write_atomic(home.artifacts_dir(A) / ".x.lethe-tmp-0123456789abcdef", b"x")


def test_it_fsyncs_each_new_folder_into_its_parent(tmp_path, monkeypatch):
    home = EngineHome(tmp_path / "eng")
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    home.write_atomic(home.artifacts_dir(A) / "deep" / "out.txt", b"x")
    root = tmp_path / "eng"
    for folder in (tmp_path, root, root / "artifacts", root / "artifacts" / A, root / "artifacts" / A / "deep"):
        assert str(folder) in synced  # each parent synced after a child folder appeared in it


# JSONL logs and torn tails ----------------------------------------------------------------------

def test_it_appends_whole_lines_and_sets_a_torn_tail_aside(tmp_path):
    home = EngineHome(tmp_path)
    log = home.receipts_path(B)
    home.append_jsonl(log, [{"a": 1}, {"a": 2}])
    with open(log, "ab") as handle:
        handle.write(b'{"a": 3, "trunc')  # a crash in the middle of a line
    torn = home.recover_torn_tail(log)
    assert torn is not None and torn.name == "approval_receipts.jsonl.torn-1"
    assert torn.read_bytes() == b'{"a": 3, "trunc'
    assert home.read_jsonl(log) == [{"a": 1}, {"a": 2}]
    assert home.recover_torn_tail(log) is None
    assert names(log.parent) == ["approval_receipts.jsonl", "approval_receipts.jsonl.lock",
                                 "approval_receipts.jsonl.torn-1"]


def test_an_append_after_a_torn_line_keeps_the_new_record(tmp_path):
    home = EngineHome(tmp_path)
    log = home.receipts_path(B)
    home.append_jsonl(log, [{"a": 1}])
    with open(log, "ab") as handle:
        handle.write(b'{"a": 2, "tr')
    home.append_jsonl(log, [{"a": 3}])
    assert home.read_jsonl(log) == [{"a": 1}, {"a": 3}]
    assert log.read_bytes().endswith(b'{"a":3}\n')
    assert (log.parent / "approval_receipts.jsonl.torn-1").read_bytes() == b'{"a": 2, "tr'


def _append_limited(root: str, path: str, limit: int, die: bool) -> None:
    _limited(limit, die)
    try:
        EngineHome(root).append_jsonl(Path(path), [{"record": "big", "fill": "y" * 20_000}])
    except OSError as error:
        os._exit(10 if error.errno == errno.EFBIG else 11)
    os._exit(0)


def test_a_failed_append_leaves_no_torn_line(tmp_path):
    home = EngineHome(tmp_path)
    log = home.events_path(A)
    home.append_jsonl(log, [{"n": 1}, {"n": 2}])
    before = log.read_bytes()
    # Room for part of the record: the kernel writes that much, then refuses the rest.
    assert _run(_append_limited, str(tmp_path), str(log), len(before) + 7000, False) == 10
    assert log.read_bytes() == before
    home.append_jsonl(log, [{"n": 3}])
    assert home.read_jsonl(log) == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert names(log.parent) == ["events.jsonl", "events.jsonl.lock"]


def test_an_append_killed_mid_write_does_not_swallow_the_next_record(tmp_path):
    home = EngineHome(tmp_path)
    log = home.events_path(A)
    home.append_jsonl(log, [{"n": 1}])
    before = log.read_bytes()
    exit_code = _run(_append_limited, str(tmp_path), str(log), len(before) + 7000, True)
    assert exit_code == -signal.SIGXFSZ  # killed by the kernel in the middle of the record
    torn = log.read_bytes()[len(before):]
    assert len(torn) == 7000 and not torn.endswith(b"\n")
    home.append_jsonl(log, [{"n": 2}])
    assert home.read_jsonl(log) == [{"n": 1}, {"n": 2}]
    assert (log.parent / "events.jsonl.torn-1").read_bytes() == torn


def _recover_dying_at(root: str, path: str, call: int) -> None:
    """Run the recovery, killing this process just before its `call`-th file-system change."""
    count = [0]

    def dying(real):
        def step(*args, **kwargs):
            count[0] += 1
            if count[0] == call:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return step

    for name in ("open", "write", "fsync", "ftruncate", "replace", "rename", "mkdir", "unlink"):
        setattr(os, name, dying(getattr(os, name)))
    EngineHome(root).recover_torn_tail(Path(path))
    os._exit(0)


def test_torn_tail_recovery_leaves_one_torn_file_after_a_crash_at_any_point(tmp_path):
    whole = b'{"a":1}\n{"a":2}\n'
    torn = b'{"a":3,"tr'
    call = 0
    while True:
        call += 1
        root = tmp_path / f"run-{call}"
        home = EngineHome(root)
        log = home.receipts_path(A)
        home.append_jsonl(log, [{"a": 1}, {"a": 2}])
        with open(log, "ab") as handle:
            handle.write(torn)
        exit_code = _run(_recover_dying_at, str(root), str(log), call)
        # Restart: the recovery runs again (as the next append would), then the sweep.
        home.recover_torn_tail(log)
        home.sweep_temporaries()
        assert log.read_bytes() == whole, call
        assert names(log.parent) == ["approval_receipts.jsonl", "approval_receipts.jsonl.lock",
                                     "approval_receipts.jsonl.torn-1"], call
        assert (log.parent / "approval_receipts.jsonl.torn-1").read_bytes() == torn
        assert home.recover_torn_tail(log) is None
        if exit_code == 0:  # the run got past its last step: every crash point was tried
            break
        assert exit_code == -signal.SIGKILL
    assert call > 6


# Links and FIFOs where an engine file should be ------------------------------------------------

PRECIOUS = b"line one\nprecious text without a final newline"


class Blocked(BaseException):
    """Raised by the alarm (not an OSError, which the readers here catch)."""


@pytest.fixture
def never_blocks():
    """Turns an open() that waits for a FIFO's other end into a failure instead of a hang."""

    def stop(signum, frame):
        raise Blocked("waited on a FIFO")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _plant(home: EngineHome, where: str, tmp_path: Path, kind: str, key: str = A) -> Path:
    """A link to a file outside the engine folder, or a FIFO, at one of the files an append,
    a recovery or a fleet update opens; returns the path of what was planted."""
    log = home.events_path(key)
    path = {"log": log, "lock": home.lock_for(log), "pending": log.with_name(".events.jsonl.torn-pending"),
            "fleet": home.fleet_path, "fleet lock": home.fleet_lock}[where]
    path.parent.mkdir(parents=True, exist_ok=True)
    if where == "pending":
        log.write_bytes(b'{"a":1}\n{"torn')  # so that the recovery reads the pending file
    if kind == "link":
        outside = tmp_path / "outside" / "outside.txt"
        outside.parent.mkdir()
        outside.write_bytes(PRECIOUS)
        path.symlink_to(outside)
    else:
        os.mkfifo(path)
    return path


def _writes(home: EngineHome) -> dict:
    return {"append": lambda: home.append_jsonl(home.events_path(A), [{"note": "CONTENT"}]),
            "recover": lambda: home.recover_torn_tail(home.events_path(A)),
            "update fleet": lambda: home.update_fleet(lambda rows: [*rows, {"agent_id": "sa_1"}])}


@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize(("where", "write"), [
    ("log", "append"), ("log", "recover"), ("lock", "append"), ("lock", "recover"),
    ("pending", "append"), ("pending", "recover"), ("fleet lock", "update fleet"),
])
def test_a_log_or_lock_that_is_a_link_or_a_fifo_is_refused_never_followed_nor_waited_on(
        tmp_path, never_blocks, kind, where, write):
    home = EngineHome(tmp_path / "eng")
    planted = _plant(home, where, tmp_path, kind)
    with pytest.raises(UnsafeEnginePath):
        _writes(home)[write]()
    if kind == "link":
        assert (tmp_path / "outside" / "outside.txt").read_bytes() == PRECIOUS  # not cut, nothing appended
        assert names(tmp_path / "outside") == ["outside.txt"]  # and no torn file, lock or temporary there
        assert planted.is_symlink()
    else:
        assert stat.S_ISFIFO(os.lstat(planted).st_mode)


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_the_fleet_file_as_a_link_or_a_fifo_is_unreadable_and_never_written(tmp_path, never_blocks, kind):
    home = EngineHome(tmp_path / "eng")
    planted = _plant(home, "fleet", tmp_path, kind)
    for read in (home.read_fleet, lambda: home.update_fleet(lambda rows: [{"agent_id": "sa_1"}])):
        with pytest.raises(UnreadableEngineFile) as refused:
            read()
        assert refused.value.reason == "unreadable"
    assert home.try_read_fleet().problem.reason == "unreadable"
    assert planted.is_symlink() if kind == "link" else stat.S_ISFIFO(os.lstat(planted).st_mode)
    if kind == "link":
        assert (tmp_path / "outside" / "outside.txt").read_bytes() == PRECIOUS


def test_a_fleet_folder_that_is_a_link_is_never_written_through(tmp_path, never_blocks):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "eng").mkdir()
    (tmp_path / "eng" / "state").symlink_to(elsewhere)
    home = EngineHome(tmp_path / "eng")
    with pytest.raises(UnsafeEnginePath):
        home.update_fleet(lambda rows: [{"agent_id": "sa_1"}])
    assert names(elsewhere) == []  # no lock, no temporary, no fleet file written there


@pytest.mark.parametrize("operation", ["append", "write", "recover"])
def test_nothing_lands_outside_the_engine_folder_while_its_folder_is_swapped_for_a_link(tmp_path, operation):
    """r6-3. The folder was checked (realpath) and then the file opened by path name: another
    process swapping the conversation's folder for a link in between had an append (the
    conversation's text), a whole-file write or a recovery's cut and rename land outside the
    engine folder. Every step now goes through one folder descriptor, reached without links."""
    outside = tmp_path / "outside"
    outside.mkdir()
    home = EngineHome(tmp_path / "engine")
    log = home.events_path(A)
    home.append_jsonl(log, [{"n": 0}])
    real = log.parent
    link = real.with_name(A + ".link")
    link.symlink_to(outside)
    # Held open on the log itself, wherever its folder is: adds a torn line before each recovery.
    writer = os.open(log, os.O_WRONLY | os.O_APPEND)
    torn = []

    def recover():
        torn.append(os.write(writer, b'{"torn'))
        home.recover_torn_tail(real / "events.jsonl")

    run = {"append": lambda: home.append_jsonl(real / "events.jsonl", [{"content": "conversation text"}]),
           "write": lambda: home.write_atomic(real / "events.jsonl", b'{"content":"conversation text"}\n'),
           "recover": recover}
    done = 0
    try:
        with swapping(real, link):
            deadline = time.monotonic() + 5  # without the fix something landed outside within a second
            while time.monotonic() < deadline and not any(outside.iterdir()):
                with contextlib.suppress(EnginePathError, OSError):
                    run[operation]()
                    done += 1
    finally:
        os.close(writer)
    assert names(outside) == []
    assert done > 0 and not real.is_symlink()
    if operation == "append":  # every append that answered is in the log, whole
        assert home.read_jsonl(log) == [{"n": 0}] + [{"content": "conversation text"}] * done
    if operation == "recover":  # every torn line was set aside in the folder, none lost
        home.recover_torn_tail(log)
        assert log.read_bytes() == b'{"n":0}\n'
        aside = sorted(real.glob("events.jsonl.torn-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
        assert b"".join(p.read_bytes() for p in aside) == b'{"torn' * len(torn)


def test_the_erasure_never_removes_a_folder_outside_when_a_folder_on_its_way_becomes_a_link(tmp_path, monkeypatch):
    """The folder was checked and then removed by path name (shutil.rmtree(path)): an area
    folder swapped for a link in between had the erasure delete the folder of that name
    outside the engine folder. It is now removed through its parent's descriptor."""
    from lifecycle.deletion import files

    home = EngineHome(tmp_path / "eng")
    home.write_atomic(home.artifacts_dir(A) / "out.txt", b"the conversation's")
    decoy = tmp_path / "outside" / A
    decoy.mkdir(parents=True)
    (decoy / "precious.txt").write_bytes(b"not the conversation's")
    area = home.artifacts_dir(A).parent
    real_checked = files.checked

    def checked_then_swapped(home, path):
        found = real_checked(home, path)
        area.rename(tmp_path / "parked")  # after the check: the area folder moves away
        area.symlink_to(tmp_path / "outside")  # and a link takes its place
        return found

    monkeypatch.setattr(files, "checked", checked_then_swapped)
    with pytest.raises(files.UnsafeFolder):
        files.remove_folder(home, home.artifacts_dir(A))
    assert (decoy / "precious.txt").read_bytes() == b"not the conversation's"
    assert (tmp_path / "parked" / A / "out.txt").read_bytes() == b"the conversation's"


def nested(folder: Path, depth: int, bottom: bytes) -> None:
    """`depth` folders named "d", one in the other, under `folder`, with a file at the bottom;
    made through descriptors (the path of the bottom is longer than a path may be)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(out, bottom)
        os.close(out)
    finally:
        os.close(fd)


@contextlib.contextmanager
def nested_deep(folder: Path, depth: int, bottom: bytes):
    """`nested`, removed again afterwards by `rm -rf` whatever the test did: a folder thousands of
    levels deep left in a test's temporary folder would make pytest's own clean-up of old
    temporary folders (a recursive removal) fail a later run."""
    nested(folder, depth, bottom)
    try:
        yield
    finally:
        subprocess.run(["rm", "-rf", "--", str(folder / "d")], check=False)


@contextlib.contextmanager
def descriptors_left(count: int):
    """The open-file limit set so that exactly `count` more descriptors can be opened. The limit
    bounds descriptor numbers, not how many are open, and a new descriptor takes the lowest free
    number: one closed earlier in the run leaves a hole under the highest (with the limit at
    "open now plus count", a long run's holes gave more, and the test that needs none left
    failed on CI)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own descriptor, closed by now)
            os.fstat(int(name))
            used.add(int(name))
    limit = free = 0
    while free < count:
        free += limit not in used
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))  # (open ones above it stay open)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_folder_nested_deeper_than_the_descriptors_left_is_counted_and_removed_whole(tmp_path):
    """A walk held one descriptor per level and the removal recursed once per level: a folder
    2,500 levels deep (past Python's recursion limit and, under a limit of 40 open files, past
    the descriptors left) made the delete's count an error and its removal a RecursionError, so
    the delete stayed Pending for ever. Both now hold at most OPEN_LEVELS descriptors and
    recurse not at all: the figures count the bottom file and the removal leaves nothing."""
    from lifecycle import enginefs
    from lifecycle.deletion import files

    home = EngineHome(tmp_path / "eng")
    folder = home.artifacts_dir(A)
    home.write_atomic(folder / "top.txt", b"1234")
    with nested_deep(folder, 2500, b"123456"), descriptors_left(40):
        assert files.usage(home, folder) == (3, 10)  # top.txt, its lock file, bottom.txt
        walked = [path for path, _fd, _entries in enginefs.walk(folder, enginefs._raise)]
        assert len(walked) == 2501 and walked[-1] == folder.joinpath(*["d"] * 2500)
        assert files.remove_folder(home, folder) is True
    assert not os.path.lexists(folder) and os.listdir(folder.parent) == []


def test_with_no_descriptor_left_a_folder_is_not_counted_as_empty(tmp_path):
    """What cannot be opened is an error the delete's step shows (it said "done, 0 records" of a
    folder holding a file); the storage figures say they are incomplete."""
    from lifecycle.deletion import files

    home = EngineHome(tmp_path / "eng")
    folder = home.artifacts_dir(A)
    home.write_atomic(folder / "top.txt", b"1234")
    nested(folder, 3, b"123456")
    with descriptors_left(3):
        with pytest.raises(OSError) as refused:
            files.usage(home, folder)
        problems: list[OSError] = []
        counted = home.conversation_usage(A, problems)
    assert refused.value.errno == errno.EMFILE and str(folder) in refused.value.filename
    assert problems and problems[0].errno == errno.EMFILE and counted[1] < 10
    assert files.usage(home, folder) == (3, 10)


def test_removing_a_folder_leaves_links_inside_as_links_and_what_they_point_at(tmp_path):
    """Deep inside the folder, a link to a folder outside and a link to a file outside are
    removed as links: nothing they point at is entered or removed."""
    from lifecycle.deletion import files

    home = EngineHome(tmp_path / "eng")
    folder = home.artifacts_dir(A)
    nested(folder, 40, b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"kept")
    bottom = folder.joinpath(*["d"] * 40)
    (bottom / "to-folder").symlink_to(outside)
    (bottom / "to-file").symlink_to(outside / "keep.txt")
    assert files.remove_folder(home, folder) is True
    assert not os.path.lexists(folder)
    assert (outside / "keep.txt").read_bytes() == b"kept"


def test_a_folder_moved_away_while_it_is_removed_is_refused_and_nothing_outside_is_touched(tmp_path, monkeypatch):
    """The removal goes back up through ".." to folders whose descriptors it closed to spare
    them; a folder moved elsewhere meanwhile would take it to another parent. It checks that the
    folder it comes back to is the one it left, and stops with UnsafeFolder otherwise."""
    from lifecycle import enginefs
    from lifecycle.deletion import files

    monkeypatch.setattr(enginefs, "OPEN_LEVELS", 2)
    home = EngineHome(tmp_path / "eng")
    folder = home.artifacts_dir(A)
    nested(folder, 6, b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(b"kept")
    real_back_up = enginefs._back_up
    moved = []

    def back_up(child, identity, path):
        if not moved:  # the first time the removal climbs back: move the folder it is in away
            os.rename(folder / "d" / "d" / "d", elsewhere / "d")
            moved.append(True)
        return real_back_up(child, identity, path)

    monkeypatch.setattr(enginefs, "_back_up", back_up)
    with pytest.raises(files.UnsafeFolder):
        files.remove_folder(home, folder)
    # the moved folder is not removed through the folder it was moved to, nor anything beside it
    assert moved and os.path.isdir(elsewhere / "d") and (elsewhere / "keep.txt").read_bytes() == b"kept"


def test_a_walk_that_comes_back_to_a_folder_moved_away_says_so_and_lists_nothing_there(tmp_path, monkeypatch):
    """The walk, too, checks the folder it goes back up to: a folder moved elsewhere ends the walk
    with an error (ESTALE) instead of listing the place it was moved to."""
    from lifecycle import enginefs

    monkeypatch.setattr(enginefs, "OPEN_LEVELS", 2)
    top = tmp_path / "top"
    nested(top, 6, b"x")
    (top / "z-after").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "z-after").mkdir()
    (elsewhere / "z-after" / "outside.txt").write_bytes(b"x")
    problems: list[OSError] = []
    seen: list[Path] = []
    for path, _fd, entries in enginefs.walk(top, problems.append):
        seen.append(path)
        list(entries)
        if len(seen) == 7:  # at the bottom: move the third folder (with what is below it) away
            os.rename(top / "d" / "d", elsewhere / "d")
    assert [p.errno for p in problems] == [errno.ESTALE]
    assert top / "z-after" not in seen and all("outside" not in str(p) for p in seen)


def test_naming_a_lock_while_its_folder_is_swapped_for_a_link_is_a_refusal_not_an_os_error(tmp_path):
    """lock_for and the sweep's check of old temporaries resolved folders with os.path.realpath,
    which lets readlink's EINVAL through when a link on the way becomes a folder between its
    lstat and its readlink: a bare OSError (the sweep stopped; a delete answered 500)."""
    home = EngineHome(tmp_path / "eng")
    state = home.fleet_path.parent
    state.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = state.with_name("state.link")
    link.symlink_to(outside)
    refused = []

    def bare_os_error() -> bool:
        try:
            home.lock_for(home.fleet_path)
            home._temporary_target(state, "subagents.v1.json.tmp-0123abcd")
        except UnsafeEnginePath:
            refused.append(1)
        except OSError:
            return True
        return False

    with swapping(state, link):
        attempts, failed = attempts_until(bare_os_error, seconds=5)
    assert not failed, f"a bare OSError after {attempts} attempts"
    assert refused and home.lock_for(home.fleet_path) == home.fleet_lock


def test_measuring_a_conversation_folder_never_waits_on_a_fifo_swapped_in_for_a_folder_in_it(tmp_path):
    """files.usage (the delete preview's and the erasure check's figures) walked with os.fwalk,
    which opens each folder it enters without O_NONBLOCK: a folder swapped for a FIFO between
    its listing and its opening held the page (or the erasure) until a writer came."""
    from lifecycle.deletion import files

    home = EngineHome(tmp_path / "eng")
    home.write_atomic(home.artifacts_dir(A) / "sub" / "out.txt", b"12345")
    sub = home.artifacts_dir(A) / "sub"
    fifo = sub.with_name("sub.fifo")
    os.mkfifo(fifo)
    before = files.usage(home, home.artifacts_dir(A))  # the file, its lock file and the FIFO
    assert before == (3, 5)
    figures: list[tuple[int, int]] = []
    stop = threading.Event()

    def measure() -> None:
        while not stop.is_set():
            figures.append(files.usage(home, home.artifacts_dir(A)))

    measurer = threading.Thread(target=measure, daemon=True)
    try:
        with swapping(sub, fifo):
            measurer.start()
            measurer.join(5)
            stop.set()
            measurer.join(5)
            waiting = measurer.is_alive()
    finally:
        stop.set()
        if measurer.is_alive():  # an open waiting on the FIFO: a writer lets it go
            for place in (sub, fifo):
                with contextlib.suppress(OSError):
                    os.close(os.open(place, os.O_WRONLY | os.O_NONBLOCK))
            measurer.join(5)
    assert not waiting, f"a measurement waited on the FIFO after {len(figures)} measurements"
    assert len(figures) > 10
    # mid-swap a figure may miss the file or count a name twice, never bytes from elsewhere
    assert {size for _count, size in figures} <= {0, 5} and all(1 <= count <= 4 for count, _size in figures)
    assert files.usage(home, home.artifacts_dir(A)) == before


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_reading_a_log_that_is_a_link_or_a_fifo_neither_follows_nor_waits(tmp_path, never_blocks, kind):
    home = EngineHome(tmp_path / "eng")
    log = _plant(home, "log", tmp_path, kind)
    assert home.inspect_jsonl(log).reason == "unreadable"
    with pytest.raises(UnsafeEnginePath):
        home.read_jsonl(log)
    with pytest.raises(UnsafeEnginePath):
        home.read_json(log, default=None)


def test_the_erasure_scan_reads_no_engine_file_that_became_a_link_or_a_fifo(tmp_path, never_blocks):
    from lifecycle.deletion import fingerprints

    window = bytes(range(64))
    secret = b"k" * 32
    scanner = fingerprints.Scanner(SimpleNamespace(
        secret=secret, windows=fingerprints._window_digest(secret, window),
        grams=b"".join(fingerprints._slice_digest(secret, window[o:o + 32]) for o in range(33))))
    home = EngineHome(tmp_path / "eng")
    home.write_atomic(home.events_path(A), b"x" * 32 + window)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"y" * 32 + window)
    home.events_path(B).parent.mkdir(parents=True)
    home.events_path(B).symlink_to(outside)
    os.mkfifo(home.receipts_path(A).parent.mkdir(parents=True) or home.receipts_path(A))
    assert len(scanner.scan_file(home.events_path(A), engine=True)) == 1
    assert scanner.scan_file(home.events_path(B), engine=True) == []
    assert scanner.scan_file(home.receipts_path(A), engine=True) == []


@pytest.mark.django_db
def test_an_engine_log_append_never_writes_through_a_link_out_of_the_engine_folder(conversation, tmp_path):
    from lifecycle.actions.append_log import append_log

    home = EngineHome()
    _plant(home, "log", tmp_path, "link", conversation.storage_key)
    with pytest.raises(UnsafeEnginePath):
        append_log(conversation, log="events", records=[{"type": "turn.completed", "note": "CONTENT"}])
    assert (tmp_path / "outside" / "outside.txt").read_bytes() == PRECIOUS
    assert names(tmp_path / "outside") == ["outside.txt"]


@pytest.mark.django_db
def test_the_conversation_page_reports_a_fifo_for_its_event_log_as_unreadable(member_client, conversation,
                                                                              never_blocks):
    home = EngineHome()
    log = home.events_path(conversation.storage_key)
    log.parent.mkdir(parents=True)
    os.mkfifo(log)
    response = member_client.get(f"/conversations/{conversation.public_id}/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 200
    assert f"threads/{conversation.storage_key}/events.jsonl</code> cannot be read" in response.content.decode()


@pytest.mark.django_db
def test_the_startup_recovery_skips_logs_that_are_links_or_fifos_and_recovers_the_others(tmp_path, never_blocks):
    from lifecycle.actions.recover_torn_logs import recover_all_torn_logs
    from tests import factories

    linked, fifo, torn = (factories.make_conversation() for _ in range(3))
    home = EngineHome()
    _plant(home, "log", tmp_path, "link", linked.storage_key)
    home.receipts_path(fifo.storage_key).parent.mkdir(parents=True)
    os.mkfifo(home.receipts_path(fifo.storage_key))
    home.write_atomic(home.events_path(torn.storage_key), b'{"a":1}\n{"torn')
    assert recover_all_torn_logs() == 1
    assert home.events_path(torn.storage_key).read_bytes() == b'{"a":1}\n'
    assert (tmp_path / "outside" / "outside.txt").read_bytes() == PRECIOUS
    assert names(tmp_path / "outside") == ["outside.txt"]


@pytest.mark.django_db
def test_the_startup_recovery_finishes_a_set_aside_killed_after_the_log_was_cut(tmp_path, never_blocks):
    """r21: killed after saving the torn tail and cutting the log, before naming the saved tail:
    the log no longer looked torn, so the start-up recovery passed it by and the tail stayed in
    a hidden pending file until that conversation's next append (never, for an idle one)."""
    from lifecycle.actions.recover_torn_logs import recover_all_torn_logs
    from tests import factories

    idle = factories.make_conversation()
    home = EngineHome()
    log = home.events_path(idle.storage_key)
    home.write_atomic(log, b'{"a":1}\n')  # already cut
    home.write_atomic(log.with_name(".events.jsonl.torn-pending"), b'{"torn')
    assert recover_all_torn_logs() == 1
    assert log.read_bytes() == b'{"a":1}\n'
    assert log.with_name("events.jsonl.torn-1").read_bytes() == b'{"torn'
    assert not log.with_name(".events.jsonl.torn-pending").exists()
    assert recover_all_torn_logs() == 0


# The temporary-file sweep -------------------------------------------------------------------

def test_the_sweep_removes_only_temporaries_its_writers_create(tmp_path):
    home = EngineHome(tmp_path)
    ours = [
        home.thread_dir(A) / ".events.jsonl.lethe-tmp-0123456789abcdef",
        home.artifacts_dir(A) / "reports" / ".out.txt.lethe-tmp-fedcba9876543210",
        tmp_path / "state" / ".subagents.v1.json.lethe-tmp-00000000000000ff",
        # What earlier releases wrote beside their fixed-name files.
        home.thread_dir(B) / "events.jsonl.tmp-deadbeef",
        tmp_path / "state" / "subagents.v1.json.tmp-0badf00d",
        home.session_dir(B) / "approval_receipts.jsonl.tmp-12345678",
    ]
    for path in ours:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"leftover")
    home.write_atomic(home.artifacts_dir(A) / "pytest.tmp-report.xml", b"<committed/>")
    home.write_atomic(home.artifacts_dir(A) / "notes.tmp-deadbeef", b"an artifact, not provably ours")
    (home.artifacts_dir(B) / "build.tmp-cache").mkdir(parents=True)
    (home.artifacts_dir(B) / "build.tmp-cache" / "keep").write_bytes(b"k")
    (home.artifacts_dir(B) / ".dir.lethe-tmp-0123456789abcdef").mkdir()
    (home.artifacts_dir(B) / ".link.lethe-tmp-0123456789abcdef").symlink_to(tmp_path / "nowhere")
    (tmp_path / "other" / "x.tmp-deadbeef").parent.mkdir()
    (tmp_path / "other" / "x.tmp-deadbeef").write_bytes(b"not in a known place")

    assert home.sweep_temporaries() == len(ours)
    assert not any(p.exists() for p in ours)
    survivors = [
        home.artifacts_dir(A) / "pytest.tmp-report.xml", home.artifacts_dir(A) / "pytest.tmp-report.xml.lock",
        home.artifacts_dir(A) / "notes.tmp-deadbeef", home.artifacts_dir(B) / "build.tmp-cache" / "keep",
        home.artifacts_dir(B) / ".dir.lethe-tmp-0123456789abcdef", tmp_path / "other" / "x.tmp-deadbeef",
    ]
    assert all(p.exists() for p in survivors)
    assert (home.artifacts_dir(B) / ".link.lethe-tmp-0123456789abcdef").is_symlink()
    assert home.sweep_temporaries() == 0


@pytest.mark.parametrize("reached_by", ["symlink", "relative path"])
def test_the_fleet_files_temporaries_are_found_however_engine_home_is_reached(tmp_path, monkeypatch, reached_by):
    """One resolved root: the fleet file's folder, its lock and the places where earlier releases
    left `<name>.tmp-<8 hex>` are compared in the same form (an old-format temporary beside a
    fleet file reached through a link or a relative ENGINE_HOME was not recognized, so it was
    neither swept nor erased with a deleted conversation's rows)."""
    real = tmp_path / "real-engine"
    real.mkdir()
    if reached_by == "symlink":
        (tmp_path / "eng").symlink_to(real)
        home = EngineHome(tmp_path / "eng")
    else:
        monkeypatch.chdir(tmp_path)
        home = EngineHome(Path("real-engine"))
    assert home.root == real and home.fleet_path == real / "state" / "subagents.v1.json"
    home.update_fleet(lambda rows: [*rows, {"agent_id": "a"}])
    assert home.lock_for(home.fleet_path) == home.fleet_lock == real / "state" / "subagents.v1.lock"
    legacy = real / "state" / "subagents.v1.json.tmp-0123abcd"
    ours = real / "state" / ".subagents.v1.json.lethe-tmp-0123456789abcdef"
    for leftover in (legacy, ours):
        leftover.write_bytes(home.fleet_path.read_bytes())
    assert home.stale_temporaries(home.fleet_path) == [ours, legacy]
    assert home.sweep_temporaries() == 2
    assert sorted(p.name for p in (real / "state").iterdir()) == ["subagents.v1.json", "subagents.v1.lock"]


def _hold_lock(lock: str, ready, release) -> None:
    with open(lock, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        ready.set()
        release.wait(30)


def test_the_sweep_never_deletes_a_lock_another_writer_holds(tmp_path):
    home = EngineHome(tmp_path)
    target = home.artifacts_dir(A) / "pytest.tmp-report.xml"
    home.write_atomic(target, b"<committed/>")
    lock = home.lock_for(target)
    ready, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(lock), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        assert home.sweep_temporaries() == 0
        assert lock.exists() and target.read_bytes() == b"<committed/>"
    finally:
        release.set()
        holder.join(10)


def test_the_sweep_waits_for_the_lock_the_writer_holds(tmp_path):
    home = EngineHome(tmp_path)
    target = home.fleet_path
    target.parent.mkdir(parents=True)
    tmp = target.with_name(".subagents.v1.json.lethe-tmp-0000000000000001")
    tmp.write_bytes(b"{}")
    swept = []
    with home.locked(home.fleet_lock):  # a live writer, mid-write
        sweeper = threading.Thread(target=lambda: swept.append(home.sweep_temporaries()))
        sweeper.start()
        sweeper.join(0.5)
        assert sweeper.is_alive() and tmp.exists()
    sweeper.join(5)
    assert swept == [1] and not tmp.exists()


def test_the_sweep_waits_for_a_torn_tail_recovery_in_progress(tmp_path):
    home = EngineHome(tmp_path)
    log = home.receipts_path(A)
    home.append_jsonl(log, [{"a": 1}])
    # The recovery's own temporary (for the pending torn file), while it holds the log's lock.
    tmp = log.with_name("..approval_receipts.jsonl.torn-pending.lethe-tmp-0123456789abcdef")
    tmp.write_bytes(b'{"a":2')
    swept = []
    with home.locked(home.lock_for(log)):
        sweeper = threading.Thread(target=lambda: swept.append(home.sweep_temporaries()))
        sweeper.start()
        sweeper.join(0.5)
        assert sweeper.is_alive() and tmp.exists()
    sweeper.join(5)
    assert swept == [1] and not tmp.exists()


def _sweep_into(root: str, results) -> None:
    results.put(EngineHome(root).sweep_temporaries())


def _keep_writing(root: str, rounds: int) -> None:
    home = EngineHome(root)
    for n in range(rounds):
        home.write_atomic(home.events_path(A), b"%d\n" % n)
        home.append_jsonl(home.receipts_path(A), [{"n": n}])
        home.update_fleet(lambda rows, n=n: [{"agent_id": "w", "n": n}])


def test_concurrent_sweeps_remove_each_leftover_once_beside_a_live_writer(tmp_path):
    home = EngineHome(tmp_path)
    leftovers = []
    for i in range(60):
        folder = home.artifacts_dir(f"c_{i:020x}")
        folder.mkdir(parents=True)
        leftovers.append(folder / f".out.txt.lethe-tmp-{i:016x}")
        leftovers[-1].write_bytes(b"x")
    results = FORK.Queue()
    writer = FORK.Process(target=_keep_writing, args=(str(tmp_path), 60))
    sweepers = [FORK.Process(target=_sweep_into, args=(str(tmp_path), results)) for _ in range(4)]
    writer.start()
    for s in sweepers:
        s.start()
    for p in [*sweepers, writer]:
        p.join(60)
        assert p.exitcode == 0
    assert sum(results.get(timeout=5) for _ in sweepers) == len(leftovers)
    assert not any(p.exists() for p in leftovers)
    assert home.events_path(A).read_bytes() == b"59\n"
    assert home.read_jsonl(home.receipts_path(A)) == [{"n": n} for n in range(60)]
    assert home.read_fleet() == [{"agent_id": "w", "n": 59}]


# Usage ----------------------------------------------------------------------------------------

def test_it_reports_usage_per_conversation(tmp_path):
    home = EngineHome(tmp_path)
    home.write_atomic(home.events_path(A), b"12345")
    home.write_atomic(home.artifacts_dir(A) / "out.txt", b"123")
    home.write_atomic(home.events_path(B), b"1")
    files, size = home.conversation_usage(A)
    # Lock files are zero bytes and count as files the conversation owns.
    assert size == 8
    assert files == 4
    assert home.usage() == (6, 9)


def _churn(root: str, stop, started) -> None:
    home = EngineHome(root)
    n = 0
    while not stop.is_set():
        started.set()
        n += 1
        folder = home.artifacts_dir(A) / f"d{n % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n}").write_bytes(b"z" * 10)
        if n % 3 == 0:
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()


def test_usage_tolerates_files_and_folders_vanishing_during_the_walk(tmp_path):
    home = EngineHome(tmp_path)
    home.write_atomic(home.events_path(A), b"12345")
    stop, started = FORK.Event(), FORK.Event()
    churner = FORK.Process(target=_churn, args=(str(tmp_path), stop, started))
    churner.start()
    assert started.wait(60)
    try:
        for _ in range(300):
            files, size = home.conversation_usage(A)
            assert files >= 2 and size >= 5
            assert home.usage()[0] >= 2
    finally:
        stop.set()
        churner.join(10)
    assert churner.exitcode == 0


# Listings -------------------------------------------------------------------------------------

OUTSIDE_SIZE = 1 << 30  # sparse: a figure that counts it cannot be mistaken


def _planted(tmp_path: Path) -> tuple[EngineHome, SimpleNamespace, Path, Path]:
    """An engine folder whose conversation A holds a folder `inner` (kept.txt, 4 bytes, and its
    lock) and beside it `inner.link`, a symlink to a folder outside holding a file of a unique
    name (a unique marker first, OUTSIDE_SIZE long) and a leftover temporary of that file."""
    home = EngineHome(tmp_path / "engine")
    inner = home.artifacts_dir(A) / "inner"
    home.write_atomic(inner / "kept.txt", b"kept")
    token = secrets.token_hex(8)
    out = SimpleNamespace(folder=tmp_path / "outside", name=f"outside-{token}.bin",
                          marker=f"outside the engine folder {token}".encode())
    out.temporary = f".{out.name}.lethe-tmp-0123456789abcdef"
    out.folder.mkdir()
    with open(out.folder / out.name, "wb") as handle:
        handle.write(out.marker)
        handle.truncate(OUTSIDE_SIZE)
    (out.folder / out.temporary).write_bytes(out.marker)
    link = inner.with_name("inner.link")
    link.symlink_to(out.folder)
    return home, out, inner, link


def _leaks(home: EngineHome, out: SimpleNamespace, inner: Path, link: Path) -> dict[str, Callable[[], bool]]:
    """Each listing of the engine folder, run once: whether it reached the folder outside."""
    from lifecycle.deletion import fingerprints, verify

    def swept() -> bool:  # removed the outside temporary, or took a lock named after it (in or out)
        home.sweep_temporaries()
        lock = out.name + ".lock"
        return (not (out.folder / out.temporary).exists()
                or any(os.path.lexists(folder / lock) for folder in (inner, link, out.folder)))

    return {
        "usage": lambda: home.usage()[1] >= OUTSIDE_SIZE,
        "conversation usage": lambda: home.conversation_usage(A)[1] >= OUTSIDE_SIZE,
        "erasure check's files": lambda: any(p.name == out.name for p in verify.engine_files(home)),
        "fingerprint sample": lambda: any(out.marker in v for v in fingerprints._file_values(home.artifacts_dir(A))),
        "stale temporaries": lambda: home.stale_temporaries(inner / out.name) != [],
        "sweep": swept,
    }


def test_no_listing_of_the_engine_folder_follows_a_link_out_of_it_nor_opens_a_fifo(tmp_path, never_blocks):
    from lifecycle.deletion import fingerprints, verify

    home, out, inner, link = _planted(tmp_path)
    os.mkfifo(inner / "fifo")
    for listing, leaked in _leaks(home, out, inner, link).items():
        assert not leaked(), listing
    # A temporary's folder that is itself a link: nothing there is the engine folder's.
    assert home.stale_temporaries(link / out.name) == []
    # The figures and lists of what is in the folder stay exact: the link and the FIFO count nothing.
    assert home.usage() == home.conversation_usage(A) == (2, 4)
    assert verify.engine_files(home) == [inner / "kept.txt", inner / "kept.txt.lock"]
    assert list(fingerprints._file_values(home.artifacts_dir(A))) == [b"kept", b""]
    assert sorted(p.name for p in out.folder.iterdir()) == sorted([out.name, out.temporary])
    assert stat.S_ISFIFO(os.lstat(inner / "fifo").st_mode) and link.is_symlink()


@pytest.mark.parametrize("listing", ["usage", "conversation usage", "erasure check's files", "fingerprint sample",
                                     "stale temporaries", "sweep"])
def test_no_listing_reaches_outside_while_a_folder_in_it_is_swapped_for_a_link(tmp_path, listing):
    """The listings went by path (os.walk, os.listdir): a folder checked as a folder and then
    listed by its name was listed through the link swapped in meanwhile, so figures counted,
    the erasure's check listed and the fingerprints read a file outside the engine folder.
    They now list each folder through a descriptor opened from its parent's, never a link."""
    home, out, inner, link = _planted(tmp_path)
    leaked = _leaks(home, out, inner, link)[listing]
    with swapping(inner, link):
        attempts, seen = attempts_until(leaked)
    assert not seen, f"{listing} reached the folder outside after {attempts} attempts"
    assert attempts > 1 and inner.is_dir() and not inner.is_symlink()
    assert home.usage() == home.conversation_usage(A) == (2, 4)  # exact again on the folder as it is
