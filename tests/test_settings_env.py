"""Settings from the environment: a value Lethe cannot use stops it with one line naming the
variable, the value and what is accepted (manage.py: `Lethe configuration error: ...`, exit 2,
no traceback); the accepted values and the defaults are unchanged. And the SQLite database
holding the conversations is readable by its owner only."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parent.parent
# Every variable console/settings.py reads, so the outer environment (a DATABASE_URL, say)
# does not leak into these checks.
READ = ("LETHE_VAR_DIR", "SECRET_KEY", "SECRET_KEY_FILE", "DEBUG", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS",
        "DATABASE_URL", "ENGINE_HOME", "ENGINE_URL", "ENGINE_TOKEN", "ENGINE_TOKENS", "ENGINE_CONNECT_TIMEOUT",
        "ENGINE_READ_TIMEOUT", "ENGINE_RETRIES", "LIFECYCLE_OFFLINE_DELETE", "REMOTE_RETRY_SECONDS",
        "REMOTE_RETRY_MAX_SECONDS", "STATIC_ROOT", "HTTPS", "HSTS_SECONDS", "HSTS_INCLUDE_SUBDOMAINS", "HSTS_PRELOAD",
        "API_TOKEN_DAYS", "LOGIN_FREE_FAILURES", "LOGIN_DELAY_SECONDS", "LOGIN_USER_LOCK_AFTER",
        "LOGIN_ADDRESS_LOCK_AFTER", "LOGIN_LOCK_SECONDS", "LOGIN_FAILURE_WINDOW_SECONDS", "TRUSTED_PROXIES",
        "API_MAX_BODY_BYTES", "API_MAX_JSON_DEPTH", "API_MAX_PAGE_BYTES", "Q_WORKERS", "LOG_FORMAT", "LOG_LEVEL",
        "ACCESS_LOG", "METRICS_TOKEN", "READYZ_HEARTBEAT_SECONDS", "WEB_CONCURRENCY", "WEB_THREADS", "WEB_TIMEOUT",
        "WEB_GRACEFUL_TIMEOUT", "WEB_READ_TIMEOUT", "WEB_WRITE_TIMEOUT", "WEB_READ_BUFFER_BYTES", "WEB_MAX_REQUESTS",
        "LETHE_TOOL_JOB_LEASE_SECONDS", "LETHE_TOOL_JOB_STEP_SECONDS",
        "LETHE_TOOL_CLEANUP_BATCH", "LETHE_TOOL_CLEANUP_BATCH_BYTES", "LETHE_TOOL_CLEANUP_CONVERSATIONS",
        "LETHE_TOOL_CLEANUP_BATCH_SECONDS", "LETHE_TOOL_CLEANUP_PAUSE",
        "LETHE_TOOL_ANALYSIS_BATCH", "LETHE_ERASURE_HORIZON_WAIT", "PROMETHEUS_MULTIPROC_DIR", "LETHE_BACKUP_DIR",
        "LETHE_PG_BIN_DIR")
KEY = "lethe-settings-env-tests-" + "k" * 40


def load(monkeypatch, tmp_path, **env: str):
    """console/settings.py run afresh (as its own module) with exactly this environment."""
    for name in READ:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LETHE_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.setenv("SECRET_KEY", KEY)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("lethe_settings_probe", ROOT / "console" / "settings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(monkeypatch, tmp_path, **env: str) -> str:
    with pytest.raises(ImproperlyConfigured) as caught:
        load(monkeypatch, tmp_path, **env)
    return str(caught.value)


def manage(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in READ}
    base.update(DJANGO_SETTINGS_MODULE="console.settings", LETHE_VAR_DIR=str(tmp_path / "var"), SECRET_KEY=KEY)
    base.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=base, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: os.umask(0o022))


# Refused values -----------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "expected"), [
    ({"Q_WORKERS": "abc"}, "Q_WORKERS must be a whole number from 0 to 64, not 'abc'."),
    ({"WEB_CONCURRENCY": "abc"}, "WEB_CONCURRENCY must be a whole number from 1 to 64, not 'abc'."),
    ({"WEB_TIMEOUT": "0"}, "WEB_TIMEOUT must be a whole number of seconds from 1 to 3600, not '0'."),
    ({"WEB_READ_TIMEOUT": "0"}, "WEB_READ_TIMEOUT must be a whole number of seconds from 1 to 3600, not '0'."),
    ({"WEB_WRITE_TIMEOUT": "30s"}, "WEB_WRITE_TIMEOUT must be a whole number of seconds from 1 to 3600, not '30s'."),
    ({"WEB_READ_BUFFER_BYTES": "64MB"}, "WEB_READ_BUFFER_BYTES must be a whole number of bytes from 1048576 to "
                                       "17179869184, not '64MB'."),
    ({"Q_WORKERS": "65"}, "Q_WORKERS must be a whole number from 0 to 64, not '65'."),
    ({"API_TOKEN_DAYS": "abc"}, "API_TOKEN_DAYS must be a whole number of days from 1 to 3650, not 'abc'."),
    ({"API_TOKEN_DAYS": "-1"}, "API_TOKEN_DAYS must be a whole number of days from 1 to 3650, not '-1'."),
    ({"API_TOKEN_DAYS": "0"}, "API_TOKEN_DAYS must be a whole number of days from 1 to 3650, not '0'."),
    ({"READYZ_HEARTBEAT_SECONDS": "5m"}, "READYZ_HEARTBEAT_SECONDS must be a whole number of seconds from 60 to "
                                         "604800, not '5m'."),
    ({"ENGINE_RETRIES": "x"}, "ENGINE_RETRIES must be a whole number from 0 to 10, not 'x'."),
    ({"HTTPS": "true", "HSTS_SECONDS": "x"}, "HSTS_SECONDS must be a whole number of seconds from 0 to 63072000, "
                                             "not 'x'."),
    ({"LOGIN_LOCK_SECONDS": "-5"}, "LOGIN_LOCK_SECONDS must be a whole number of seconds from 1 to 604800, "
                                   "not '-5'."),
    ({"LOGIN_USER_LOCK_AFTER": "0"}, "LOGIN_USER_LOCK_AFTER must be a whole number from 1 to 10000, not '0'."),
    ({"TRUSTED_PROXIES": "-1"}, "TRUSTED_PROXIES must be a whole number from 0 to 10, not '-1'."),
    ({"API_MAX_BODY_BYTES": "2MB"}, "API_MAX_BODY_BYTES must be a whole number of bytes from 1024 to 1073741824, "
                                    "not '2MB'."),
    ({"ENGINE_CONNECT_TIMEOUT": "0"}, "ENGINE_CONNECT_TIMEOUT must be a number of seconds from 0.1 to 600, not '0'."),
    ({"ENGINE_READ_TIMEOUT": "nan"}, "ENGINE_READ_TIMEOUT must be a number of seconds from 0.1 to 3600, not 'nan'."),
    ({"REMOTE_RETRY_SECONDS": "10", "REMOTE_RETRY_MAX_SECONDS": "5"},
     "REMOTE_RETRY_MAX_SECONDS must be a number of seconds (not below REMOTE_RETRY_SECONDS) from 10 to 604800, "
     "not '5'."),
    ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'."),
    ({"LOG_FORMAT": "xml"}, "LOG_FORMAT must be json or text, not 'xml'."),
    ({"LIFECYCLE_OFFLINE_DELETE": "later"}, "LIFECYCLE_OFFLINE_DELETE must be pending or refuse, not 'later'."),
    ({"HTTPS": "ture"}, "HTTPS must be true or false (or 1/0, yes/no, on/off), not 'ture'."),
    ({"ENGINE_URL": "notaurl"}, "ENGINE_URL must be empty (the embedded engine) or an http:// or https:// URL with "
                                "a host, such as https://engine.example:8150, not 'notaurl'."),
    ({"ENGINE_URL": "http://engine:99999"}, "not 'http://engine:99999'."),
    ({"DATABASE_URL": "postgres://lethe@db:99999/lethe"},
     "DATABASE_URL must be sqlite:///path or postgres://user:password@host:port/name (a port from 1 to 65535), "
     "not 'postgres://lethe@db:99999/lethe'."),
    ({"DATABASE_URL": "mysql://db/lethe"}, "DATABASE_URL must be sqlite:///path or postgres://"),
    # SQLite would stop every command with a long traceback ("unable to open database file")
    ({"DATABASE_URL": "sqlite:////no-such-folder/lethe.sqlite3"},
     "The folder of the DATABASE_URL file does not exist: '/no-such-folder'. Create it first."),
    # two slashes: "var" was read as a host and dropped, and the database made at the project's top
    ({"DATABASE_URL": "sqlite://var/x.sqlite3"},
     "DATABASE_URL must not name a host in a SQLite URL ('var' in 'sqlite://var/x.sqlite3'): write "
     "sqlite:///relative/path (three slashes, from the project folder) or sqlite:////absolute/path (four slashes)."),
    ({"DATABASE_URL": "sqlite://localhost/srv/lethe.sqlite3"}, "('localhost' in 'sqlite://localhost/srv/lethe.sqlite3')"),
    # the long jobs' tunables: a typo used to fall back to the default, or stop at import with a traceback
    ({"LETHE_TOOL_CLEANUP_BATCH": "1k"}, "LETHE_TOOL_CLEANUP_BATCH must be a whole number of items from 1 to 100000, "
                                         "not '1k'."),
    ({"LETHE_TOOL_CLEANUP_PAUSE": "-1"}, "LETHE_TOOL_CLEANUP_PAUSE must be a number of seconds from 0 to 60, not '-1'."),
    ({"LETHE_TOOL_JOB_LEASE_SECONDS": "0"}, "LETHE_TOOL_JOB_LEASE_SECONDS must be a number of seconds from 1 to 86400, "
                                            "not '0'."),
    # set but naming no host: every request answered 400
    ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS must be the console's host names separated by commas, such as "
                            "lethe.example.org,127.0.0.1 (unset, it is 127.0.0.1,localhost), not ''."),
    ({"ALLOWED_HOSTS": " , "}, "not ' , '."),
    ({"LETHE_ERASURE_HORIZON_WAIT": "10s"}, "LETHE_ERASURE_HORIZON_WAIT must be a number of seconds from 0 to 3600, "
                                            "not '10s'."),
])
def test_a_value_it_cannot_use_is_refused_naming_the_variable_the_value_and_what_is_accepted(
        monkeypatch, tmp_path, env, expected):
    message = refused(monkeypatch, tmp_path, **env)
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize("value", ["notjson", "[1]", '"lethe_secret"', '{"notaurl": "lethe_secret"}',
                                   '{"https://engine.example": 5}', '{"https://engine.example": ""}'])
def test_bad_engine_tokens_are_refused_without_showing_a_token(monkeypatch, tmp_path, value):
    message = refused(monkeypatch, tmp_path, ENGINE_TOKENS=value)
    assert message.startswith('ENGINE_TOKENS must be a JSON object of engine URLs and their tokens')
    assert "lethe_secret" not in message and "not shown" in message


@pytest.mark.parametrize(("name", "value"), [
    ("ENGINE_TOKEN", "lethe_\u2713secret"), ("ENGINE_TOKEN", "lethe_se cret"), ("ENGINE_TOKEN", "lethe_\x7fsecret"),
    ("ENGINE_TOKENS", '{"https://engine.example": "lethe_\u00e9secret"}'),
    ("ENGINE_TOKENS", '{"https://engine.example": "lethe_se cret"}'),
])
def test_an_engine_token_a_header_cannot_carry_is_refused_without_showing_it(monkeypatch, tmp_path, name, value):
    """r114: a "✓" in ENGINE_TOKEN passed every check; each call to the engine was then a
    traceback (sync_bindings) or a 500 (bindings-sync)."""
    message = refused(monkeypatch, tmp_path, **{name: value})
    assert message.startswith(f"{name} must be ") and "printable ASCII only, no spaces" in message
    assert "secret" not in message.replace("secrets", "") and "not shown" in message


@pytest.mark.parametrize(("url", "shown"), [
    ("postgres://lethe:hunter2@db:99999/lethe", "postgres://lethe:***@db:99999/lethe"),
    ("postgres://lethe:hun/ter2@db:99999/lethe", "postgres://lethe:***@db:99999/lethe"),  # "/" in it
    ("postgres://lethe:hun@ter:2@db:99999/lethe", "postgres://lethe:***@db:99999/lethe"),  # "@" and ":"
    ("postgres://lethe:hunter2@[::1/lethe", "postgres://lethe:***@[::1/lethe"),  # unparseable: no traceback
])
def test_a_bad_database_url_is_quoted_without_its_password(monkeypatch, tmp_path, url, shown):
    message = refused(monkeypatch, tmp_path, DATABASE_URL=url)
    assert f"not '{shown}'." in message and "hunter2" not in message and "ter2" not in message


def test_a_password_in_a_sqlite_url_is_not_quoted(monkeypatch, tmp_path):
    """r12: the host of a SQLite URL was quoted whole, password and all."""
    for url, host in (("sqlite://lethe:Sup3rS3cretPw@db.internal/lethe", "lethe:***@db.internal"),
                      ("sqlite://lethe:Sup3r/S3cretPw@db.internal/lethe", "lethe:***@db.internal")):  # "/" in it
        message = refused(monkeypatch, tmp_path, DATABASE_URL=url)
        assert message.startswith(f"DATABASE_URL must not name a host in a SQLite URL ('{host}' in "
                                  "'sqlite://lethe:***@db.internal/lethe'): write sqlite:///relative/path")
        assert "S3cretPw" not in message and "Sup3r" not in message


# A PostgreSQL URL's connection parameters (console/libpq.py) --------------------------------

PG = "postgres://lethe:hunter2@db.internal:5432/lethe"


@pytest.mark.parametrize(("query", "expected"), [
    # r12: all three were dropped without a word (sslmode=require connected in plain text)
    ("sslmode=bogus&nonsense=1", "DATABASE_URL's sslmode must be one of disable, allow, prefer, require, "
                                 "verify-ca or verify-full, not 'bogus'."),
    ("nonsense=1", "DATABASE_URL names a connection parameter Lethe does not use ('nonsense'); it takes sslmode, "
                   "sslrootcert, "),
    ("sslmode=require&sslmode=disable", "DATABASE_URL gives sslmode twice; give each parameter once."),
    ("SSLMODE=require", "('SSLMODE')"),  # libpq's names are lower case
    ("sslpassword=x", "('sslpassword')"),  # would reach pg_dump only on its command line
    ("sslmode", "DATABASE_URL's query must be name=value pairs joined by &, not 'sslmode'."),
    ("sslmode=require&", "not ''."),
    ("sslmode=", "DATABASE_URL's sslmode must be one of disable, "),
    ("connect_timeout=1.5", "DATABASE_URL's connect_timeout must be a whole number of seconds from 0 (no limit) to "
                            "3600, not '1.5'."),
    ("connect_timeout=-1", "not '-1'."),
    ("connect_timeout=3601", "not '3601'."),
    ("application_name=" + "a" * 64, "DATABASE_URL's application_name must be up to 63 printable ASCII characters"),
    ("application_name=a%0Ab", "not 'a\\nb'."),
    ("target_session_attrs=primary-ish", "DATABASE_URL's target_session_attrs must be one of any, read-write, "
                                         "read-only, primary, standby or prefer-standby, not 'primary-ish'."),
    ("channel_binding=always", "DATABASE_URL's channel_binding must be one of disable, prefer or require"),
    ("ssl_min_protocol_version=TLSv1.4", "not 'TLSv1.4'."),
    # an escape that is not UTF-8 was read as U+FFFD: another value than the one written
    ("options=%ff", "DATABASE_URL's query holds percent-escapes that are not UTF-8 text: 'options=%ff'."),
])
def test_a_parameter_of_a_postgresql_url_it_cannot_use_is_refused(monkeypatch, tmp_path, query, expected):
    message = refused(monkeypatch, tmp_path, DATABASE_URL=f"{PG}?{query}")
    assert expected in message
    assert "\n" not in message and "hunter2" not in message


@pytest.mark.parametrize(("url", "expected"), [
    # the end of a password holding "?" or "/" would be read as parameters, and quoted
    ("postgres://lethe:hun?ter2@db.internal/lethe", "not 'postgres://lethe:***@db.internal/lethe'."),
    ("postgres://lethe:a?sslmode=ter2@db.internal/lethe", "not 'postgres://lethe:***@db.internal/lethe'."),
    ("postgres://lethe:12/hunter2@db.internal/lethe",
     "DATABASE_URL holds an \"@\" past its host ('postgres://lethe:***@db.internal/lethe'): write"),
    ("postgres://lethe:hunter2@db.internal/lethe#ter2", "not 'postgres://lethe:***@db.internal/lethe#ter2'."),
    # SQLite takes none: a query was dropped
    ("sqlite:///var/x.sqlite3?mode=ro", "DATABASE_URL must not have a query in a SQLite URL ('?mode=ro' in "
                                        "'sqlite:///var/x.sqlite3?mode=ro'): SQLite takes no connection parameters"),
    ("sqlite:///var/x.sqlite3#ter2", "not 'sqlite:///var/x.sqlite3#ter2'."),
])
def test_a_query_that_would_be_dropped_or_misread_is_refused_without_the_password(monkeypatch, tmp_path, url,
                                                                                    expected):
    message = refused(monkeypatch, tmp_path, DATABASE_URL=url)
    assert expected in message
    assert "hunter2" not in message and "hun" not in message.replace("hunter2", "")


def test_the_parameters_of_a_postgresql_url_reach_the_driver(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path, DATABASE_URL=(
        f"{PG}?sslmode=verify-full&sslrootcert=certs/ca.pem&sslcert=%2Fetc%2Flethe%2Fclient.crt"
        "&sslkey=/etc/lethe/client.key&connect_timeout=5&application_name=lethe+web"
        "&target_session_attrs=read-write&options=-c%20search_path%3Dlethe&passfile=/etc/lethe/pgpass"))
    database = s.DATABASES["default"]
    assert database["OPTIONS"] == {
        "sslmode": "verify-full", "sslrootcert": str(ROOT / "certs" / "ca.pem"),  # from the project folder
        "sslcert": "/etc/lethe/client.crt", "sslkey": "/etc/lethe/client.key", "connect_timeout": 5,
        "application_name": "lethe+web",  # "+" is a plus sign, as libpq reads a URL
        "target_session_attrs": "read-write", "options": "-c search_path=lethe", "passfile": "/etc/lethe/pgpass"}
    assert (database["HOST"], database["NAME"], database["PASSWORD"]) == ("db.internal", "lethe", "hunter2")
    assert load(monkeypatch, tmp_path, DATABASE_URL=f"{PG}?sslrootcert=system&connect_timeout=0").DATABASES[
        "default"]["OPTIONS"] == {"sslrootcert": "system", "connect_timeout": 0}
    assert load(monkeypatch, tmp_path, DATABASE_URL=f"{PG}?").DATABASES["default"]["OPTIONS"] == {}


def test_a_long_or_odd_value_is_quoted_escaped_and_cut(monkeypatch, tmp_path):
    message = refused(monkeypatch, tmp_path, Q_WORKERS="1\n2\x1b[31m" + "9" * 500)
    assert message.startswith("Q_WORKERS must be a whole number from 0 to 64, not '1\\n2\\x1b[31m999")
    assert "\n" not in message and "\x1b" not in message and "…'." in message and len(message) < 200


def test_a_secret_key_file_that_is_a_folder_or_not_text_is_refused_by_name(monkeypatch, tmp_path):
    folder = tmp_path / "key-folder"
    folder.mkdir(mode=0o700)
    message = refused(monkeypatch, tmp_path, SECRET_KEY="", SECRET_KEY_FILE=str(folder))
    assert message.startswith(f"SECRET_KEY_FILE names {folder}, which is not a file")
    binary = tmp_path / "key.bin"
    binary.write_bytes(b"\xff\xfe\x00key")
    binary.chmod(0o600)
    message = refused(monkeypatch, tmp_path, SECRET_KEY="", SECRET_KEY_FILE=str(binary))
    assert message == f"SECRET_KEY_FILE names {binary}, which cannot be read: it is not text."


# Accepted values and defaults, unchanged ----------------------------------------------------

def test_the_defaults_are_unchanged(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path)
    assert s.Q_CLUSTER["workers"] == 2 and s.API_TOKEN_DAYS == 90 and s.READYZ_HEARTBEAT_SECONDS == 300
    assert (s.ENGINE_CONNECT_TIMEOUT, s.ENGINE_READ_TIMEOUT, s.ENGINE_RETRIES) == (3, 15, 2)
    assert (s.REMOTE_RETRY_SECONDS, s.REMOTE_RETRY_MAX_SECONDS) == (5, 300)
    assert s.LOGIN_THROTTLE == {"free_failures": 3, "delay_seconds": 1, "max_delay_seconds": 60,
                                "user_lock_after": 10, "address_lock_after": 30, "lock_seconds": 900,
                                "window_seconds": 900}
    assert (s.TRUSTED_PROXIES, s.API_MAX_BODY_BYTES, s.API_MAX_JSON_DEPTH, s.API_MAX_PAGE_BYTES) == (
        0, 2 * 1024 * 1024, 64, 4 * 1024 * 1024)
    assert (s.LOG_FORMAT, s.LOGGING["root"]["level"], s.ACCESS_LOG) == ("json", "INFO", True)
    assert (s.ENGINE_URL, s.ENGINE_TOKENS, s.LIFECYCLE_OFFLINE_DELETE, s.DEBUG, s.HTTPS) == (
        "", {}, "pending", False, False)
    assert s.DATABASES["default"]["NAME"] == tmp_path / "var" / "lethe.sqlite3"
    assert s.DATABASES["default"]["ENGINE"] == "console.sqlite"  # Django's, with quicker lock retries
    assert (s.TOOL_JOB_LEASE_SECONDS, s.TOOL_JOB_STEP_SECONDS, s.TOOL_CLEANUP_BATCH_BYTES,
            s.TOOL_CLEANUP_CONVERSATIONS, s.TOOL_ANALYSIS_BATCH, s.ERASURE_HORIZON_WAIT) == (
        30, 60, 64_000_000, 200, 2000, 10)
    # unset: the job picks its default for the engine
    assert (s.TOOL_CLEANUP_BATCH, s.TOOL_CLEANUP_BATCH_SECONDS, s.TOOL_CLEANUP_PAUSE) == (None, None, None)
    https = load(monkeypatch, tmp_path, HTTPS="true")
    assert https.SECURE_HSTS_SECONDS == 365 * 24 * 3600 and https.SECURE_HSTS_INCLUDE_SUBDOMAINS is True


def test_the_accepted_spellings_work_and_a_blank_value_means_the_default(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path, Q_WORKERS=" 0 ", HTTPS="TRUE", HSTS_SECONDS="0", HSTS_PRELOAD="yes",
             ACCESS_LOG="off", DEBUG="0", LOG_LEVEL="warning", LOG_FORMAT=" Text ", LIFECYCLE_OFFLINE_DELETE="REFUSE",
             ENGINE_TOKENS='{"https://engine.example/": " lethe_abc "}', ENGINE_URL=" http://127.0.0.1:8150/ ",
             ENGINE_CONNECT_TIMEOUT="0.5", REMOTE_RETRY_SECONDS="1", REMOTE_RETRY_MAX_SECONDS="2", API_TOKEN_DAYS="",
             DATABASE_URL="postgres://lethe:s%40cret@db.internal:5433/console", LETHE_TOOL_CLEANUP_PAUSE="0",
             LETHE_TOOL_CLEANUP_BATCH=" 2 ")
    assert s.Q_CLUSTER["workers"] == 0 and s.HTTPS is True and s.SECURE_HSTS_SECONDS == 0
    assert s.SECURE_HSTS_PRELOAD is True and s.ACCESS_LOG is False and s.DEBUG is False
    assert s.LOGGING["root"]["level"] == "WARNING" and s.LOG_FORMAT == "text"
    assert s.LIFECYCLE_OFFLINE_DELETE == "refuse" and s.ENGINE_TOKENS == {"https://engine.example": "lethe_abc"}
    assert s.ENGINE_URL == "http://127.0.0.1:8150/" and s.ENGINE_CONNECT_TIMEOUT == 0.5
    assert (s.REMOTE_RETRY_SECONDS, s.REMOTE_RETRY_MAX_SECONDS) == (1, 2) and s.API_TOKEN_DAYS == 90
    assert s.DATABASES["default"]["PORT"] == "5433" and s.DATABASES["default"]["PASSWORD"] == "s@cret"
    assert (s.TOOL_CLEANUP_PAUSE, s.TOOL_CLEANUP_BATCH) == (0, 2)


SHOW_PATHS = """
from django.conf import settings
print(settings.ENGINE_HOME, settings.VAR_DIR, settings.DATABASES["default"]["NAME"], sep="\\n")
"""


def test_relative_folders_are_taken_from_the_project_folder_whatever_the_current_one(tmp_path):
    """A command started from another folder (`cd /tmp && manage.py verify_erasure --all`)
    reads the same engine folder as the server: relative ENGINE_HOME and LETHE_VAR_DIR are
    resolved against the project folder, as a relative SQLite path in DATABASE_URL is."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in READ}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", SECRET_KEY=KEY, LETHE_VAR_DIR="var",
               ENGINE_HOME="var/engine-host/engine", DATABASE_URL="sqlite:///var/probe.sqlite3")
    shown = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-v0", "-c", SHOW_PATHS],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    engine_home, var_dir, database = shown.stdout.split()
    assert engine_home == str(ROOT / "var" / "engine-host" / "engine")
    assert var_dir == str(ROOT / "var")
    assert database == str(ROOT / "var" / "probe.sqlite3")
    assert os.listdir(elsewhere) == []  # nothing made in the folder it was started from


