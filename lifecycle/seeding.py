"""Deterministic, realistic demo data in both stores (database and engine folder).

The same seed and anchor give the same rows and the same files. Items go in through one
executemany per 2,000 rows (COPY on PostgreSQL) and payloads are slices of one generated
corpus, so seeding 100,000 items takes seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from lifecycle import fleet as fleet_file
from lifecycle import models as m
from lifecycle.enginefs import CONVERSATION_AREAS, EngineHome, jsonl, read_regular, remove_regular
from retention.reducer import encode, item_figures, normalize

TOPICS = [
    "Fix flaky login test", "Migrate billing job to queue", "Investigate slow search", "Draft release notes",
    "Refactor payment adapter", "Add dark mode to settings", "Upgrade build tooling", "Audit API permissions",
    "Profile memory growth in worker", "Write onboarding guide", "Clean up feature flags", "Triage crash reports",
    "Port CSV export to streaming", "Harden file upload checks", "Review database indexes", "Plan Q3 roadmap",
    "Automate nightly backups", "Summarize customer feedback", "Rework error messages", "Tune cache expiry",
]
WORDS = (
    "alpha beta cache commit config deploy diff error event export fetch file handler index job "
    "lock log merge module null offset parse patch path query queue render request response retry "
    "schema server session shell status stream table test thread timeout token trace update user "
    "value worker write yaml zone build check client daemon field guard hash input limit metric"
).split()
TITLES = {"shell": "Run tests", "read_file": "Read file", "edit_file": "Edit file",
          "search": "Search workspace", "http": "Fetch URL"}
TOOL_KINDS = ["shell", "read_file", "edit_file", "search", "http", "generic", "shell", "read_file",
              "plan", "todo", "subagent_task", "background_work", "monitor", "edit_file", "generic"]


_UNTOUCHED = object()  # a file this run has not written (`Seeder.discard`)


def _contents(path: Path) -> bytes | None:
    try:
        return read_regular(path)
    except FileNotFoundError:
        return None


@dataclass
class SeedReport:
    conversations: int = 0
    items: int = 0
    files: int = 0


def _corpus(rng: random.Random, size: int = 1 << 20) -> str:
    lines = []
    total = 0
    n = 0
    while total < size:
        n += 1
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
        line = f"{n:05d} {rng.choice(['INFO', 'DEBUG', 'WARN', 'ok', '  ', '+', '-'])} {words}"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


class Seeder:
    def __init__(self, *, seed: int, anchor: date | datetime, messages: int, home: EngineHome) -> None:
        """`anchor` is "now" for the data: a moment, or a day (its noon, UTC) for fixed output.

        Nothing is seeded after the anchor, so a live console never shows activity "from now".
        """
        self.rng = random.Random(seed)
        if isinstance(anchor, datetime):
            self.anchor = anchor.replace(second=0, microsecond=0)
        else:
            self.anchor = datetime.combine(anchor, time(12, 0), tzinfo=UTC)
        self.messages = messages
        self.home = home
        self.corpus = _corpus(random.Random(seed ^ 0x5EED))
        # What this run wrote to the engine folder, for `discard`
        self.written_keys: list[str] = []
        self.written_agents: set[str] = set()
        self.legacy_before: bytes | None | object = _UNTOUCHED

    # Text ---------------------------------------------------------------------

    def text(self, size: int) -> str:
        start = self.rng.randrange(0, len(self.corpus) - size - 1)
        return self.corpus[start:start + size]

    def payload_size(self) -> int:
        # 1 KB to 50 KB, most near the low end, as real tool output is.
        return int(1024 * 50 ** (self.rng.random() ** 2))

    def hexid(self, n: int = 12) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"

    def payload(self, kind: str) -> dict[str, Any]:
        size = self.payload_size()
        path = f"src/{self.rng.choice(WORDS)}/{self.rng.choice(WORDS)}.py"
        if kind == "shell":
            return {"command": f"pytest -q tests/test_{self.rng.choice(WORDS)}.py", "cwd": "/workspace/app",
                    "exit_code": self.rng.choice([0, 0, 0, 1, 2]), "truncated": size > 40_000,
                    "stdout": self.text(size), "stderr": self.text(self.rng.randint(0, 400))}
        if kind == "read_file":
            start = self.rng.randint(1, 400)
            return {"path": path, "range": [start, start + 120], "line_count": 120, "content": self.text(size)}
        if kind == "edit_file":
            changes = []
            for _ in range(self.rng.randint(1, 3)):
                line = self.rng.randint(1, 900)
                part = size // 3
                changes.append({"path": path, "change_type": self.rng.choice(["modify", "add", "delete"]),
                                "start_line": line, "end_line": line + 20, "old_content": self.text(part // 2),
                                "new_content": self.text(part // 2), "diff": self.text(part)})
            return {"changes": changes}
        if kind == "search":
            files = [f"src/{self.rng.choice(WORDS)}/{w}.py" for w in self.rng.sample(WORDS, 8)]
            return {"query": self.rng.choice(WORDS), "scope": "workspace", "file_count": len(files),
                    "matches": [{"path": f, "lines": self.text(size // 8)} for f in files]}
        if kind == "http":
            return {"url": f"https://api.example.test/v1/{self.rng.choice(WORDS)}", "method": "GET",
                    "status": self.rng.choice([200, 200, 404, 500]), "response": self.text(size)}
        if kind == "generic":
            structured = self.rng.random() < 0.3
            output: Any = {"rows": self.rng.randint(1, 90), "table": self.rng.choice(WORDS)} if structured else self.text(size)
            return {"tool_name": f"{self.rng.choice(WORDS)}_tool", "input": {"arg": self.text(200)}, "output": output}
        if kind in ("plan", "todo"):
            return {"steps": [{"text": " ".join(self.rng.sample(WORDS, 5)), "done": self.rng.random() < 0.5}
                              for _ in range(self.rng.randint(2, 6))]}
        if kind == "subagent_task":
            return {"agent_id": "sa_" + self.hexid(8), "task": self.text(300), "result": self.text(600)}
        if kind == "background_work":
            return {"job": "bg_" + self.hexid(6), "state": "finished", "log": self.text(500)}
        return {"probe": self.rng.choice(WORDS), "samples": [self.rng.randint(1, 99) for _ in range(10)]}

    # Data -----------------------------------------------------------------------

    def owners(self) -> tuple[list[m.Account], list[m.Computer]]:
        accounts = [m.Account.objects.create(name=n, created_at=self.anchor - timedelta(days=900))
                    for n in ("Northwind Labs", "Harbor Analytics")]
        computers = [
            m.Computer.objects.create(name="studio-laptop", account=accounts[0], created_at=self.anchor - timedelta(days=600)),
            m.Computer.objects.create(name="build-box", account=None, created_at=self.anchor - timedelta(days=400)),
        ]
        return accounts, computers

    def run(self, conversations: int) -> SeedReport:
        """Seed in one transaction, so a seed killed at any point leaves no rows behind.

        Engine files are written along the way, before the transaction commits. A run that
        fails (a full disk, a lost database, Ctrl-C) removes them again (`discard`); the caller
        whose transaction holds this one calls `discard` too when its own commit fails. A run
        killed outright leaves them: a rerun with the same seed and anchor rewrites them with
        the same bytes and replaces (never duplicates) its rows in the fleet file, so killing
        and rerunning ends exactly where an uninterrupted run would.
        """
        report = SeedReport()
        self.home.sweep_temporaries()  # what an earlier, killed run may have left
        self.rows: list[tuple] = []
        self.extra_rows: dict[type, list] = {}
        fleet: list[dict[str, Any]] = []
        try:
            with transaction.atomic():
                accounts, computers = self.owners()
                convs = self.conversations(conversations, accounts, computers)
                # Only folders this run makes are its to remove: one there already (a killed run's,
                # rewritten below) stays whatever happens
                self.written_keys = [conv.storage_key for conv in convs if not any(
                    (self.home.root / area / conv.storage_key).exists() for area in CONVERSATION_AREAS)]
                report.conversations = len(convs)
                for index, conv in enumerate(convs):
                    report.items += self.fill(conv, index, fleet)
                    if index % 50 == 49:  # keep the collected rows, not the run, in memory
                        self.flush()
                self.flush()
                fleet.append({"agent_id": "sa_legacy_" + self.hexid(6), "origin": None, "legacy": True,
                              "status": "completed", "delivery": "settled",
                              "started_at": (self.anchor - timedelta(days=200)).isoformat(),
                              "finished_at": (self.anchor - timedelta(days=1)).isoformat(),
                              "prompt": self.text(200), "result": self.text(300)})
                seeded = {row["agent_id"] for row in fleet}
                self.written_agents = seeded
                fleet_file.update_fleet(home=self.home, change=lambda rows: [r for r in rows if r.get("agent_id") not in seeded] + fleet)
                self.legacy_before = _contents(self.home.legacy_fleet_path)
                self.home.write_atomic(self.home.legacy_fleet_path, json.dumps(
                    {"version": 0, "agents": [fleet[-1]]}, indent=1, sort_keys=True).encode())
        except BaseException:
            self.discard()
            raise
        report.files, _ = self.home.usage()
        return report

    def discard(self) -> None:
        """Remove what this run wrote to the engine folder, once its rows are rolled back: the
        folders it made for its conversations (none was there before it: no conversation's or
        earlier run's), its rows in the fleet file, and the legacy fleet file as it was.
        Best effort: what cannot be removed stays, and the console lists it as engine files
        outside conversations. Nothing to do after a second call."""
        from lifecycle.deletion.files import remove_folder

        keys, self.written_keys = self.written_keys, []
        agents, self.written_agents = self.written_agents, set()
        legacy, self.legacy_before = self.legacy_before, _UNTOUCHED
        for key in keys:
            for area in CONVERSATION_AREAS:
                with contextlib.suppress(Exception):  # (a symlink there is never followed: it stays)
                    remove_folder(self.home, self.home.root / area / key)
        if agents:
            with contextlib.suppress(Exception):
                fleet_file.update_fleet(home=self.home,
                                        change=lambda rows: [r for r in rows if r.get("agent_id") not in agents])
        if legacy is not _UNTOUCHED:
            with contextlib.suppress(Exception):
                if legacy is None:
                    remove_regular(self.home.legacy_fleet_path)
                else:
                    self.home.write_atomic(self.home.legacy_fleet_path, legacy)

    def add(self, obj) -> None:
        self.extra_rows.setdefault(type(obj), []).append(obj)

    def flush(self) -> None:
        """Write the collected rows; items through one executemany, the rest in bulk."""
        for model, objs in self.extra_rows.items():
            model.objects.bulk_create(objs, batch_size=500)
        self.extra_rows.clear()
        if not self.rows:
            return
        columns = ("conversation_id, turn_id, seq, role, tool_kind, tool_call_id, status, title, content, "
                   "payload, payload_bytes, removable_bytes, payload_skip, removal_plan, revision, created_at, "
                   "updated_at")
        table = m.Item._meta.db_table
        if connection.vendor == "postgresql":
            # COPY streams rows without per-row statements; the server parses the JSON.
            with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in self.rows:
                    copy.write_row((*row[:14], 1, row[14], row[14]))
        else:
            ops = connection.ops
            sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * 17)})"
            with connection.cursor() as cursor:
                for start in range(0, len(self.rows), 2000):
                    cursor.executemany(sql, [
                        (*row[:14], 1, ops.adapt_datetimefield_value(row[14]), ops.adapt_datetimefield_value(row[14]))
                        for row in self.rows[start:start + 2000]
                    ])
        self.rows.clear()

    def conversations(self, n: int, accounts, computers) -> list[m.Conversation]:
        rows = []
        for i in range(n):
            bound = i % 3 != 2
            owner_index = (i // 3) % 2
            category = self.category(i)
            if category == "old":
                last = self.anchor - timedelta(days=self.rng.randint(100, 420), minutes=self.rng.randint(0, 1440))
            else:
                # Active conversations were touched minutes ago; idle ones up to two months ago.
                span = 120 if category == "active" else 60 * 24 * 60
                last = self.anchor - timedelta(minutes=self.rng.randint(1, span))
            thread = "thr_" + self.hexid(10)
            if i == 1:
                # Same raw thread id as conversation 0, under another owner: a different conversation.
                thread = rows[0].thread_id
                bound = False
            rows.append(m.Conversation(
                public_id="c_" + self.hexid(20),
                scope=m.Scope.BOUND if bound else m.Scope.LOCAL,
                account=accounts[owner_index] if bound else None,
                computer=None if bound else computers[owner_index],
                thread_id=thread,
                title=f"{TOPICS[i % len(TOPICS)]}" + (f" ({i // len(TOPICS) + 1})" if i >= len(TOPICS) else ""),
                created_at=last - timedelta(days=self.rng.randint(0, 30), hours=self.rng.randint(1, 20)),
                last_activity_at=last,
                archived_at=min(last + timedelta(hours=2), self.anchor) if category == "archived" else None,
                closed_at=min(last + timedelta(hours=1), self.anchor) if category == "closed" else None,
            ))
        return m.Conversation.objects.bulk_create(rows)

    @staticmethod
    def category(i: int) -> str:
        return ["active", "idle", "old", "idle", "archived", "closed", "old", "idle", "active", "old"][i % 10]

    def fill(self, conv: m.Conversation, index: int, fleet: list) -> int:
        rng = self.rng
        category = self.category(index)
        target = max(4, int(self.messages * (0.5 + rng.random())))
        span = max((conv.last_activity_at - conv.created_at).total_seconds(), 60.0)
        plan: list[list[str]] = []
        count = 0
        while count < target:
            steps = (["user", "assistant"] + ["tool"] * rng.randint(1, 3) + ["assistant"])[: target - count]
            plan.append(steps)
            count += len(steps)
        turns = [m.Turn(conversation=conv, seq=n, state=m.TurnState.DONE) for n in range(1, len(plan) + 1)]
        if category == "active":
            turns[-1].state = rng.choice([m.TurnState.RUNNING, m.TurnState.QUEUED])
            turns[-1].finished_at = None
        turns = m.Turn.objects.bulk_create(turns)
        seq = 0
        tool_index = index
        shell_items: list[tuple[int, dict[str, Any]]] = []
        events: list[dict[str, Any]] = []
        for turn, steps in zip(turns, plan, strict=True):
            for role in steps:
                seq += 1
                at = conv.created_at + timedelta(seconds=span * seq / target)
                kind = tool_call = status = title = ""
                payload_json = None
                size = removable = 0
                skip = ""
                removal_plan = None
                if role == "user":
                    content = f"Please {rng.choice(WORDS)} the {rng.choice(WORDS)} {rng.choice(WORDS)}; " + self.text(rng.randint(40, 300))
                elif role == "assistant":
                    content = f"I looked at the {rng.choice(WORDS)} {rng.choice(WORDS)}. " + self.text(rng.randint(80, 900))
                else:
                    content = ""
                    kind = TOOL_KINDS[tool_index % len(TOOL_KINDS)]
                    tool_index += 1
                    payload = self.payload(kind)
                    tool_call = "call_" + self.hexid(16)
                    status = rng.choice([m.ItemStatus.COMPLETED.value] * 5 + [m.ItemStatus.FAILED.value])
                    title = TITLES.get(kind, kind.replace("_", " ").capitalize())
                    # Stored, and measured, as the database gives it back.
                    payload = normalize(payload, vendor=connection.vendor)
                    payload_json = encode(payload)
                    size, removable, skip, removal_plan = item_figures(kind, payload, encoded=payload_json)
                    if kind == "shell":
                        shell_items.append((seq, payload))
                self.rows.append((conv.pk, turn.pk, seq, role, kind, tool_call, status, title, content,
                                  payload_json, size, removable, skip, removal_plan, at))
            events.append({"type": "turn.completed", "turn": turn.seq, "at": at.isoformat()})
        self.extras(conv, index, category, fleet)
        self.files(conv, events, shell_items, index)
        return seq

    def extras(self, conv: m.Conversation, index: int, category: str, fleet: list) -> None:
        rng, at = self.rng, conv.last_activity_at
        self.add(m.Goal(conversation=conv, text=f"Goal: {conv.title}", created_at=conv.created_at))
        self.add(m.UsageFact(conversation=conv, input_tokens=rng.randint(1000, 90000),
                             output_tokens=rng.randint(500, 30000), recorded_at=at))
        self.add(m.BillingFact(conversation=conv, amount_minor=rng.randint(1, 900), recorded_at=at))
        self.add(m.AuditFact(conversation=conv, action="conversation.created", recorded_at=conv.created_at))
        self.add(m.OperationBinding(conversation=conv, operation_id="op_" + self.hexid(), target_id="turn_1",
                                    outcome=m.OperationOutcome.APPLIED, created_at=conv.created_at,
                                    request={"prompt": self.text(120)}))
        self.add(m.HistoryReceipt(conversation=conv, operation_id="op_" + self.hexid(), target_id="item_1",
                                  outcome=m.OperationOutcome.APPLIED, created_at=at, detail={"note": self.text(80)}))
        if index % 2 == 0:
            self.add(m.MailEnvelope(conversation=conv, sender="agent@workspace.test", recipient="team@workspace.test",
                                    subject=f"Update: {conv.title}", body=self.text(400), sent_at=at))
            self.add(m.Checkpoint(conversation=conv, label="before-refactor", snapshot={"files": 3, "note": self.text(200)}))
            self.add(m.BranchJournalEntry(conversation=conv, seq=1, branch="main", entry={"summary": self.text(160)}))
        if index % 3 == 0:
            self.add(m.SessionDocument(conversation=conv, name=f"{conv.title}.session", document={"turns": 4, "text": self.text(500)}))
            self.add(m.RecoveryMaterial(conversation=conv, kind=m.RecoveryKind.PRE_IMPORT_ARCHIVE, body=self.text(800)))
        if index % 4 == 0:
            self.add(m.SharedLink(conversation=conv, token="sh_" + self.hexid(16), publisher="web",
                                  publisher_supports_revoke=index % 8 == 0, published_at=at))
            self.add(m.Export(conversation=conv, path=f"exports/{conv.thread_id}.md", size_bytes=rng.randint(2000, 90000)))
        if index % 5 == 0:
            self.add(m.WorkspaceFile(conversation=conv, path=f"notes/{conv.thread_id}.md", size_bytes=rng.randint(100, 9000)))
            self.add(m.MemoryEntry(conversation=conv, scope=rng.choice(list(m.MemoryScope.values)),
                                   text=f"Prefers {rng.choice(WORDS)} over {rng.choice(WORDS)}"))
        if category == "active":
            self.add(m.ProcessLease(conversation=conv, holder=f"engine-{index}", workers=rng.randint(1, 3)))
            kind = [m.ClaimKind.APPROVAL, m.ClaimKind.USER_INPUT, m.ClaimKind.SHELL_JOB, m.ClaimKind.TASK][index % 4]
            self.add(m.RuntimeClaim(conversation=conv, kind=kind, label=f"{kind} for {conv.thread_id}", opened_at=at))
        if index % 6 == 0:
            status = "running" if category == "active" else "completed"
            fleet.append({"agent_id": "sa_" + self.hexid(8), "origin": {"conversation": conv.public_id},
                          "status": status, "delivery": "pending" if status == "running" else "settled",
                          "started_at": conv.created_at.isoformat(), "finished_at": None if status == "running" else at.isoformat(),
                          "prompt": self.text(200), "result": self.text(300)})

    def files(self, conv: m.Conversation, events: list, shell_items: list, index: int) -> None:
        key = conv.storage_key
        self.home.write_atomic(self.home.events_path(key), jsonl(events))
        if shell_items:
            receipts = [{"item_seq": seq, "command": p["command"], "decision": "approved"} for seq, p in shell_items]
            self.home.write_atomic(self.home.receipts_path(key), jsonl(receipts))
        if index % 4 == 1:
            self.home.write_atomic(self.home.artifacts_dir(key) / "large-output.txt",
                                   self.text(self.payload_size() * 2).encode())
