from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client
from django_q.models import OrmQ
from django_q.tasks import async_task
from prometheus_client.parser import text_string_to_metric_families

from ops import context, metrics
from ops.models import JobDurationBucket, JobStat
from tests import factories
from tests.jobs import SECRET
from tests.test_jobs import database_url

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "m" * 40


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


@pytest.mark.django_db
def test_it_shows_metrics_to_admins_only(admin_client, member_client):
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    assert member_client.get("/metrics").status_code == 403
    response = admin_client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert "lethe_job_queue" in response.content.decode()
    assert admin_client.post("/metrics").status_code == 405


@pytest.mark.django_db
def test_it_shows_metrics_for_the_metrics_token_alone(settings):
    client = Client()
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 401  # no token set
    settings.METRICS_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", HTTP_HOST="10.0.0.9")
    assert response.status_code == 200 and "lethe_conversations" in response.content.decode()
    assert "sessionid" not in response.cookies
    for wrong in (f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN, "Bearer "):
        assert client.get("/metrics", HTTP_AUTHORIZATION=wrong).status_code == 401, wrong


@pytest.mark.django_db
def test_it_counts_requests_by_view_name_and_status_never_by_path(admin_client, conversation):
    before = samples(admin_client.get("/metrics").content.decode())
    for _ in range(3):
        assert admin_client.get(f"/conversations/{conversation.public_id}/").status_code == 200
    assert admin_client.get("/conversations/c_00000000000000000000/").status_code == 404
    assert admin_client.get(f"/v1/threads/{conversation.public_id}").status_code == 200
    assert admin_client.get("/no/such/page/").status_code == 404
    text = admin_client.get("/metrics").content.decode()
    after = samples(text)

    def delta(view: str, status: str) -> float:
        labels = {"method": "GET", "view": view, "status": status}
        return value(after, "lethe_http_requests_total", **labels) - value(before, "lethe_http_requests_total", **labels)

    assert delta("lifecycle:conversation-detail", "200") == 3
    assert delta("lifecycle:conversation-detail", "404") == 1
    assert delta("api:api-thread-detail", "200") == 1
    assert delta("unmatched", "404") == 1
    count = value(after, "lethe_http_request_duration_seconds_count", method="GET",
                  view="lifecycle:conversation-detail", status="200")
    assert count >= 3
    assert conversation.public_id not in text and "/no/such/page/" not in text


@pytest.mark.django_db
def test_it_reads_the_queue_and_the_domain_figures_at_scrape_time(admin_client):
    factories.make_conversation(title="one")
    factories.make_conversation(title="two")
    async_task("ops.tasks.heartbeat")
    async_task("ops.tasks.heartbeat")
    found = samples(admin_client.get("/metrics").content.decode())
    assert value(found, "lethe_job_queue", state="waiting") == 2
    assert value(found, "lethe_job_queue", state="taken") == 0
    assert value(found, "lethe_conversations", state="live") == 2
    assert value(found, "lethe_conversations", state="deleted") == 0
    assert value(found, "lethe_metrics_reader_up", metric="lethe_conversations") == 1
    OrmQ.objects.all().delete()
    assert value(samples(admin_client.get("/metrics").content.decode()), "lethe_job_queue", state="waiting") == 0


@pytest.mark.django_db
def test_it_adds_a_gauge_with_one_function_and_survives_one_that_fails(admin_client):
    @metrics.gauge("lethe_test_answers", "Answers by kind.", labels=("kind", "size"))
    def answers():
        return {("yes", "big"): 3, ("no", "small"): 1}

    @metrics.gauge("lethe_test_broken", "Always fails.")
    def broken():
        raise RuntimeError(SECRET)

    try:
        found = samples(admin_client.get("/metrics").content.decode())
    finally:
        del metrics.READERS["lethe_test_answers"], metrics.READERS["lethe_test_broken"]
    assert value(found, "lethe_test_answers", kind="yes", size="big") == 3
    assert value(found, "lethe_test_answers", kind="no", size="small") == 1
    assert value(found, "lethe_metrics_reader_up", metric="lethe_test_broken") == 0
    assert value(found, "lethe_metrics_reader_up", metric="lethe_test_answers") == 1
    assert ("lethe_test_broken", frozenset()) not in found
    assert "lethe_job_queue" in {name for name, _labels in found}