SHOW_FILES = """
from django.conf import settings
from console.management.commands.serve import metrics_dir
print(settings.SECRET_KEY, settings.STATIC_ROOT, metrics_dir(), sep="\\n")
"""


def test_a_relative_key_file_static_folder_and_metrics_folder_are_taken_from_the_project_folder(tmp_path):
    """SECRET_KEY_FILE, STATIC_ROOT and PROMETHEUS_MULTIPROC_DIR follow ENGINE_HOME: a command run
    from /tmp reads the same key, static files and metrics folder as one run from the project
    folder (a relative key file was "does not exist" there, the others folders under /tmp)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name = f"test-key-{os.getpid()}-{secrets.token_hex(4)}"
    key_file = ROOT / "var" / name
    key = "relative-key-file-" + secrets.token_hex(24)
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    try:
        env = {k: v for k, v in os.environ.items() if k not in READ and k != "PROMETHEUS_MULTIPROC_DIR"}
        env.update(DJANGO_SETTINGS_MODULE="console.settings", LETHE_VAR_DIR=str(tmp_path / "var"),
                   SECRET_KEY_FILE=f"var/{name}", STATIC_ROOT="var/probe-static",
                   PROMETHEUS_MULTIPROC_DIR="var/probe-prometheus")
        shown = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-v0", "-c", SHOW_FILES],
                               cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    finally:
        key_file.unlink()
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.split() == [key, str(ROOT / "var" / "probe-static"), str(ROOT / "var" / "probe-prometheus")]
    assert os.listdir(elsewhere) == []


def test_gunicorn_started_by_hand_takes_a_relative_metrics_folder_from_the_project_folder(tmp_path):
    """prometheus-client reads PROMETHEUS_MULTIPROC_DIR itself, in gunicorn's master and workers:
    the configuration makes a relative one absolute before they fork."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(PYTHONPATH=str(ROOT), PROMETHEUS_MULTIPROC_DIR="var/probe-prometheus")
    probe = ("import os, runpy; runpy.run_path(os.environ['CONFIG']); "
             "print(os.environ['PROMETHEUS_MULTIPROC_DIR'])")
    shown = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**env, "CONFIG": str(ROOT / "ops" / "gunicorn_config.py")})
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.strip() == str(ROOT / "var" / "probe-prometheus")


