"""Schedules by name stay single when several processes create them at once (issue 10 part 2)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django_q.models import Schedule

from console.schedules import ensure_named
from lifecycle.schedules import SCHEDULES as LIFECYCLE_SCHEDULES
from lifecycle.schedules import ensure_schedules as ensure_lifecycle
from ops.schedules import ensure_schedules as ensure_ops


def _spec(name: str) -> dict:
    return {name: {"func": "ops.tasks.heartbeat", "minutes": 5}}


@pytest.mark.django_db(transaction=True)
def test_concurrent_creators_leave_one_row_per_name():
    workers = 6
    for round_ in range(4):
        name = f"race-{round_}"
        barrier = threading.Barrier(workers)
        errors: list[BaseException] = []

        def create(name=name, barrier=barrier, errors=errors):
            try:
                barrier.wait(timeout=10)
                ensure_named(_spec(name))
            except BaseException as error:  # reported below, with the thread's traceback lost
                errors.append(error)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=create) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert Schedule.objects.filter(name=name).count() == 1, connection.vendor


@pytest.mark.django_db
def test_duplicates_left_by_an_older_release_are_healed():
    Schedule.objects.filter(name__in=list(LIFECYCLE_SCHEDULES)).delete()
    first = Schedule.objects.create(name="lifecycle-recover", func="old.func", minutes=9, repeats=-1)
    Schedule.objects.create(name="lifecycle-recover", func="lifecycle.tasks.recover", minutes=1, repeats=-1)
    Schedule.objects.create(name="lifecycle-recover", func="lifecycle.tasks.recover", minutes=1, repeats=-1)
    ensure_lifecycle()
    rows = list(Schedule.objects.filter(name="lifecycle-recover"))
    assert [(row.pk, row.func, row.minutes) for row in rows] == [(first.pk, "lifecycle.tasks.recover", 1)]
    assert Schedule.objects.filter(name="lifecycle-expire-facts").count() == 1


@pytest.mark.django_db
def test_ops_schedule_keeps_its_options_and_stays_single():
    ensure_ops()
    ensure_ops()
    rows = list(Schedule.objects.filter(name="ops-heartbeat"))
    assert len(rows) == 1 and rows[0].kwargs == "{'q_options': {'save': False}}"


# ---- The clock set back: every schedule runs within one interval (review r5-1) ---------------


def _every_schedule() -> None:
    from insight.schedules import ensure_schedules as ensure_insight
    from remote.schedules import ensure_schedules as ensure_remote
    from retention.schedules import ensure_schedules as ensure_retention

    for ensure in (ensure_lifecycle, ensure_retention, ensure_ops, ensure_remote, ensure_insight):
        ensure()


def _ran_while_the_clock_was_a_week_fast(monkeypatch, broker):
    """Every schedule runs once at a clock a week ahead, which is then set right: their next
    runs are left up to a week ahead. Returns the right time."""
    from django.utils import timezone
    from django_q.models import OrmQ
    from django_q.scheduler import scheduler

    real = timezone.now()
    _every_schedule()
    monkeypatch.setattr(timezone, "now", lambda: real + timedelta(days=7))
    scheduler(broker=broker)
    assert Schedule.objects.filter(next_run__gt=real + timedelta(days=6)).count() == Schedule.objects.count()
    OrmQ.objects.all().delete()
    monkeypatch.setattr(timezone, "now", lambda: real)
    return real


def _queued_by_schedule() -> set[str]:
    from django_q.models import OrmQ

    return {q.func() for q in OrmQ.objects.all()}


def _passes(monkeypatch, broker, real, minutes) -> None:
    from django.utils import timezone
    from django_q.scheduler import scheduler

    for at in minutes:
        monkeypatch.setattr(timezone, "now", lambda at=at: real + timedelta(minutes=at))
        scheduler(broker=broker)


@pytest.mark.django_db(transaction=True)  # django-q2's scheduler closes old connections
def test_it_runs_every_schedule_within_its_interval_after_the_clock_is_set_back_and_the_workers_start(
        monkeypatch):
    """django-q2 moves a next run only forward from the last one: a week-fast clock set right
    stopped every schedule for that week until the next `migrate`. A worker's start-up job
    brings each back to one interval from now, so the minute ones run within minutes, the
    hourly expiry within the hour and the daily check and measurement within a day."""
    from django_q.brokers import get_broker

    from lifecycle import tasks

    broker = get_broker()
    real = _ran_while_the_clock_was_a_week_fast(monkeypatch, broker)
    tasks.startup()
    _passes(monkeypatch, broker, real, (2,))
    minutely = {s.func for s in Schedule.objects.filter(schedule_type=Schedule.MINUTES, minutes=1)}
    assert minutely <= _queued_by_schedule(), connection.vendor
    _passes(monkeypatch, broker, real, (61, 24 * 60 + 1))
    assert {s.func for s in Schedule.objects.all()} <= _queued_by_schedule(), connection.vendor
    assert Schedule.objects.filter(next_run__gt=real + timedelta(days=2)).count() == 0


@pytest.mark.django_db(transaction=True)
def test_it_brings_a_far_next_run_in_at_the_minute_tick_and_leaves_near_ones_alone(monkeypatch):
    from django_q.brokers import get_broker

    from lifecycle import tasks

    real = _ran_while_the_clock_was_a_week_fast(monkeypatch, get_broker())
    daily = Schedule.objects.get(name="tool-payloads-daily-check")
    near = real + timedelta(hours=5)
    Schedule.objects.filter(pk=daily.pk).update(next_run=near)
    tasks.recover()  # the every-minute recovery
    runs = dict(Schedule.objects.values_list("name", "next_run"))
    assert runs["tool-payloads-daily-check"] == near
    assert runs["lifecycle-recover"] == real + timedelta(minutes=1)
    assert runs["lifecycle-expire-facts"] == real + timedelta(hours=1)
    assert runs["measure-storage"] == real + timedelta(days=1)


@pytest.mark.django_db(transaction=True)
def test_it_brings_far_next_runs_in_from_the_cluster_guard_when_no_worker_restarts(monkeypatch):
    """Set back while the cluster runs, the clock leaves the every-minute recovery a week ahead
    too: the guard's own check (every 30 s beside its scheduler pass) brings them in."""
    import time

    from django_q.brokers import get_broker

    from ops.cluster import SCHEDULE_CHECK_SECONDS, Sentinel

    real = _ran_while_the_clock_was_a_week_fast(monkeypatch, get_broker())
    sentinel = Sentinel.__new__(Sentinel)  # its __init__ runs a whole cluster
    sentinel.schedules_checked = time.monotonic()
    sentinel.keep_schedules_near()  # within 30 s of the last check: nothing read
    assert Schedule.objects.filter(next_run__lte=real + timedelta(days=1)).count() == 0
    sentinel.schedules_checked -= SCHEDULE_CHECK_SECONDS
    sentinel.keep_schedules_near()
    runs = dict(Schedule.objects.values_list("name", "next_run"))
    assert runs["lifecycle-recover"] == real + timedelta(minutes=1)
    assert runs["remote-hourly"] == real + timedelta(hours=1)
    assert runs["tool-payloads-daily-check"] == real + timedelta(days=1)
