"""Health for monitors and load balancers: `/healthz` (the process answers) and `/readyz` (it
can do its work). Both are JSON, open without a session, and answered by OpsMiddleware before
anything else runs: no session, no host check (probes often use an address, not a name), no
HTTPS redirect, and `/healthz` never touches the database.

`/readyz` answers 200 when every check passes and 503 otherwise, always with each check:
- database: a `SELECT 1` on the default database;
- engine_folder: a file can be created, written, synced and removed in ENGINE_HOME (an
  unnamed temporary file, so a probe cut short leaves nothing behind);
- job_cluster: a job finished on some job cluster within READYZ_HEARTBEAT_SECONDS (every
  cluster runs the `ops-heartbeat` job each minute, so an idle cluster still beats);
- migrations: none of the project's migrations is unapplied.
A failed check names the kind of error, never its text.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

DEFAULT_HEARTBEAT_SECONDS = 300


def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"ok": True}


def check_engine_folder() -> dict[str, Any]:
    """The engine folder takes a synced write. A console whose engine is remote (ENGINE_URL)
    keeps no engine folder: nothing to check (`serve` creates the folder of an embedded one)."""
    if settings.ENGINE_URL:
        return {"ok": True, "remote": True}
    root = settings.ENGINE_HOME
    if not os.path.isdir(root):
        return {"ok": False, "error": "missing"}
    with tempfile.TemporaryFile(dir=root) as probe:
        probe.write(b"ready")
        probe.flush()
        os.fsync(probe.fileno())
    return {"ok": True}


def check_job_cluster() -> dict[str, Any]:
    from ops.jobs import last_heartbeat

    limit = int(getattr(settings, "READYZ_HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS))
    beat = last_heartbeat()
    if beat is None:
        return {"ok": False, "error": "never", "limit_seconds": limit}
    age = max(0, round((timezone.now() - beat).total_seconds()))
    return {"ok": age <= limit, "seconds_since_last_job": age, "limit_seconds": limit}


def check_migrations() -> dict[str, Any]:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    unapplied = len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    return {"ok": unapplied == 0, "unapplied": unapplied}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "engine_folder": check_engine_folder,
    "job_cluster": check_job_cluster,
    "migrations": check_migrations,
}


def run_checks() -> dict[str, dict[str, Any]]:
    results = {}
    for name, check in CHECKS.items():
        try:
            results[name] = check()
        except Exception as exc:  # a probe reports, it never raises
            results[name] = {"ok": False, "error": type(exc).__name__}
    return results


def _no_store(response: JsonResponse) -> JsonResponse:
    response["Cache-Control"] = "no-store"
    return response


def healthz(request: HttpRequest) -> JsonResponse:
    return _no_store(JsonResponse({"status": "ok"}))


def readyz(request: HttpRequest) -> JsonResponse:
    checks = run_checks()
    ready = all(result["ok"] for result in checks.values())
    return _no_store(JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                                  status=200 if ready else 503))