def test_a_relative_backup_folder_is_taken_from_the_project_folder(settings, tmp_path, monkeypatch):
    from retention.backups import backup_dir

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings.BASE_DIR, settings.LETHE_BACKUP_DIR = project, "var/backups"
    assert backup_dir() == project / "var" / "backups"
    assert (project / "var" / "backups").is_dir() and os.listdir(elsewhere) == []


# Paths: blank is unset, a blank around one is refused ----------------------------------------

def quoted(value: str) -> str:
    """A value as a configuration error quotes it: escaped, cut after 60 characters."""
    return repr(value if len(value) <= 60 else value[:60] + "…")


PATHS = ("LETHE_VAR_DIR", "ENGINE_HOME", "STATIC_ROOT", "PROMETHEUS_MULTIPROC_DIR", "LETHE_BACKUP_DIR",
         "LETHE_PG_BIN_DIR")


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("where", ["leading", "trailing", "tab"])
def test_a_path_with_a_blank_at_its_start_or_end_is_refused_naming_the_variable(monkeypatch, tmp_path, name, where):
    """r114: the blank was part of the folder's name (another folder than meant); stripping it
    would be a guess."""
    value = {"leading": " probe-blank-path", "trailing": f"{tmp_path}/probe ", "tab": "\tprobe-blank-path"}[where]
    try:
        assert refused(monkeypatch, tmp_path, **{name: value}) == (
            f"{name} must be a path with no blank at its start or end (unset or blank: the default), not "
            f"{quoted(value)}.")
        assert not (tmp_path / "probe ").exists()
    finally:  # what LETHE_VAR_DIR made where it was taken (r114)
        for made in (ROOT / " probe-blank-path", ROOT / "\tprobe-blank-path"):
            if made.is_dir():
                shutil.rmtree(made)


