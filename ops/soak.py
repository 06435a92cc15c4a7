"""The many-host soak (`manage.py soak`, `make soak`): two web servers and two job clusters on
one PostgreSQL database and one engine folder, a bounded mixed API load over both web servers,
one cluster killed outright and restarted mid-run, a tool payload cleanup run started twice at
the same moment (once on each web server), then the books are checked.

The run is a list of steps (`Soak.steps()`), each one method; a failed step stops the run and
every process it started is stopped. What is checked at the end:

- every acknowledged append is stored exactly once (counted by the client-made text it carries),
  and each conversation's sequence numbers run 1..n without a gap or a repeat;
- every archive or unarchive the API acknowledged is the conversation's final state;
- every delete has exactly one operation, the same one for the repeated request (same
  Idempotency-Key, other web server), Completed, its conversation Deleted, and its receipt
  counts each item once (a rerun after the kill must not count twice);
- of the two cleanup starts exactly one is admitted and the other refused as busy; the run
  succeeds, removes every eligible payload once, and it is the only cleanup operation;
- no job failed, and `verify_erasure --all` finds nothing;
- no request failed (errors must be 0).

The figures are printed as one JSON object; any violation exits non-zero.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection

PORTS = range(8200, 8220)
SOAK_PREFIX = "soak:"


class SoakFailed(Exception):
    """A step could not be done, or an invariant does not hold."""


@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen | None = None
    port: int | None = None

    def children(self) -> list[int]:
        if self.popen is None:
            return []
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.popen.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]


@dataclass
class Recorder:
    """Timings per request kind, errors with their first few reasons; shared by the client threads."""

    timings: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, kind: str, ms: float) -> None:
        with self.lock:
            self.timings.setdefault(kind, []).append(ms)

    def error(self, kind: str, why: str) -> None:
        with self.lock:
            self.error_count += 1
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
            if len(self.errors) < 20:
                self.errors.append(f"{kind}: {why}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class Soak:
    def __init__(self, *, seconds: float, clients: int, settle_seconds: float, out: Callable[[str], None]) -> None:
        self.seconds = seconds
        self.clients = clients
        self.settle_seconds = settle_seconds
        self.say = out
        self.var = Path(settings.VAR_DIR) / "soak"
        self.engine = Path(settings.ENGINE_HOME)
        self.processes: dict[str, Process] = {}
        self.recorder = Recorder()
        self.figures: dict = {}
        self.token = ""
        # Per client: its own conversations (appends, reads, archive) and the ones it deletes.
        self.work: list[list[str]] = []
        self.doomed: list[list[tuple[str, int]]] = []
        self.appended: list[tuple[str, str, int]] = []  # (conversation, text, item id)
        self.archived: dict[str, bool] = {}
        self.deletes: dict[str, str] = {}  # conversation -> operation id (first answer)
        self.repeats: dict[str, str] = {}  # conversation -> operation id (same key, other server)
        self.seeded_items: dict[str, int] = {}
        self.idle: list[str] = []  # conversations the cleanup run works on
        self.cleanup_items = 0
        self.cleanup_failure: str | None = None
        self.started = self.load_began = 0.0

    # ---- The run ---------------------------------------------------------------------------

    def steps(self) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("fresh database and engine folder", self.fresh),
            ("migrate and collect static files", self.migrate),
            ("seed conversations and an admin token", self.seed),
            ("start two web servers and two job clusters", self.start_all),
            ("mixed load, one cluster killed and restarted, a cleanup run", self.load),
            ("one cleanup operation at a time, and it completed", self.cleanup_checked),
            ("every delete Completed", self.settle),
            ("no lost or duplicated work", self.check_books),
            ("verify_erasure --all", self.verify_erasure),
        ]

    def run(self) -> dict:
        self.started = time.monotonic()
        try:
            for title, step in self.steps():
                began = time.monotonic()
                self.say(f"soak: {title}")
                step()
                self.figures.setdefault("step_seconds", {})[title] = round(time.monotonic() - began, 1)
        finally:
            self.stop_all()
        self.figures["seconds"] = round(time.monotonic() - self.started, 1)
        return self.figures

    # ---- Steps -----------------------------------------------------------------------------

    def fresh(self) -> None:
        db = settings.DATABASES["default"]
        if connection.vendor != "postgresql":
            raise SoakFailed("The soak needs DATABASE_URL to name a PostgreSQL database (several hosts share it).")
        name = db["NAME"]
        if "soak" not in name:
            raise SoakFailed(f"The soak drops and recreates its database; {name!r} does not look like a soak "
                             "database (its name must contain 'soak', for example lethe_soak).")
        if "soak" not in str(self.engine):
            raise SoakFailed(f"The soak empties its engine folder; ENGINE_HOME={self.engine} must be a soak folder "
                             "(its path must contain 'soak').")
        import psycopg

        connection.close()
        params = {k: v for k, v in {"host": db.get("HOST"), "port": db.get("PORT"), "user": db.get("USER"),
                                    "password": db.get("PASSWORD")}.items() if v}
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
        shutil.rmtree(self.var, ignore_errors=True)
        (self.var / "logs").mkdir(parents=True)
        shutil.rmtree(self.engine, ignore_errors=True)
        self.engine.mkdir(parents=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=os.environ["DATABASE_URL"], ENGINE_HOME=str(self.engine), SECRET_KEY=settings.SECRET_KEY,
            STATIC_ROOT=str(self.var / "static"), ACCESS_LOG="false", LOG_LEVEL="WARNING", LOG_FORMAT="json",
            DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE", "console.settings"),
        )
        env.update(extra)
        return env

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(settings.BASE_DIR / "manage.py"), *args], env=self.env(),
                              cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=600)

    def migrate(self) -> None:
        for args in (("migrate", "--noinput", "-v0"), ("collectstatic", "--noinput", "-v0")):
            done = self.manage(*args)
            if done.returncode != 0:
                raise SoakFailed(f"manage.py {args[0]} failed: {done.stderr[-1500:]}")

    def seed(self) -> None:
        from django.contrib.auth import get_user_model

        from console.models import ApiToken
        from lifecycle.actions.append_item import append_item
        from lifecycle.actions.append_log import append_log
        from lifecycle.actions.write_artifact import write_artifact
        from lifecycle.models import Account, Conversation, Scope

        connection.close()  # the database was recreated: a fresh connection
        admin = get_user_model().objects.create_user(username="soak-admin", is_staff=True)
        _token, self.token = ApiToken.issue(admin, name="soak")
        account = Account.objects.create(name="Soak")
        doomed_each = max(2, round(self.seconds / 8))
        n = 0

        def conversation(title: str) -> Conversation:
            nonlocal n
            n += 1
            return Conversation.objects.create(scope=Scope.BOUND, account=account, thread_id=f"thr_soak_{n:05d}",
                                               title=title)

        for client in range(self.clients):
            self.work.append([conversation(f"Soak work {client}-{i}").public_id for i in range(3)])
            doomed = []
            for i in range(doomed_each):
                c = conversation(f"Soak doomed {client}-{i}")
                secret = uuid.uuid4().hex * 2
                append_item(c, role="user", content=f"doomed {secret} question")
                append_item(c, role="assistant", content=f"doomed {secret} answer")
                append_item(c, role="tool", tool_kind="shell", tool_call_id="call_1", status="completed", title="Run",
                            payload={"command": "ls", "cwd": "/w", "exit_code": 0, "stdout": secret * 40,
                                     "stderr": ""})
                append_log(c, log="events", records=[{"type": "turn.completed", "note": secret}])
                write_artifact(c, name="output.txt", data=secret.encode() * 20)
                doomed.append((c.public_id, 3))
                self.seeded_items[c.public_id] = 3
            self.doomed.append(doomed)
        # Idle conversations (last active 60 days ago) with tool payloads for the cleanup run.
        from datetime import timedelta

        from django.utils import timezone

        from lifecycle.models import Item

        long_ago = timezone.now() - timedelta(days=60)
        for i in range(max(2, self.clients)):
            c = conversation(f"Soak idle {i}")
            append_item(c, role="user", content="run the tests")
            for k in range(5):
                append_item(c, role="tool", tool_kind="shell", tool_call_id=f"call_{k}", status="completed",
                            title="Run", payload={"command": "pytest", "cwd": "/w", "exit_code": 0,
                                                  "stdout": uuid.uuid4().hex * 100, "stderr": ""})
            Item.objects.filter(conversation=c).update(created_at=long_ago, updated_at=long_ago)
            Conversation.objects.filter(pk=c.pk).update(last_activity_at=long_ago, created_at=long_ago)
            self.idle.append(c.public_id)
        self.cleanup_items = Item.objects.filter(conversation__public_id__in=self.idle, removable_bytes__gt=0).count()
        self.figures["conversations_seeded"] = n

    def start_all(self) -> None:
        free = [p for p in PORTS if _port_free(p)]
        if len(free) < 2:
            raise SoakFailed("Two free ports in 8200-8219 are needed for the web servers.")
        for i, port in enumerate(free[:2], start=1):
            self.start(Process(f"web-{i}", ["serve", f"127.0.0.1:{port}", "--only", "web"],
                               self.var / "logs" / f"web-{i}.log", port=port))
        for i in (1, 2):
            self.start(Process(f"jobs-{i}", ["serve", "--only", "jobs"], self.var / "logs" / f"jobs-{i}.log"))
        deadline = time.monotonic() + 120
        for proc in self.processes.values():
            while proc.port and not _healthy(proc.port):
                if proc.popen.poll() is not None or time.monotonic() > deadline:
                    raise SoakFailed(f"{proc.name} did not start (see {proc.log}).")
                time.sleep(0.3)
            while not proc.port and not proc.children():
                if proc.popen.poll() is not None or time.monotonic() > deadline:
                    raise SoakFailed(f"{proc.name} did not start (see {proc.log}).")
                time.sleep(0.3)
        self.figures["web_ports"] = [p.port for p in self.processes.values() if p.port]

    def start(self, proc: Process) -> None:
        extra = {}
        if proc.port:  # each web server adds up its own workers' request figures
            extra["PROMETHEUS_MULTIPROC_DIR"] = str(self.var / f"prometheus-{proc.name}")
        from console.management.commands.serve import _child_setup

        with open(proc.log, "ab") as log:
            # Its own session (so a kill reaches its whole tree), and told to stop (SIGTERM) if
            # this driver dies without stopping it.
            proc.popen = subprocess.Popen([sys.executable, str(settings.BASE_DIR / "manage.py"), *proc.argv],
                                          env=self.env(**extra), cwd=settings.BASE_DIR, stdout=log, stderr=log,
                                          start_new_session=True, preexec_fn=_child_setup(os.getpid()))
        self.processes[proc.name] = proc

    def cluster_holding_a_lease(self) -> str | None:
        """The job cluster whose worker holds a delete operation's lease right now, if any."""
        from lifecycle.models import DeleteOperation

        holders = DeleteOperation.objects.filter(state="pending").exclude(lease_holder="")
        for holder in holders.values_list("lease_holder", flat=True):
            pid = holder.rpartition(":")[2]
            with contextlib.suppress(ProcessLookupError, ValueError):
                group = os.getpgid(int(pid))
                for name in ("jobs-1", "jobs-2"):
                    if group in self.processes[name].children():
                        return name
        return None

    def kill_cluster(self, window: float) -> dict:
        """SIGKILL a job cluster host: the cluster's whole process group (workers mid-job
        included), then its serve; nothing is told to stop, nothing gets to clean up. Within
        `window` seconds it waits for a cluster to be in the middle of an erasure and kills
        that one; otherwise jobs-2."""
        from lifecycle.models import DeleteOperation

        deadline = time.monotonic() + window
        name = None
        while name is None and time.monotonic() < deadline:
            name = self.cluster_holding_a_lease()
            time.sleep(0.02)
        mid_erasure = name is not None
        name = name or "jobs-2"
        proc = self.processes[name]
        for kid in proc.children():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(kid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(30)
        pending = DeleteOperation.objects.filter(state="pending")
        return {"name": name, "mid_erasure": mid_erasure, "pending_deletes_at_kill": pending.count(),
                "leases_of_dead_workers": sum(1 for h in pending.values_list("lease_holder", flat=True)
                                              if h and not _alive(h))}

    @contextlib.contextmanager
    def clusters_paused(self):
        """SIGSTOP every job cluster's process groups (their workers take no task) for the block;
        SIGCONT after, whatever happens in it."""
        groups = [kid for name in ("jobs-1", "jobs-2") for kid in self.processes[name].children()]
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
        try:
            yield
        finally:
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGCONT)

    def load(self) -> None:
        threads = [threading.Thread(target=self.guarded_client, args=(i,), daemon=True) for i in range(self.clients)]
        began = self.load_began = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(self.seconds * 0.3)
        kill = self.kill_cluster(window=self.seconds * 0.25)
        self.figures["cluster_kill"] = {**kill, "at_s": round(time.monotonic() - began, 1)}
        time.sleep(self.seconds * 0.05)
        cleanup = threading.Thread(target=self.guarded_cleanup, daemon=True)
        cleanup.start()
        restarted = Process(kill["name"], ["serve", "--only", "jobs"], self.var / "logs" / f"{kill['name']}.log")
        self.start(restarted)
        self.figures["cluster_kill"]["restarted_at_s"] = round(time.monotonic() - began, 1)
        for t in threads:
            t.join(self.seconds + 120)
        elapsed = time.monotonic() - began
        cleanup.join(self.settle_seconds + 180)
        if cleanup.is_alive():
            self.cleanup_failure = "the cleanup run did not finish in time"
        if restarted.popen.poll() is not None:
            raise SoakFailed(f"The restarted job cluster exited (see {restarted.log}).")
        kinds = {kind: {"count": len(ms), "p50_ms": round(statistics.median(ms), 1),
                        "p99_ms": round(percentile(ms, 0.99), 1)}
                 for kind, ms in sorted(self.recorder.timings.items())}
        every = [ms for kind, values in self.recorder.timings.items() if not kind.startswith("cleanup")
                 for ms in values]
        total = len(every) + sum(n for kind, n in self.recorder.error_kinds.items() if not kind.startswith("cleanup"))
        self.figures.update(
            clients=self.clients, web_servers=2, job_clusters=2, load_seconds=round(elapsed, 1), requests=total,
            throughput_rps=round(total / elapsed, 1), errors=self.recorder.error_count,
            p50_ms=round(statistics.median(every), 1) if every else None,
            p99_ms=round(percentile(every, 0.99), 1) if every else None, kinds=kinds,
            load_average=round(os.getloadavg()[0], 1),  # the machine's, soak included
        )
        if self.recorder.errors:
            self.figures["first_errors"] = self.recorder.errors

    def guarded_client(self, index: int) -> None:
        try:
            self.client(index)
        except Exception as exc:  # a client that stops early is a failed run, never a quiet one
            self.recorder.error("client", f"client {index} stopped: {type(exc).__name__}: {exc}")

    def client(self, index: int) -> None:
        """One API client: a keep-alive connection to each web server, used in turn."""
        rng = random.Random(index)
        ports = [p.port for p in self.processes.values() if p.port]
        connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for port in ports]
        work, doomed = self.work[index], list(self.doomed[index])
        delete_every = self.seconds / (len(doomed) + 1)
        began = time.monotonic()
        stop_at = began + self.seconds
        turn, n, next_delete = index, 0, delete_every
        while time.monotonic() < stop_at:
            turn += 1
            server = turn % len(connections)
            if doomed and time.monotonic() - began >= next_delete:
                next_delete += delete_every
                self.delete(connections, server, doomed.pop(0)[0])
                continue
            roll = rng.random()
            thread = rng.choice(work)
            if roll < 0.4:
                n += 1
                text = f"{SOAK_PREFIX}{index}:{n}:{uuid.uuid4().hex}"
                answer = self.call(connections, server, "append", "POST", f"/v1/threads/{thread}/items",
                                   {"role": "user", "content": text}, expect=201)
                if answer is not None:
                    with self.recorder.lock:
                        self.appended.append((thread, text, answer["id"]))
            elif roll < 0.55:
                self.call(connections, server, "read_items", "GET", f"/v1/threads/{thread}/items?limit=50")
            elif roll < 0.7:
                self.call(connections, server, "list_threads", "GET", "/v1/threads?limit=50")
            elif roll < 0.8:
                self.call(connections, server, "thread_detail", "GET", f"/v1/threads/{thread}")
            else:
                wanted = not self.archived.get(thread, False)
                kind = "archive" if wanted else "unarchive"
                answer = self.call(connections, server, kind, "PATCH", f"/v1/threads/{thread}",
                                   {"archived": wanted})
                if answer is not None:
                    if answer.get("archived") is not wanted:
                        self.recorder.error(kind, f"answered archived={answer.get('archived')}")
                    else:
                        self.archived[thread] = wanted
        while doomed:  # whatever is left is deleted now, so every seeded delete is requested
            self.delete(connections, turn % len(connections), doomed.pop(0)[0])
            turn += 1
        for c in connections:
            c.close()

    def delete(self, connections, server: int, thread: str) -> None:
        key = f"soak-{uuid.uuid4().hex}"
        first = self.call(connections, server, "delete", "DELETE", f"/v1/threads/{thread}", None, expect=202,
                          headers={"Idempotency-Key": key})
        again = self.call(connections, (server + 1) % len(connections), "delete_repeat", "DELETE",
                          f"/v1/threads/{thread}", None, expect=202, headers={"Idempotency-Key": key})
        with self.recorder.lock:
            if first is not None:
                self.deletes[thread] = first["id"]
            if again is not None:
                self.repeats[thread] = again["id"]

    def call(self, connections, server: int, kind: str, method: str, path: str, body: dict | None = None, *,
             expect: int = 200, headers: dict | None = None) -> dict | None:
        head = {"Authorization": f"Bearer {self.token}", "Accept": "application/json", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            head["Content-Type"] = "application/json"
        began = time.perf_counter()
        try:
            connections[server].request(method, path, body=data, headers=head)
            response = connections[server].getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            connections[server].close()
            self.recorder.error(kind, f"{method} {path}: {type(exc).__name__}")
            return None
        ms = (time.perf_counter() - began) * 1000
        if response.status != expect:
            self.recorder.error(kind, f"{method} {path}: {response.status} {raw[:200]!r}")
            return None
        self.recorder.ok(kind, ms)
        return json.loads(raw)

    # ---- The cleanup run: two starts at once, one admitted --------------------------------

    def guarded_cleanup(self) -> None:
        try:
            self.cleanup()
        except Exception as exc:  # checked by its own step
            self.cleanup_failure = f"{type(exc).__name__}: {exc}"

    def cleanup(self) -> None:
        """Enable tool payload cleanup through the API, start two runs at the same moment, one
        on each web server: exactly one is admitted and the other refused as busy; the admitted
        run removes every eligible payload once."""
        # The daily check the clusters run first thing would start a run of its own once cleanup
        # is on: wait until it has had its first pass (a day away afterwards) and that pass's job
        # has finished. A check queued at start but run late, behind the erasures, would find the
        # policy enabled and start a second run after the admitted one (CI saw it once).
        deadline = time.monotonic() + 180
        while not self.daily_check_done():
            if time.monotonic() > deadline:
                raise SoakFailed("the clusters' scheduler never ran the daily cleanup check")
            time.sleep(1)
        base = "/api/v1/system/tool-payload-retention"
        ports = [p.port for p in self.processes.values() if p.port]
        connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for port in ports]
        status = self.call(connections, 0, "cleanup_status", "GET", base)
        saved = self.call(connections, 1, "cleanup_policy", "PUT", base, {
            "enabled": True, "age": {"value": 4, "unit": "weeks"}, "revision": status["policy"]["revision"],
            "backup_choice": "skip"})
        if saved is None:
            raise SoakFailed("saving the cleanup policy failed")
        revision = saved["policy"]["revision"]
        answers: list[tuple[int, dict]] = []
        ready = threading.Barrier(len(ports))
        at_s = round(time.monotonic() - self.load_began, 1)

        def start(port: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            body = json.dumps({"revision": revision}).encode()
            head = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            ready.wait()
            began = time.perf_counter()
            c.request("POST", base + "/run", body=body, headers=head)
            response = c.getresponse()
            answer = json.loads(response.read())
            self.recorder.ok("cleanup_run", (time.perf_counter() - began) * 1000)
            with self.recorder.lock:
                answers.append((response.status, answer))
            c.close()

        starters = [threading.Thread(target=start, args=(port,)) for port in ports]
        # The clusters are paused while the starts are answered: under load one request can
        # reach its server seconds after the other, long enough for the admitted run (a few
        # dozen payloads) to finish, and the late start would then be admitted rightly: the
        # race would not have been run. Paused, the admitted run stays queued until both have
        # their answer (at most 20 s: a paused worker might hold a lock a start waits for).
        with self.clusters_paused():
            for t in starters:
                t.start()
            for t in starters:
                t.join(20)
        for t in starters:
            t.join(120)
        statuses = sorted(status for status, _answer in answers)
        refused = [a for status, a in answers if status == 409]
        admitted = [a["operation_id"] for status, a in answers if status == 202]
        self.figures["cleanup"] = {"at_s": at_s, "starts": len(answers), "admitted": len(admitted),
                                   "refused_busy": len(refused)}
        if statuses != [202, 409] or refused[0].get("code") != "busy":
            raise SoakFailed(f"two cleanup starts at once answered {answers}")
        began = time.monotonic()
        finished = None
        n = 0
        while finished is None and time.monotonic() < began + self.settle_seconds:
            n += 1
            doc = self.call(connections, n % len(connections), "cleanup_status", "GET", base)
            for op in (doc or {}).get("history", []):
                if op["id"] == admitted[0] and op["state"] not in ("queued", "running"):
                    finished = op
            time.sleep(0.5)
        for c in connections:
            c.close()
        if finished is None:
            raise SoakFailed(f"cleanup run {admitted[0]} did not finish within {self.settle_seconds:g} s")
        self.figures["cleanup"].update(
            state=finished["state"], removed_messages=finished["removed_messages"],
            payload_bytes=finished["payload_bytes"], seconds=round(time.monotonic() - began, 1))

    @staticmethod
    def daily_check_done() -> bool:
        """The daily cleanup check's next run is a day away and the job its last pass queued
        has finished (django-q2 keeps a finished job's row under the id the schedule names)."""
        from django_q.models import Schedule, Task

        from retention.jobs import DAILY

        schedule = Schedule.objects.filter(name=DAILY, next_run__gt=_in_hours(1)).first()
        return schedule is not None and bool(schedule.task) and Task.objects.filter(id=schedule.task).exists()

    def cleanup_checked(self) -> None:
        from lifecycle.models import Item
        from retention.models import ToolPayloadOperation

        if self.cleanup_failure:
            raise SoakFailed(f"cleanup run: {self.cleanup_failure}")
        figures = self.figures["cleanup"]
        runs = ToolPayloadOperation.objects.filter(kind="cleanup").count()
        left = Item.objects.filter(conversation__public_id__in=self.idle, removable_bytes__gt=0).count()
        removed = Item.objects.filter(conversation__public_id__in=self.idle, details_removed_at__isnull=False).count()
        figures.update(eligible=self.cleanup_items, cleanup_operations=runs)
        if (figures["state"], figures["removed_messages"], removed, left, runs) != (
                "succeeded", self.cleanup_items, self.cleanup_items, 0, 1):
            raise SoakFailed(f"cleanup run: {figures['state']}, removed {figures['removed_messages']} "
                             f"(stored {removed}, left {left}) of {self.cleanup_items}; {runs} cleanup operation(s)")

    def settle(self) -> None:
        from lifecycle.models import DeleteOperation

        began = time.monotonic()
        deadline = began + self.settle_seconds
        while True:
            pending = DeleteOperation.objects.exclude(state="completed").count()
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(1)
        self.figures["deletes_requested"] = len(self.deletes)
        self.figures["deletes_completed"] = DeleteOperation.objects.filter(state="completed").count()
        self.figures["delete_settle_seconds"] = round(time.monotonic() - began, 1)
        if pending:
            raise SoakFailed(f"{pending} delete operation(s) not Completed after {self.settle_seconds:g} s.")
        # Each operation as the API reports it, from both web servers in turn: Completed, with a receipt.
        ports = [p.port for p in self.processes.values() if p.port]
        connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for port in ports]
        for n, op_id in enumerate(self.deletes.values()):
            answer = self.call(connections, n % len(connections), "operation", "GET", f"/v1/operations/{op_id}")
            if answer is not None and (answer["state"] != "completed" or not answer.get("receipt")):
                self.recorder.error("operation", f"{op_id} answered {answer['state']}")
        for c in connections:
            c.close()
        ms = self.recorder.timings.get("operation", [])
        if ms:
            self.figures.setdefault("kinds", {})["operation"] = {
                "count": len(ms), "p50_ms": round(statistics.median(ms), 1), "p99_ms": round(percentile(ms, 0.99), 1)}
        self.figures["errors"] = self.recorder.error_count

    def check_books(self) -> None:
        from django.db.models import Count, Max
        from django_q.models import Task

        from lifecycle.models import Conversation, DeleteOperation, Item

        problems: list[str] = []
        # Appends: each acknowledged text stored exactly once, under the id the API answered.
        stored = dict(Item.objects.filter(content__startswith=SOAK_PREFIX).values_list("content")
                      .annotate(n=Count("id")).values_list("content", "n"))
        by_id = dict(Item.objects.filter(content__startswith=SOAK_PREFIX).values_list("id", "content"))
        acknowledged = {text for _thread, text, _id in self.appended}
        lost = [text for text in acknowledged if stored.get(text, 0) == 0]
        doubled = [text for text, n in stored.items() if n > 1]
        unacknowledged = [text for text in stored if text not in acknowledged]
        wrong_id = [text for _thread, text, pk in self.appended if by_id.get(pk) != text]
        for label, found in (("lost appends", lost), ("duplicated appends", doubled),
                             ("stored but never acknowledged", unacknowledged), ("stored under another id", wrong_id)):
            if found:
                problems.append(f"{len(found)} {label}")
        # Sequence numbers: 1..n in every work conversation.
        for public_id in (p for work in self.work for p in work):
            seqs = list(Item.objects.filter(conversation__public_id=public_id).values_list("seq", flat=True))
            if sorted(seqs) != list(range(1, len(seqs) + 1)):
                problems.append(f"{public_id}: sequence numbers are not 1..{len(seqs)}")
        # Archive: the last acknowledged change is the stored state.
        for public_id, archived in self.archived.items():
            c = Conversation.objects.get(public_id=public_id)
            if (c.archived_at is not None) != archived:
                problems.append(f"{public_id}: archived should be {archived}")
        # Deletes: one operation each, the same for the repeat, Completed, counted once.
        per_conversation = dict(DeleteOperation.objects.values_list("conversation__public_id")
                                .annotate(n=Count("id")).values_list("conversation__public_id", "n"))
        seeded = {p for doomed in self.doomed for p, _n in doomed}
        if set(per_conversation) != seeded or set(self.deletes) != seeded:
            problems.append(f"deletes: {len(seeded)} seeded, {len(self.deletes)} acknowledged, "
                            f"{len(per_conversation)} with an operation")
        for public_id, op_id in self.deletes.items():
            if per_conversation.get(public_id) != 1:
                problems.append(f"{public_id}: {per_conversation.get(public_id, 0)} delete operations")
                continue
            op = DeleteOperation.objects.select_related("conversation").get(conversation__public_id=public_id)
            if op.public_id != op_id or self.repeats.get(public_id) != op_id:
                problems.append(f"{public_id}: answered {op_id} then {self.repeats.get(public_id)}, stored {op.public_id}")
            if op.state != "completed" or op.conversation.state != "deleted":
                problems.append(f"{public_id}: operation {op.state}, conversation {op.conversation.state}")
            items = [s for s in (op.receipt or {}).get("stores", []) if s["store"] == "lifecycle.Item"]
            if [s["records"] for s in items] != [self.seeded_items[public_id]]:
                problems.append(f"{public_id}: receipt counts items {[s['records'] for s in items]}, "
                                f"{self.seeded_items[public_id]} were stored")
            if Item.objects.filter(conversation=op.conversation).exists():
                problems.append(f"{public_id}: items left after the delete")
        attempts = DeleteOperation.objects.aggregate(m=Max("attempts"))["m"] or 0
        failed_jobs = list(Task.objects.filter(success=False).values_list("func", flat=True))
        if failed_jobs:
            problems.append(f"{len(failed_jobs)} failed job(s): {sorted(set(failed_jobs))}")
        self.figures.update(
            appends_acknowledged=len(acknowledged), appends_stored=sum(stored.values()),
            archive_changes=sum(v["count"] for k, v in self.figures.get("kinds", {}).items()
                                if k in ("archive", "unarchive")),
            delete_operations=sum(per_conversation.values()), max_delete_attempts=attempts,
            jobs_succeeded=Task.objects.filter(success=True).count(), jobs_failed=len(failed_jobs),
        )
        if self.recorder.error_count:
            problems.append(f"{self.recorder.error_count} request error(s)")
            self.figures["first_errors"] = self.recorder.errors
        if problems:
            self.figures["violations"] = problems[:30]
            raise SoakFailed("; ".join(problems[:10]))

    def verify_erasure(self) -> None:
        done = self.manage("verify_erasure", "--all", "--json")
        try:
            report = json.loads(done.stdout)
        except ValueError:
            raise SoakFailed(f"verify_erasure failed: {done.stderr[-1500:]}") from None
        self.figures["verify_erasure"] = {"checked": len(report["reports"]), "found": report["found"]}
        if done.returncode != 0 or report["found"] or len(report["reports"]) != len(self.deletes):
            raise SoakFailed(f"verify_erasure --all is not clean (exit {done.returncode}).")

    def stop_all(self) -> None:
        """SIGTERM every serve (it stops its child gracefully), then kill whatever is left."""
        groups = {name: [p.popen.pid, *p.children()] for name, p in self.processes.items() if p.popen}
        for proc in self.processes.values():
            if proc.popen and proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGTERM)
        for name, proc in self.processes.items():
            if proc.popen:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(40)
                for pid in groups.get(name, []):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(5)
        self.processes.clear()


def _in_hours(hours: float):
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(hours=hours)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _healthy(port: int) -> bool:
    with contextlib.suppress(OSError, http.client.HTTPException):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/healthz")
        ok = c.getresponse().status == 200
        c.close()
        return ok
    return False


def _alive(holder: str) -> bool:
    from lifecycle.deletion.executor import holder_alive

    return holder_alive(holder)