def run_cluster(env: dict, until, timeout: float = 90) -> str:
    """Run a real `qcluster` until `until()` holds; returns what it logged."""
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not until():
            time.sleep(0.5)
    finally:
        cluster.send_signal(signal.SIGINT)
        try:
            _out, err = cluster.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            _out, err = cluster.communicate()
    return err


@pytest.mark.django_db(transaction=True)
def test_it_records_jobs_on_a_real_cluster_with_their_ids_in_the_logs(admin_client, engine_home):
    with context.bind(request_id="req-from-the-console"):
        worked = async_task("tests.jobs.work_on", 42)
    failed = async_task("tests.jobs.explode")
    beat = async_task("ops.tasks.heartbeat")
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home), "LOG_FORMAT": "json",
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1"}
    # Failures are retried after `retry` seconds: stop once each job has run once.
    logs = run_cluster(env, until=lambda: sum(JobStat.objects.values_list("runs", flat=True)) >= 3)

    stats = {s.func: s for s in JobStat.objects.all()}
    assert (stats["tests.jobs.work_on"].runs, stats["tests.jobs.work_on"].failures) == (1, 0)
    assert (stats["tests.jobs.explode"].runs, stats["tests.jobs.explode"].failures) == (1, 1)
    assert stats["ops.tasks.heartbeat"].runs == 1 and stats["ops.tasks.heartbeat"].last_failed_at is None
    assert stats["tests.jobs.explode"].last_failed_at is not None
    assert JobDurationBucket.objects.filter(stat=stats["tests.jobs.work_on"]).values_list("count", flat=True).get() == 1

    found = samples(admin_client.get("/metrics").content.decode())
    assert value(found, "lethe_job_runs_total", func="tests.jobs.explode", outcome="failure") == 1
    assert value(found, "lethe_job_runs_total", func="tests.jobs.work_on", outcome="success") == 1
    assert value(found, "lethe_job_duration_seconds_count", func="ops.tasks.heartbeat") == 1
    assert admin_client.get("/readyz").json()["checks"]["job_cluster"]["ok"] is True

    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    working = next(line for line in lines if line["logger"] == "lethe.tests")
    assert working["job_id"] == worked and working["operation_id"] == "42"
    assert working["request_id"] == "req-from-the-console" and working["job"] == "tests.jobs.work_on"
    ends = {line["job_id"]: line for line in lines if line["logger"] == "lethe.jobs"}
    assert ends[worked]["outcome"] == "success" and ends[failed]["outcome"] == "failure"
    assert ends[beat]["message"] == "job succeeded" and "operation_id" not in ends[beat]
    assert any(line["logger"] == "django-q" and line["message"].startswith("Failed 'tests.jobs.explode'")
               for line in lines)
    assert SECRET not in logs  # the failure's text stays in the task's result


def test_it_warns_about_a_short_metrics_token(settings):
    from ops.checks import check_metrics_token

    settings.METRICS_TOKEN = "short"
    assert [w.id for w in check_metrics_token()] == ["ops.W001"]
    settings.METRICS_TOKEN = TOKEN
    assert check_metrics_token() == []


@pytest.mark.django_db
def test_a_made_up_method_is_counted_as_other_and_adds_no_series(admin_client):
    """A server accepts any method name; counted by name, each would add series for good."""
    for n in range(5):
        assert admin_client.generic(f"X{n:04d}Q", "/healthz").status_code in (400, 405)
    text = admin_client.get("/metrics").content.decode()
    assert "X0000Q" not in text and "X0004Q" not in text
    found = samples(text)
    assert sum(v for (name, labels), v in found.items()
               if name == "lethe_http_requests_total" and ("method", "other") in labels) >= 5


@pytest.mark.django_db
def test_metrics_is_counted_under_its_url_name_whoever_reads_it(admin_client, settings):
    """Read with the metrics token it was counted as `metrics`, read by an admin as
    `ops:metrics`: one endpoint, two series."""
    settings.METRICS_TOKEN = TOKEN
    before = samples(admin_client.get("/metrics").content.decode())
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert admin_client.get("/metrics").status_code == 200
    after = samples(Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    views = {dict(labels)["view"] for name, labels in after if name == "lethe_http_requests_total"
             and "metrics" in dict(labels)["view"]}
    assert views == {"ops:metrics"}
    assert value(after, "lethe_http_requests_total", method="GET", view="ops:metrics", status="200") - value(
        before, "lethe_http_requests_total", method="GET", view="ops:metrics", status="200") == 3