def test_a_blank_path_is_unset_and_means_the_default(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path, ENGINE_HOME="  ", STATIC_ROOT=" ", PROMETHEUS_MULTIPROC_DIR="\t ",
             LETHE_BACKUP_DIR="  ", LETHE_PG_BIN_DIR=" ", DATABASE_URL=" \t ")
    defaults = {"ENGINE_HOME": tmp_path / "var" / "engine", "METRICS_DIR": tmp_path / "var" / "prometheus",
                "STATIC_ROOT": ROOT / "staticfiles"}
    assert {name: getattr(s, name) for name in defaults} == defaults
    # DATABASE_URL too (r149: blanks were refused as a malformed URL)
    assert str(s.DATABASES["default"]["NAME"]) == str(tmp_path / "var" / "lethe.sqlite3")
    # prometheus-client reads the variable itself, and takes even a blank one for its
    # multiprocess mode (its files then in the current folder): unset, as the settings take it.
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


SHOW_BLANK_PATHS = """
import os
from django.conf import settings
from retention.backups import _configured, configured_backup_dir
print(settings.VAR_DIR, settings.ENGINE_HOME, configured_backup_dir(), settings.METRICS_DIR, settings.STATIC_ROOT,
      _configured("LETHE_PG_BIN_DIR"), os.environ.get("PROMETHEUS_MULTIPROC_DIR"), sep="|")
"""


