"""gunicorn's configuration for `manage.py serve` (read with `gunicorn -c`).

Threaded workers (gthread; ops/gunicorn_worker.py answers the requests gunicorn refuses
itself in Lethe's JSON error document, and reads each request in the worker's main loop, so a
slow client holds no thread and is cut after WEB_READ_TIMEOUT seconds; a client that takes none of
its answer for WEB_WRITE_TIMEOUT is cut off): WEB_CONCURRENCY processes (default 2) of WEB_THREADS threads
(default 4) each. SIGTERM stops gracefully: the workers take no new connections and finish
the requests they hold, for up to WEB_GRACEFUL_TIMEOUT seconds (default 10, inside serve's
own 15 s grace); `serve` turns a SIGINT (Ctrl-C) into that SIGTERM. A worker process that
stops answering its master for WEB_TIMEOUT seconds (default 60) is replaced; with threaded
workers a slow request does not count, so what a request waits on bounds it: an engine call,
its retries included, ends within ENGINE_CONNECT_TIMEOUT plus twice ENGINE_READ_TIMEOUT.

gunicorn's own lines go through the same formatter as Django's (LOG_FORMAT); its access log
stays off, since OpsMiddleware writes one line per request with the request id. When a worker
exits, its live metric files are marked dead so /metrics stops counting them, and its counters
and histograms are folded into the exited workers' files (ops/metrics_folder.py), so the folder
does not grow with every replaced worker (prometheus-client's multiprocess mode,
PROMETHEUS_MULTIPROC_DIR, which serve sets).

This file is loaded by the gunicorn master before Django, so it imports only ops.logs
(standard library) at the top.
"""

from __future__ import annotations

import os
from pathlib import Path

from ops.logs import logging_config

# gunicorn started by hand from another folder: a relative PROMETHEUS_MULTIPROC_DIR is taken from
# the project folder, as in the settings (serve already hands it over absolute). prometheus-client
# reads the variable itself in the master and in every worker, so it is set here, before they fork.
# A blank one is unset, as in the settings (r114).
if (_metrics := os.environ.get("PROMETHEUS_MULTIPROC_DIR")) is not None and not _metrics.strip():
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
elif _metrics and not Path(_metrics).is_absolute():
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(Path(__file__).resolve().parent.parent / _metrics)


def _number(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    value = int(raw) if raw else default
    if value < 1:
        raise ValueError(f"{name} must be at least 1")
    return value


wsgi_app = "console.wsgi:application"
# gthread, answering the requests gunicorn refuses itself (too long, malformed) in JSON
worker_class = "ops.gunicorn_worker.JsonErrorThreadWorker"
workers = _number("WEB_CONCURRENCY", 2)
threads = _number("WEB_THREADS", 4)
timeout = _number("WEB_TIMEOUT", 60)
graceful_timeout = _number("WEB_GRACEFUL_TIMEOUT", 10)
keepalive = 5
# Worker recycling bounds slow growth (a replaced worker's figures are folded, child_exit);
# the jitter keeps workers from restarting together.
max_requests = _number("WEB_MAX_REQUESTS", 5000)
max_requests_jitter = max_requests // 10
# The scheme comes from X-Forwarded-Proto alone, as docs/operations.md says (r107: gunicorn's
# default also believed X-Forwarded-Ssl and X-Forwarded-Protocol, so a client adding
# "X-Forwarded-Ssl: off" got 400 through a correct https proxy, and "on" skipped the redirect
# through one that sets no X-Forwarded-Proto).
secure_scheme_headers = {"X-FORWARDED-PROTO": "https"}
accesslog = None
errorlog = "-"
# serve manages the server's life; one shared control socket per user would also make
# several servers on one host step on each other.
control_socket_disable = True

_logging = logging_config(os.environ.get("LOG_FORMAT", "json").strip().lower() or "json",
                          os.environ.get("LOG_LEVEL", "INFO").upper())
_logging["loggers"]["gunicorn.error"] = {"handlers": ["stderr"], "level": "INFO", "propagate": False}
_logging["loggers"]["gunicorn.access"] = {"handlers": [], "level": "CRITICAL", "propagate": False}
logconfig_dict = _logging


def child_exit(server, worker) -> None:
    if folder := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        from ops.metrics_folder import fold_exited_worker

        multiprocess.mark_process_dead(worker.pid)
        try:
            fold_exited_worker(folder, worker.pid)
        except Exception:  # the master goes on: its files stay, counted as before
            server.log.exception("The figures of worker %s could not be folded", worker.pid)
