"""Work ending, and a cleanup run's count, in one order.

A tool payload cleanup run counts the conversations eligible when it starts (`counted_at`) and
then takes only those: a conversation whose work was running at that time is left to the next
run, by its turns' times (`retention.jobs.eligible_conversations(as_of=)`). A Close takes its
time before it commits, so a Close whose time came before the count but whose commit came
after it made the count see running work, and the run's later batches see work finished
before `counted_at`: the run removed items it had never counted (done 5 of 0).

So the two are ordered: the count takes its time and counts while no work can end, and a
transaction that ends work waits for a count under way. PostgreSQL: a transaction-scoped
advisory lock, shared by those that end work, exclusive for the count. SQLite: both are write
transactions, which its one write lock (BEGIN IMMEDIATE) already orders.
"""

from __future__ import annotations

from django.db import connection

# An arbitrary constant naming this lock among the database's advisory locks.
_ADVISORY_KEY = 0x4C455457  # "LETW"


def ending_work() -> None:
    """Inside a transaction that ends work (marks turns finished), before it takes its time."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [_ADVISORY_KEY])


def no_work_ending() -> None:
    """Inside the transaction of a count that takes the conversations idle now, before it
    takes its time: every transaction that ended work has committed, and none can until the
    count commits."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