def test_blank_path_variables_are_the_defaults_and_make_no_folder_named_blanks(tmp_path):
    """r114's repro: LETHE_VAR_DIR="  " made and used a folder named two spaces in the project folder;
    ENGINE_HOME, LETHE_BACKUP_DIR, PROMETHEUS_MULTIPROC_DIR and STATIC_ROOT of blanks named one too."""
    blanks = ROOT / "  "
    assert not blanks.exists()
    try:
        shown = manage(tmp_path, "shell", "-v0", "-c", SHOW_BLANK_PATHS, LETHE_VAR_DIR="  ", ENGINE_HOME="  ",
                       LETHE_BACKUP_DIR="  ", PROMETHEUS_MULTIPROC_DIR="  ", STATIC_ROOT="  ", LETHE_PG_BIN_DIR="  ")
        made = blanks.exists()
    finally:
        if blanks.is_dir():
            shutil.rmtree(blanks)
    assert shown.returncode == 0, shown.stderr[-2000:]
    var = ROOT / "var"
    assert shown.stdout.strip().split("|") == [
        str(var), str(var / "engine"), str(var / "backups"), str(var / "prometheus"), str(ROOT / "staticfiles"), "None",
        "None"]
    assert not made


# manage.py: one line, exit 2 ----------------------------------------------------------------

