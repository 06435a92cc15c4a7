from __future__ import annotations

import pytest
from django.db import connection

from console.settings import database_from_url


def test_it_reads_a_postgres_url():
    db = database_from_url("postgres://lethe:s%40cret@db.internal:5433/console")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "lethe", "s@cret", "db.internal", "5433", "console"
    )


def test_it_reads_a_sqlite_url_with_concurrency_settings(tmp_path):
    db = database_from_url(f"sqlite:///{tmp_path}/db.sqlite3")
    assert str(db["NAME"]) == f"{tmp_path}/db.sqlite3"
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]


def test_it_refuses_an_unknown_scheme():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured):
        database_from_url("mysql://x/y")


@pytest.mark.django_db
def test_it_configures_the_connection_for_concurrent_writers():
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW default_transaction_isolation")
            assert cursor.fetchone()[0] == "read committed"
            assert connection.settings_dict["CONN_HEALTH_CHECKS"] is True
            return
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] >= 5000
        cursor.execute("PRAGMA secure_delete")
        assert cursor.fetchone()[0] == 1
