"""The exited web workers' figures folded into one file per kind: the totals stay the same, a
scrape never meets a fold half done, and a full disk stops no process (ops/metrics_folder.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from ops.metrics_folder import fold_exited_worker

ROOT = Path(__file__).resolve().parent.parent
KEY = mmap_key("lethe_http_requests_total", "lethe_http_requests_total", ["method", "view", "status"],
               ["GET", "login", "200"], "HTTP requests.")
BUCKET = mmap_key("lethe_http_request_duration_seconds", "lethe_http_request_duration_seconds_bucket",
                  ["method", "view", "status", "le"], ["GET", "login", "200", "0.1"], "Time.")


def _worker(folder: Path, pid: int, requests: float) -> None:
    for kind, key in (("counter", KEY), ("histogram", BUCKET)):
        figures = MmapedDict(str(folder / f"{kind}_{pid}.db"))
        figures.write_value(key, requests, 0.0)
        figures.close()


def _totals(folder: Path) -> tuple[float, float]:
    from ops.metrics import exposition

    found = {}
    for family in text_string_to_metric_families(exposition().decode()):
        for sample in family.samples:
            if sample.labels.get("view") == "login" and sample.labels.get("le", "0.1") == "0.1" and sample.name in (
                    "lethe_http_requests_total", "lethe_http_request_duration_seconds_bucket"):
                found[sample.name] = sample.value
    return found.get("lethe_http_requests_total", 0.0), found.get("lethe_http_request_duration_seconds_bucket", 0.0)


@pytest.mark.django_db
def test_a_scrape_during_folds_reads_the_same_totals_and_never_fails(tmp_path, monkeypatch):
    """r145: a scrape met a worker's file removed under it (500, FileNotFoundError), or counted a
    worker twice (once in its own file, once in the exited workers'), then fewer: a counter that
    goes down reads as a restart. Folds and scrapes take the folder's lock in turn."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    pids = list(range(100000, 100300))
    for pid in pids:
        _worker(tmp_path, pid, 3.0)
    expected = (3.0 * len(pids), 3.0 * len(pids))
    assert _totals(tmp_path) == expected
    seen, failures = [], []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                seen.append(_totals(tmp_path))
            except Exception as error:  # noqa: BLE001 (what a scrape met is the finding)
                failures.append(repr(error))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for pid in pids:
            assert fold_exited_worker(tmp_path, pid) == 2
    finally:
        done.set()
        scraper.join(30)
    assert failures == []
    assert len(seen) > 5 and set(seen) == {expected}
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["counter_exited.db", "histogram_exited.db"]
    assert _totals(tmp_path) == expected


def _tmpfs(at: Path, size: str) -> bool:
    at.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(at)],
                          capture_output=True).returncode == 0


def test_a_fold_on_a_full_disk_fails_as_an_error_and_leaves_the_workers_files(tmp_path):
    """r145: the exited file was a sparse mapped file; written on a full disk it was a SIGBUS,
    which stopped the gunicorn master and serve with it. Its space is given before it is mapped:
    a full disk is an OSError the master logs, and the worker's files stay, counted as before."""
    disk = tmp_path / "disk"
    if not _tmpfs(disk, "1m"):
        pytest.skip("a tmpfs mount needs root")
    try:
        _worker(disk, 4242, 7.0)
        filler = disk / "filler"
        with open(filler, "wb") as out, pytest.raises(OSError):
            while True:
                out.write(b"x" * 65536)
                out.flush()
        script = ("import sys; from ops.metrics_folder import fold_exited_worker\n"
                  "try:\n    fold_exited_worker(sys.argv[1], 4242)\n"
                  "except OSError as error:\n    print('refused', error.errno)\n")
        run = subprocess.run([sys.executable, "-c", script, str(disk)], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert (run.returncode, run.stdout.strip()) == (0, "refused 28"), run  # ENOSPC, no signal
        assert (disk / "counter_4242.db").exists() and not (disk / "counter_exited.db").exists()
        os.unlink(filler)
        assert fold_exited_worker(disk, 4242) == 2  # room again: folded
        values = {k: v for k, v, _t, _p in MmapedDict.read_all_values_from_file(str(disk / "counter_exited.db"))}
        assert values == {KEY: 7.0}
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.django_db
def test_a_worker_file_made_a_moment_ago_and_still_empty_fails_no_scrape(tmp_path, monkeypatch):
    """r148: a new worker's file is empty for a moment (made, then given its space); a scrape that
    met it failed (struct.error, 500) at every worker replacement. It holds no figure yet."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    _worker(tmp_path, 100001, 4.0)
    (tmp_path / "counter_100002.db").write_bytes(b"")
    (tmp_path / "histogram_100002.db").write_bytes(b"")
    assert _totals(tmp_path) == (4.0, 4.0)


def test_a_fold_waits_a_bounded_time_for_the_scrapes_and_leaves_the_files_as_they_were(tmp_path, monkeypatch):
    """r148: scrapes one after another could hold the folder's shared lock for long, and the
    gunicorn master, which reaps and replaces workers in the same loop, waited on it. It waits
    FOLD_WAIT seconds at most; the worker's files then stay, counted as before."""
    from ops import metrics_folder

    monkeypatch.setattr(metrics_folder, "FOLD_WAIT", 0.2)
    _worker(tmp_path, 100003, 2.0)
    with metrics_folder.reading(tmp_path), pytest.raises(metrics_folder.Busy):
        metrics_folder.fold_exited_worker(tmp_path, 100003)
    assert (tmp_path / "counter_100003.db").exists() and not (tmp_path / "counter_exited.db").exists()
    assert metrics_folder.fold_exited_worker(tmp_path, 100003) == 2  # the scrape ended: folded