@pytest.mark.parametrize(("env", "expected"), [
    ({"Q_WORKERS": "abc"}, "Q_WORKERS must be a whole number from 0 to 64, not 'abc'."),
    ({"LOG_FORMAT": "xml"}, "LOG_FORMAT must be json or text, not 'xml'."),
    ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'LOUD'."),
    ({"ENGINE_TOKENS": "[1]"}, "ENGINE_TOKENS must be a JSON object"),
    ({"DATABASE_URL": "postgres://postgres@127.0.0.1:99999/lethe"}, "not 'postgres://postgres@127.0.0.1:99999/lethe'."),
    ({"SECRET_KEY": "", "SECRET_KEY_FILE": "/"}, "SECRET_KEY_FILE names /, which is not a file"),
    ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS must be the console's host names separated by commas"),
    ({"DATABASE_URL": "postgres://postgres:hunter2@127.0.0.1:5432/lethe?sslmode=bogus&nonsense=1"},
     "DATABASE_URL's sslmode must be one of disable, allow, prefer, require, verify-ca or verify-full, not 'bogus'."),
    ({"DATABASE_URL": "sqlite://lethe:Sup3rS3cretPw@db.internal/lethe"}, "('lethe:***@db.internal' in "),
    ({"LETHE_BACKUP_DIR": "/srv/backups "}, "LETHE_BACKUP_DIR must be a path with no blank at its start or end (unset "
                                            "or blank: the default), not '/srv/backups '."),
])
def test_manage_py_prints_one_line_and_exits_2(tmp_path, env, expected):
    result = manage(tmp_path, "check", **env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("Lethe configuration error: ") and result.stderr.count("\n") == 1
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == "" and "hunter2" not in result.stderr and "S3cret" not in result.stderr


def test_a_var_folder_with_a_blank_at_its_end_is_refused_in_one_line_and_not_made(tmp_path):
    result = manage(tmp_path, "migrate", "-v0", LETHE_VAR_DIR=f"{tmp_path}/var ")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", (
        "Lethe configuration error: LETHE_VAR_DIR must be a path with no blank at its start or end (unset or blank: "
        f"the default), not {quoted(f'{tmp_path}/var ')}.\n"))
    assert not (tmp_path / "var ").exists()


