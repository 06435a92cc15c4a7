"""Schedules by name stay single when several processes create them at once (issue 10 part 2)."""

from __future__ import annotations

import threading

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
