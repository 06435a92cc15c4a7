from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops import context
from ops.logs import ContextFilter, JsonFormatter, TextFormatter, logging_config

ROOT = Path(__file__).resolve().parent.parent


class Captured:
    def __init__(self, formatter: logging.Formatter) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)
        self.handler.addFilter(ContextFilter())

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.text.splitlines()]


@pytest.fixture
def captured():
    """Everything logged during the test, through the production filter and JSON formatter."""
    capture = Captured(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(capture.handler)
    try:
        yield capture
    finally:
        root.removeHandler(capture.handler)


def test_it_writes_one_json_object_a_line_with_the_bound_ids(captured):
    log = logging.getLogger("lethe.tests")
    with context.bind(request_id="r-1", operation_id=7, job_id="j-1", job="x.y"):
        log.info("moved %s items", 3, extra={"items": 3, "request": object()})
    log.warning("outside")
    first, second = captured.lines()
    assert first["message"] == "moved 3 items" and first["level"] == "INFO" and first["logger"] == "lethe.tests"
    assert (first["request_id"], first["operation_id"], first["job_id"], first["job"]) == ("r-1", "7", "j-1", "x.y")
    assert first["items"] == 3 and "request" not in first
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert "request_id" not in second and "operation_id" not in second


def test_it_logs_an_exception_by_its_type_and_place_never_its_message(captured):
    try:
        raise ValueError("the row said: my secret diary")
    except ValueError:
        logging.getLogger("lethe.tests").exception("could not save")
    (line,) = captured.lines()
    assert line["exception"]["type"] == "ValueError"
    assert any("test_logs.py" in frame and "test_it_logs_an_exception" in frame for frame in line["exception"]["stack"])
    assert "secret diary" not in captured.text


def test_it_cuts_the_error_text_from_the_job_clusters_failure_lines(captured):
    logging.getLogger("django-q").error("Failed 'lifecycle.tasks.erase' (twelve-alpha) - boom: secret text : Traceback...")
    logging.getLogger("django-q").info("Processed 'lifecycle.tasks.erase' (twelve-alpha)")
    failed, processed = captured.lines()
    assert failed["message"] == "Failed 'lifecycle.tasks.erase' (twelve-alpha) (the error is kept in the task's result)"
    assert processed["message"] == "Processed 'lifecycle.tasks.erase' (twelve-alpha)"
    assert "secret" not in captured.text


def test_a_job_queued_is_a_debug_line_only(captured):
    """r22: every command that queues a job printed django-q's "Enqueued [lethe] 12" amid its
    own output (and every request that queued one logged it): a line at LOG_LEVEL=DEBUG only."""
    q, root = logging.getLogger("django-q"), logging.getLogger()
    q.info("Enqueued [lethe] 12")
    q.info("Process-1 processing 'lifecycle.tasks.erase'")
    assert [line["message"] for line in captured.lines()] == ["Process-1 processing 'lifecycle.tasks.erase'"]
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        q.info("Enqueued [lethe] 13")
    finally:
        root.setLevel(level)
    assert {"level": "DEBUG", "message": "Enqueued [lethe] 13"}.items() <= captured.lines()[-1].items()


@pytest.mark.django_db
def test_a_refused_suspicious_request_is_logged_by_kind_never_by_what_it_sent(client, captured):
    """r22: Django's security lines quoted what the client sent ("Invalid HTTP_HOST header:
    '<the header>'...") where the docs say errors are logged by kind, never by message."""
    answer = client.get("/accounts/login/", HTTP_HOST="attacker-chosen.example")
    assert answer.status_code == 400
    lines = [line for line in captured.lines() if line["logger"].startswith("django.security")]
    assert [line["message"] for line in lines] == [
        "refused a suspicious request: DisallowedHost (what it sent is not logged)"]
    assert "attacker-chosen" not in captured.text


@pytest.mark.django_db
def test_a_csrf_refusal_keeps_its_reason_for_the_operator(captured):
    """r24: the reason is what tells a misconfigured proxy apart from an expired form."""
    from django.test import Client

    answer = Client(enforce_csrf_checks=True).post("/accounts/login/", {"username": "x"}, HTTP_HOST="127.0.0.1")
    assert answer.status_code == 403
    lines = [line for line in captured.lines() if line["logger"] == "django.security.csrf"]
    assert lines and "CSRF" in lines[0]["message"] and "refused a suspicious request" not in lines[0]["message"]


def test_it_writes_the_same_fields_as_text():
    record = logging.LogRecord("lethe.request", logging.INFO, __file__, 1, "GET %s", ("x",), None)
    record.status = 200
    with context.bind(request_id="abc"):
        ContextFilter().filter(record)
    text = TextFormatter().format(record)
    assert text.split(" ", 1)[1] == "INFO    lethe.request [request_id=abc] GET x status=200"


@pytest.mark.django_db
def test_a_path_with_line_ends_cannot_forge_a_text_log_line(settings, capsys):
    """r88: a path with %0D%0A wrote a second, real-looking access line in the text log (time,
    level, logger, request id): every control character is written as its escape."""
    import io

    from django.test import Client

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        forged = "2026-12-07T00:00:00.000Z WARNING lethe.request [request_id=x] login OK user=admin"
        Client(HTTP_HOST="127.0.0.1").get("/a%0D%0A" + forged.replace(" ", "%20") + "%E2%80%A8%1B[31m%C2%85")
    finally:
        root.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines and not any(line.startswith("2026-12-07T00:00:00.000Z") for line in lines), lines
    access = [line for line in lines if " lethe.request " in line and "GET" in line]
    assert len(access) == 1 and "path=/a\\r\\n2026-12-07T00:00:00.000Z" in access[0], access
    assert "\\u2028\\x1b[31m\\x85" in access[0] and "\x1b" not in stream.getvalue()


@pytest.mark.django_db
def test_it_gives_every_request_an_id_and_keeps_a_sane_one_from_the_caller(client, captured):
    response = client.get("/accounts/login/", HTTP_X_REQUEST_ID="edge-42.a:b")
    assert response["X-Request-ID"] == "edge-42.a:b"
    for insane in ("has space", "x" * 129, "line\nbreak", "", "-leading-dash", "é"):
        response = client.get("/accounts/login/", HTTP_X_REQUEST_ID=insane)
        made = response["X-Request-ID"]
        assert made != insane and len(made) == 32 and int(made, 16) >= 0
    two = {client.get("/healthz")["X-Request-ID"] for _ in range(2)}
    assert len(two) == 2
    access = [line for line in captured.lines() if line["logger"] == "lethe.request"]
    assert access[0]["request_id"] == "edge-42.a:b"
    assert access[0]["view"] == "login" and access[0]["status"] == 200 and access[0]["path"] == "/accounts/login/"
    assert all("duration_ms" in line for line in access)
    # Health probes that pass are counted, not logged.
    assert not [line for line in access if line["path"] == "/healthz"]


@pytest.mark.django_db
def test_it_binds_the_request_id_for_everything_the_request_logs(client, captured):
    client.get("/no/such/page/", HTTP_X_REQUEST_ID="req-404")
    by_logger = {line["logger"]: line for line in captured.lines()}
    assert by_logger["django.request"]["request_id"] == "req-404"  # Django's own "Not Found" line
    assert by_logger["lethe.request"]["request_id"] == "req-404"
    assert context.current() == {}


def test_it_refuses_an_unknown_log_format():
    env = {**os.environ, "LOG_FORMAT": "xml", "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "LOG_FORMAT must be json or text, not 'xml'" in result.stderr
    with pytest.raises(ValueError):
        logging_config("xml")


def test_it_logs_text_lines_when_asked(tmp_path):
    env = {**os.environ, "LOG_FORMAT": "text", "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "ENGINE_HOME": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    script = "import logging; logging.getLogger('lethe.tests').warning('plain %s', 'words')"
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "lethe.tests" in line]
    assert line.endswith("WARNING lethe.tests plain words") and not line.startswith("{")