def test_a_sqlite_url_with_two_slashes_is_refused_and_no_database_is_made(tmp_path):
    name = f"lethe-two-slashes-{os.getpid()}.sqlite3"
    try:
        result = manage(tmp_path, "migrate", "-v0", DATABASE_URL=f"sqlite://var/{name}")
        assert result.returncode == 2 and result.stderr.count("\n") == 1
        assert result.stderr.startswith("Lethe configuration error: DATABASE_URL must not name a host in a SQLite URL")
        assert not (ROOT / name).exists() and not (ROOT / "var" / name).exists()
    finally:  # where it went when "var" was dropped as a host
        for suffix in ("", "-wal", "-shm"):
            (ROOT / f"{name}{suffix}").unlink(missing_ok=True)


def test_migrate_refuses_a_bad_value_before_touching_the_database(tmp_path):
    result = manage(tmp_path, "migrate", "-v0", API_TOKEN_DAYS="-1")
    assert result.returncode == 2
    assert result.stderr == ("Lethe configuration error: API_TOKEN_DAYS must be a whole number of days from 1 to "
                             "3650, not '-1'.\n")
    assert not (tmp_path / "var" / "lethe.sqlite3").exists()


def outer_postgresql_url() -> str:
    """The server the tests run on (DATABASE_URL), its TLS off, as the URL of its `postgres`
    database (the one named in DATABASE_URL need not exist: the tests make their own); else skip."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://", "pgsql://")):
        pytest.skip("a PostgreSQL server's connection parameters")
    import psycopg

    url = url.partition("?")[0].rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(url.replace("pgsql://", "postgresql://", 1)) as server:
        if server.execute("SHOW ssl").fetchone()[0] != "off":
            pytest.skip("the server here speaks TLS")
    return url


def test_sslmode_require_is_used_not_dropped(tmp_path):
    """r12: `?sslmode=require` was dropped: Lethe connected in plain text to a server without TLS,
    where psql refuses. Now the connection fails, in one line saying why; without it, it works."""
    url = outer_postgresql_url()
    result = manage(tmp_path, "showmigrations", "lifecycle", DATABASE_URL=f"{url}?sslmode=require")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith("Lethe database error: The database server ") and "Traceback" not in result.stderr
    assert "server does not support SSL, but SSL was required" in result.stderr
    plain = manage(tmp_path, "showmigrations", "lifecycle", DATABASE_URL=f"{url}?sslmode=disable&connect_timeout=5")
    assert plain.returncode == 0 and plain.stdout.startswith("lifecycle"), plain.stderr[-2000:]


def test_application_name_reaches_the_server(tmp_path):
    url = outer_postgresql_url()
    result = manage(tmp_path, "shell", "-c", "from django.db import connection as c; cursor = c.cursor(); "
                    "cursor.execute('SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()'); "
                    "print(cursor.fetchone()[0])", DATABASE_URL=f"{url}?application_name=lethe-probe%2B1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "lethe-probe+1"


def test_dbshell_gives_psql_every_parameter_of_the_url(tmp_path):
    """Django's dbshell handed psql only sslmode, the certificate files and passfile: psql
    connected with another application_name, timeout and server options than Lethe does."""
    url = outer_postgresql_url()
    result = manage(tmp_path, "dbshell", "--", "-At", "-c",
                    "SELECT current_setting('application_name') || '|' || current_setting('search_path')",
                    DATABASE_URL=f"{url}?application_name=lethe-shell&options=-c%20search_path%3Dlethe_probe"
                                 "&connect_timeout=5")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "lethe-shell|lethe_probe"


# STATIC_ROOT: one line, exit 2 --------------------------------------------------------------

@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> dict:
    """serve's environment on a migrated SQLite database (production settings and storage)."""
    var = tmp_path_factory.mktemp("static-root")
    env = {"DATABASE_URL": f"sqlite:///{var / 'db.sqlite3'}", "ENGINE_HOME": str(var / "engine"),
           "PROMETHEUS_MULTIPROC_DIR": str(var / "metrics"), "LETHE_VAR_DIR": str(var / "var")}
    result = manage(var, "migrate", "-v0", **env)
    assert result.returncode == 0, result.stderr[-2000:]
    return env


@pytest.mark.parametrize(("where", "expected"), [
    ("file", "STATIC_ROOT names {root}, which is not a folder."),
    ("under a file", "STATIC_ROOT names {root}, where the static files cannot be written ("),
    ("/proc", "STATIC_ROOT names {root}, where the static files cannot be written (No such file or directory)."),
])
def test_serve_stops_in_one_line_on_a_static_root_it_cannot_use(tmp_path, migrated, where, expected):
    """r12: an unusable STATIC_ROOT ended serve with a Python traceback (exit status 1), where every
    other path setting gets one line and exit status 2."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    root = {"file": afile, "under a file": afile / "static", "/proc": Path("/proc/lethe-no-such-folder")}[where]
    result = manage(tmp_path, "serve", "--only", "web", "127.0.0.1:1", **migrated, STATIC_ROOT=str(root))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"Lethe configuration error: {expected.format(root=root)}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert afile.read_text() == "not a folder\n"


def test_serve_stops_in_one_line_with_exit_2_on_an_engine_home_that_is_a_file(tmp_path, migrated):
    """r50: a CommandError with exit status 1, which a supervisor takes for a child that died
    and restarts, where every other path setting gets one line and exit status 2."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    result = manage(tmp_path, "serve", "--only", "web", "127.0.0.1:1", **{**migrated, "ENGINE_HOME": str(afile)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == (f"Lethe configuration error: ENGINE_HOME ({afile}) is not a folder. Set ENGINE_HOME to a "
                             "folder, or to a path where one can be made.\n")
    assert afile.read_text() == "not a folder\n"


# The SQLite database: the owner's only --------------------------------------------------------

def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


SHOW_OPEN_MODES = """
import os
from django.db import connection
connection.ensure_connection()
name = str(connection.settings_dict["NAME"])
for path in (name, name + "-wal", name + "-shm"):
    print(oct(os.stat(path).st_mode & 0o777))
"""


def test_the_database_lethe_creates_and_its_folder_are_private(tmp_path):
    var = tmp_path / "made" / "var"
    result = manage(tmp_path, "migrate", "-v0", LETHE_VAR_DIR=str(var))
    assert result.returncode == 0, result.stderr[-2000:]
    assert mode(var) == 0o700
    assert mode(var / "lethe.sqlite3") == 0o600
    # While a connection is open SQLite keeps the -wal and -shm beside it: private too.
    shown = manage(tmp_path, "shell", "-v0", "-c", SHOW_OPEN_MODES, LETHE_VAR_DIR=str(var))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.split() == ["0o600", "0o600", "0o600"]


def test_a_folder_the_operator_made_keeps_its_mode_but_the_database_in_it_is_made_private(tmp_path):
    made = tmp_path / "made"
    assert manage(made, "migrate", "-v0").returncode == 0
    srv = tmp_path / "srv"
    srv.mkdir()
    srv.chmod(0o755)
    database = srv / "lethe.sqlite3"
    shutil.copyfile(made / "var" / "lethe.sqlite3", database)
    database.chmod(0o644)
    var = tmp_path / "operator-var"
    var.mkdir()
    var.chmod(0o755)
    shown = manage(tmp_path, "shell", "-v0", "-c", SHOW_OPEN_MODES, LETHE_VAR_DIR=str(var),
                   DATABASE_URL=f"sqlite:///{database}", SECRET_KEY=secrets.token_urlsafe(50))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.split() == ["0o600", "0o600", "0o600"]
    assert mode(database) == 0o600
    assert mode(srv) == 0o755 and mode(var) == 0o755


def test_database_url_escapes_a_socket_folder_and_trusted_origins(monkeypatch, tmp_path):
    """r114: "%ff" in a password became U+FFFD, a "%41" became "A" with no word in the docs, a
    socket folder written %2F... was read as a host name, a "#" got the generic message, and an
    origin without its scheme stopped serve with Django's multi-line check."""
    s = load(monkeypatch, tmp_path, DATABASE_URL="postgres://lethe:ab%2541cd@%2Fvar%2Frun%2Fpostgresql:5433/console",
             CSRF_TRUSTED_ORIGINS=" https://lethe.example.org , http://127.0.0.1:8000")
    db = s.DATABASES["default"]
    assert (db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == ("ab%41cd", "/var/run/postgresql", "5433", "console")
    assert s.CSRF_TRUSTED_ORIGINS == ["https://lethe.example.org", "http://127.0.0.1:8000"]
    assert load(monkeypatch, tmp_path, DATABASE_URL="postgres://lethe@%2Frun%2Fpg/console").DATABASES["default"][
        "HOST"] == "/run/pg"
    message = refused(monkeypatch, tmp_path, DATABASE_URL="postgres://lethe:sec%ffret@db/console")
    assert "not UTF-8 text" in message and "%25" in message and "sec" not in message.replace("secret", "")
    message = refused(monkeypatch, tmp_path, DATABASE_URL="sqlite:///var/my#1.sqlite3")
    assert message.startswith('DATABASE_URL must have no "#"') and "%23" in message
    message = refused(monkeypatch, tmp_path, CSRF_TRUSTED_ORIGINS="https://ok.example, lethe.example.org")
    assert message.startswith("CSRF_TRUSTED_ORIGINS must be origins (a scheme and a host") and "\n" not in message
    for bad in ("https://lethe.example.org/", "https://lethe.example.org/lethe", "https://x.example?a=1",
                "https://x.example:port", "ftp://x.example"):
        assert "must be origins" in refused(monkeypatch, tmp_path, CSRF_TRUSTED_ORIGINS=bad), bad  # r120
    assert load(monkeypatch, tmp_path, CSRF_TRUSTED_ORIGINS="https://[::1]:8443").CSRF_TRUSTED_ORIGINS == [
        "https://[::1]:8443"]


def test_a_secret_key_with_a_control_character_is_refused_in_one_line(monkeypatch, tmp_path):
    """r120: a NUL in the key file stopped serve with a traceback (the key goes into its
    children's environment); refused at start, the key not shown."""
    key = tmp_path / "key"
    key.write_bytes(b"abc\x00def" + b"k" * 50)
    key.chmod(0o600)
    monkeypatch.delenv("SECRET_KEY", raising=False)
    for name in READ:
        monkeypatch.delenv(name, raising=False)
    message = refused(monkeypatch, tmp_path, SECRET_KEY="", SECRET_KEY_FILE=str(key))
    assert "holds a control character" in message and "abc" not in message and "\n" not in message
    assert "holds a control character" in refused(monkeypatch, tmp_path, SECRET_KEY="abc\x01" + "k" * 50)
