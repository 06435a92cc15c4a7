"""Lethe settings, read from the environment.

Every value that differs between a laptop, CI and a multi-host install comes from an
environment variable; nothing else here should need editing.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.signals import connection_created
from django.utils.csp import CSP
from django.utils.translation import gettext_lazy as _

from console import libpq
from ops.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent


# Reading the environment ------------------------------------------------------------------
# Every number, flag, choice and JSON value below goes through `from_env`: a value it does not
# accept stops Lethe with one line naming the variable, the value and what is accepted
# (manage.py prints it as "Lethe configuration error: ..." and exits 2).

def _shown(raw: str, limit: int = 60) -> str:
    """A value as a message quotes it: escaped, cut after `limit` characters."""
    return repr(raw if len(raw) <= limit else raw[:limit] + "…")


def from_env[T](name: str, default: T, accepted: str, parse: Callable[[str], T], *, secret: bool = False) -> T:
    """`parse` of the variable `name` (stripped), or `default` when it is unset or blank.

    `parse` raises ValueError for a value it does not accept; the message is then
    "<name> must be <accepted>, not '<value>'.", the value escaped and cut. With `secret` it
    says what was wrong (the ValueError's text) instead of quoting the value.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return parse(raw.strip())
    except (ValueError, TypeError) as error:
        got = f"{error} (the value is not shown: it holds secrets)" if secret else _shown(raw)
        raise ImproperlyConfigured(f"{name} must be {accepted}, not {got}.") from None


def env_int[D](name: str, default: int | D, low: int, high: int, what: str = "a whole number") -> int | D:
    def parse(raw: str) -> int:
        value = int(raw)
        if not low <= value <= high:
            raise ValueError(raw)
        return value
    return from_env(name, default, f"{what} from {low} to {high}", parse)


def env_float[D](name: str, default: float | D, low: float, high: float, what: str = "a number of seconds") -> float | D:
    def parse(raw: str) -> float:
        value = float(raw)
        if not low <= value <= high:  # NaN is refused here too
            raise ValueError(raw)
        return value

    def shown(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)
    return from_env(name, default, f"{what} from {shown(low)} to {shown(high)}", parse)


def env_choice(name: str, default: str, choices: tuple[str, ...], also: tuple[str, ...] = ()) -> str:
    """One of `choices` (or of `also`: accepted, not advertised) in any case, returned as the
    tuple spells it."""
    known = {choice.lower(): choice for choice in (*choices, *also)}

    def parse(raw: str) -> str:
        if raw.lower() not in known:
            raise ValueError(raw)
        return known[raw.lower()]
    listed = " or ".join(choices) if len(choices) == 2 else f"one of {', '.join(choices[:-1])} or {choices[-1]}"
    return from_env(name, default, listed, parse)


def env_bool[D](name: str, default: bool | D) -> bool | D:
    def parse(raw: str) -> bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(raw)
    return from_env(name, default, "true or false (or 1/0, yes/no, on/off)", parse)


def http_url(raw: str) -> str:
    """An http(s) URL with a host (and a valid port when it names one); ValueError otherwise."""
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(raw)
    if parts.port == 0:  # .port raises ValueError for a port that is not a number or out of range
        raise ValueError(raw)
    return raw


def engine_tokens(raw: str) -> dict[str, str]:
    """ENGINE_TOKENS: {"<engine url>": "<token>"}. The ValueError says what is wrong without
    quoting a token."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError("malformed JSON") from None
    if not isinstance(value, dict):
        kinds = {list: "a JSON list", str: "a JSON string", bool: "a JSON true or false", type(None): "JSON null"}
        raise ValueError(kinds.get(type(value), "a JSON number"))
    tokens = {}
    for url, token in value.items():
        try:
            http_url(url)
        except ValueError:
            raise ValueError(f"an object with the key {_shown(url)} (not an http(s) URL)") from None
        if not isinstance(token, str) or not token.strip():
            raise ValueError(f"an object with an empty or non-text token for {_shown(url)}")
        try:
            tokens[url.rstrip("/")] = engine_token(token.strip())
        except ValueError as error:
            raise ValueError(f"an object whose token for {_shown(url)} has {error}") from None
    return tokens


def engine_token(raw: str) -> str:
    """A token sent as `Authorization: Bearer <token>`: printable ASCII without spaces, the
    only characters a header carries as they are (r114: a "✓" in ENGINE_TOKEN passed every
    check, then each call to the engine was a traceback or a 500)."""
    if not all("!" <= c <= "~" for c in raw):
        raise ValueError("characters a request header cannot carry (printable ASCII only, no spaces)")
    return raw


# Files -----------------------------------------------------------------------------------

def private_var_dir(path: Path) -> Path:
    """The folder for Lethe's data; made owner-only (0700) when Lethe makes it. A folder that
    already exists keeps the mode its operator gave it."""
    if path.is_dir():
        return path
    try:
        path.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        if not path.is_dir():
            raise ImproperlyConfigured(f"LETHE_VAR_DIR names {path}, which is not a folder.") from None
        return path  # made by another process meanwhile
    except OSError as error:
        raise ImproperlyConfigured(f"LETHE_VAR_DIR names {path}, which cannot be created: {error.strerror}.") from None
    path.chmod(0o700)  # whatever the umask
    return path


def project_path(raw: str) -> Path:
    """A folder or file named in the environment. A relative one is taken from the project
    folder (BASE_DIR), as a relative SQLite path in DATABASE_URL is, never from the folder a
    command happens to be started in: `manage.py verify_erasure` run from /tmp must look at
    the same engine folder as the server, not at a folder under /tmp that does not exist."""
    path = Path(raw)
    return path if path.is_absolute() else BASE_DIR / path


def path_value(name: str) -> str | None:
    """The path the variable `name` holds; None when it is unset or blank, as for every other
    variable. A value with a blank at its start or end is refused (r114: LETHE_VAR_DIR="  " made
    and used a folder named two spaces in the project folder; a stray blank around a path, from
    a quoted line of an environment file, would name another folder, and stripping it is a guess)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    if raw != raw.strip():
        raise ImproperlyConfigured(f"{name} must be a path with no blank at its start or end (unset or blank: the "
                                   f"default), not {_shown(raw)}.")
    return raw


def env_path(name: str, default: str | Path) -> Path:
    """project_path of the variable `name`, or of `default` when it is unset or blank."""
    return project_path(path_value(name) or default)


VAR_DIR = private_var_dir(env_path("LETHE_VAR_DIR", "var"))

_PRIVATE_SQLITE: set[str] = set()


def private_sqlite_files(sender, connection, **kwargs) -> None:
    """Conversation content is for the owner only: the first time a process opens a SQLite
    database file, the file and its -wal and -shm lose every group and other permission bit
    (SQLite creates the -wal and -shm later with the database file's mode); the owner's bits
    stay as they are, so a read-only 0444 file becomes 0400, never writable. This is for files that were there already
    (an operator's copy, an older install): a file Lethe creates is created 0600, and only by
    a process's first connection (console/sqlite)."""
    if connection.vendor != "sqlite" or connection.is_in_memory_db():
        return
    name = str(connection.settings_dict["NAME"])
    if name in _PRIVATE_SQLITE:
        return
    for path in (name, f"{name}-wal", f"{name}-shm"):
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & 0o077:
                os.chmod(path, mode & ~0o077)
        except FileNotFoundError:
            pass
        except OSError as error:  # another user's file: say so, and let the database work
            logging.getLogger("console.settings").warning(
                "Could not make the database file %s private (chmod go-rwx): %s", path, error.strerror)
    _PRIVATE_SQLITE.add(name)


connection_created.connect(private_sqlite_files, dispatch_uid="lethe.private_sqlite_files")


def _without_password(url: str) -> str:
    """The URL as an error message may quote it: everything between the user name and the
    last "@" of the address part (a password may hold "/", "@" or ":") becomes ***."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    at = rest.rfind("@")
    if at < 0:
        return url
    user, colon, _password = rest[:at].partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{rest[at + 1:]}"


_DATABASE_URL_FORMS = "sqlite:///path or postgres://user:password@host:port/name (a port from 1 to 65535)"


def database_from_url(url: str) -> dict:
    """Turn `sqlite:///path` or `postgres://user:pass@host:port/name?param=value&...` into a
    Django dict. A PostgreSQL URL's parameters are the libpq ones console/libpq.py lists."""
    shown = _shown(_without_password(url))
    refused = ImproperlyConfigured(f"DATABASE_URL must be {_DATABASE_URL_FORMS}, not {shown}.")
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed [IPv6 address
        raise refused from None
    if parts.fragment or url.endswith("#"):  # nothing after a "#" would be used
        raise ImproperlyConfigured(
            f"DATABASE_URL must have no \"#\" (nothing after it would be used: write a \"#\" in a file name, a "
            f"password or a name as %23), not {shown}.")
    if parts.scheme == "sqlite":
        if parts.netloc:
            # sqlite://var/x.sqlite3 (two slashes) reads "var" as a host, which the path below
            # would drop, putting the database at the project folder's top instead of in var/.
            # Quoted from the URL without its password.
            try:
                host = urlsplit(_without_password(url)).netloc
            except ValueError:
                host = "…"
            raise ImproperlyConfigured(
                f"DATABASE_URL must not name a host in a SQLite URL ({_shown(host)} in {shown}): write "
                "sqlite:///relative/path (three slashes, from the project folder) or sqlite:////absolute/path "
                "(four slashes).")
        if parts.query:
            # Nothing after "?" would be used: SQLite takes no connection parameters.
            raise ImproperlyConfigured(
                f"DATABASE_URL must not have a query in a SQLite URL ({_shown('?' + parts.query)} in {shown}): "
                "SQLite takes no connection parameters (a \"?\" in the file name is written %3F).")
        # sqlite:///relative/path and sqlite:////absolute/path, like the common convention.
        raw = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not raw.strip("/"):
            raise refused
        name = Path(raw) if raw.startswith("/") else BASE_DIR / raw
        if not name.parent.is_dir():
            raise ImproperlyConfigured(
                f"The folder of the DATABASE_URL file does not exist: {_shown(str(name.parent))}. Create it first.")
        return {
            # Django's SQLite backend; a writer waiting for the write lock tries again every
            # half millisecond instead of on the busy handler's schedule (see console/sqlite).
            "ENGINE": "console.sqlite",
            "NAME": name,
            "OPTIONS": {
                # The web server and the job cluster write at once: WAL lets readers run
                # beside a writer, IMMEDIATE takes the write lock at BEGIN so two writers
                # queue on the busy timeout instead of failing on lock upgrade.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": (
                    "PRAGMA journal_mode=WAL;"
                    "PRAGMA synchronous=NORMAL;"
                    "PRAGMA busy_timeout=20000;"
                    # A commit that finds the WAL this many pages long (64 MB) copies it back into
                    # the database file itself (SQLite's default is 1000). Long jobs checkpoint their
                    # own WAL beside their batches and keep it shorter than this, so a request that
                    # commits meanwhile does not do that copying for them (retention/jobs.py).
                    "PRAGMA wal_autocheckpoint=16000;"
                    "PRAGMA foreign_keys=ON;"
                    # Removed text must not linger in free pages.
                    "PRAGMA secure_delete=ON;"
                ),
            },
            # One file per test process, so parallel runs never share a test database (the test
            # suites put it in a folder of the process's own: tests/database_folder.py).
            "TEST": {"NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")},
        }
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        try:
            port = parts.port  # ValueError: not a number, or out of 0-65535
        except ValueError:
            raise refused from None
        if port == 0:
            raise refused
        if "@" in url.partition("://")[2][len(parts.netloc):]:
            # A password holding "/" or "?": its end would be read as the database's name or as
            # parameters, and quoted in their messages.
            raise ImproperlyConfigured(
                f"DATABASE_URL holds an \"@\" past its host ({shown}): write a \"/\", \"?\" or \"@\" in the "
                "password, the name or a parameter as %2F, %3F or %40.")
        try:
            # sslmode, sslrootcert, connect_timeout... to the driver, and to pg_dump (console/libpq)
            options = libpq.parse_query(parts.query, BASE_DIR) if parts.query else {}
        except libpq.BadParameter as error:
            raise ImproperlyConfigured(f"{error}.") from None
        try:
            # (r114: "%ff" in a password became U+FFFD, and a socket folder written %2F... was
            # read as a host name)
            name, user, password = (unquote(part or "", errors="strict")
                                     for part in (parts.path.lstrip("/"), parts.username, parts.password))
            host = parts.hostname or ""
            if host.lower().startswith("%2f"):  # a folder holding the server's socket, as libpq's URIs write it
                written = parts.netloc.rpartition("@")[2]
                host = unquote(written.rpartition(":")[0] if port is not None else written, errors="strict")
        except UnicodeDecodeError:
            raise ImproperlyConfigured(
                f"DATABASE_URL has a %-escape that is not UTF-8 text ({shown}): a \"%\" itself is written "
                "%25.") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name or "lethe",
            "USER": user,
            "PASSWORD": password,
            "HOST": host,
            "PORT": str(port or ""),
            "OPTIONS": options,
            # Kept for a minute; a web server's connection keeps the lock wait it was given when
            # it opened (DB_LOCK_WAIT_SECONDS, console/web_database.py) for its whole life.
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            # One test database per test process, as on SQLite: two runs on one server (or a run
            # started while a killed one is still going away) never meet in "test_lethe".
            "TEST": {"NAME": f"test_{unquote(parts.path.lstrip('/')) or 'lethe'}_{os.getpid()}"[:63]},
        }
    raise refused


DEBUG = env_bool("DEBUG", False)


def _has_control(text: str) -> bool:
    """Whether `text` holds a C0 control character or DEL (a NUL, a line break...)."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def read_secret_key() -> str:
    """SECRET_KEY, else the file at SECRET_KEY_FILE (default $LETHE_VAR_DIR/secret-key, that is
    var/secret-key, which `make setup` creates with 0600 permissions). Without either, only DEBUG=true starts, on a development key.
    """
    if key := os.environ.get("SECRET_KEY", "").strip():
        if _has_control(key):
            raise ImproperlyConfigured("SECRET_KEY holds a control character; the key is one line of printable text.")
        return key
    named = os.environ.get("SECRET_KEY_FILE", "").strip()
    path = project_path(named) if named else VAR_DIR / "secret-key"
    label = f"SECRET_KEY_FILE names {path}, which" if named else f"The secret key file {path}"
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise ImproperlyConfigured(f"{label} cannot be read: {error.strerror}.") from None
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise ImproperlyConfigured(f"{label} is not a file (the key must be in a file only its owner can read).")
        if info.st_mode & 0o077:
            raise ImproperlyConfigured(f"{label} can be read by other users; run `chmod 600 {path}`.")
        try:
            key = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "it is not text"
            raise ImproperlyConfigured(f"{label} cannot be read: {reason}.") from None
        if key and not _has_control(key):
            return key
        if key:  # (r120: a NUL in it stopped serve with a traceback: it goes to serve's children's environment)
            raise ImproperlyConfigured(f"{label} holds a control character (a NUL, a line break...); the key is "
                                       "one line of printable text.")
        raise ImproperlyConfigured(f"{label} is empty.")
    if named:
        raise ImproperlyConfigured(f"SECRET_KEY_FILE names {path}, which does not exist.")
    if DEBUG:
        return "lethe-development-only-key-" + str(BASE_DIR)
    raise ImproperlyConfigured(
        f"SECRET_KEY is not set, and there is no key file at {path}. Set SECRET_KEY, or "
        "SECRET_KEY_FILE to a file only its owner can read, or keep a key in that file (mode 600; "
        "`make setup` makes one in var/, the default LETHE_VAR_DIR). For local development only, "
        "DEBUG=true starts with a built-in key. See docs/operations.md."
    )


SECRET_KEY = read_secret_key()

def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS, unset: 127.0.0.1 and localhost. Set but naming no host (`ALLOWED_HOSTS=`)
    is refused: Django would answer every request 400."""
    raw = os.environ.get("ALLOWED_HOSTS")
    if raw is None:
        return ["127.0.0.1", "localhost"]
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    if not hosts:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS must be the console's host names separated by commas, such as "
            f"lethe.example.org,127.0.0.1 (unset, it is 127.0.0.1,localhost), not {_shown(raw)}.")
    return hosts


ALLOWED_HOSTS = allowed_hosts()
def trusted_origins(raw: str) -> list[str]:
    """CSRF_TRUSTED_ORIGINS: origins with their scheme (r114: one without it stopped serve with
    Django's multi-line system check instead of one line)."""
    origins = [o.strip() for o in raw.split(",") if o.strip()]
    for origin in origins:
        try:
            parts = urlsplit(origin)
            parts.port  # noqa: B018 (a port that is not a number raises)
        except ValueError:
            raise ValueError(origin) from None
        # scheme and host (and port) only: one with a path or a trailing "/" matched no browser's
        # Origin, and every sign-in through the proxy was "form expired" (r120)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment \
                or "#" in origin or "?" in origin:
            raise ValueError(origin)
    return origins


CSRF_TRUSTED_ORIGINS = from_env("CSRF_TRUSTED_ORIGINS", [], "origins (a scheme and a host, no path or "
                                "trailing /) separated by commas, such as https://lethe.example.org", trusted_origins)

# Blank is unset, as for every other variable (r149: blanks were refused as a malformed URL).
# (A value with blanks around it is taken as written: a SQLite file's name may end in one.)
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if not DATABASE_URL.strip():
    DATABASE_URL = f"sqlite:///{VAR_DIR / 'lethe.sqlite3'}"
DATABASES = {"default": database_from_url(DATABASE_URL)}
# PostgreSQL: how long a web request waits for a lock (a table another process holds, as an
# erasure's VACUUM FULL does) before it answers 503 `database_busy`, as SQLite's 20 s wait for
# its write lock. Set on the web server's connections only (console/web_database.py): jobs and
# management commands wait as long as the lock is held. SQLite keeps its own 20 s.
DB_LOCK_WAIT_SECONDS = env_float("DB_LOCK_WAIT_SECONDS", 20, 0.1, 600)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The engine's data directory: event logs, receipts, artifacts and the subagent fleet file.
ENGINE_HOME = env_path("ENGINE_HOME", VAR_DIR / "engine")
# Empty: the engine is embedded in this process. A URL: another Lethe serving the engine API.
ENGINE_URL = from_env("ENGINE_URL", "", "empty (the embedded engine) or an http:// or https:// URL with a host, "
                      "such as https://engine.example:8150", http_url)
# A token made by the engine's `manage.py create_api_token` (an admin of the engine).
ENGINE_TOKEN = from_env("ENGINE_TOKEN", "", "the engine's API token (printable ASCII, no spaces)", engine_token,
                        secret=True)
# Other engines (a computer's own, for its local-only conversations): {"<url>": "<token>"} as JSON.
ENGINE_TOKENS = from_env("ENGINE_TOKENS", {}, 'a JSON object of engine URLs and their tokens, {"https://…": "lethe_…"}',
                         engine_tokens, secret=True)
ENGINE_CONNECT_TIMEOUT = env_float("ENGINE_CONNECT_TIMEOUT", 3, 0.1, 600)
ENGINE_READ_TIMEOUT = env_float("ENGINE_READ_TIMEOUT", 15, 0.1, 3600)
ENGINE_RETRIES = env_int("ENGINE_RETRIES", 2, 0, 10)
# A bound delete while the engine is offline: "pending" (record it, finish when the engine is
# back) or "refuse" (answer Unavailable up front and record nothing).
LIFECYCLE_OFFLINE_DELETE = env_choice("LIFECYCLE_OFFLINE_DELETE", "pending", ("pending", "refuse"))
# Retries of a bound delete while the engine is unreachable: first wait, doubling, capped.
REMOTE_RETRY_SECONDS = env_float("REMOTE_RETRY_SECONDS", 5, 0.1, 86400)
REMOTE_RETRY_MAX_SECONDS = env_float("REMOTE_RETRY_MAX_SECONDS", max(300, REMOTE_RETRY_SECONDS), REMOTE_RETRY_SECONDS,
                                     7 * 86400, what="a number of seconds (not below REMOTE_RETRY_SECONDS)")

# Tunables of the long jobs, for operators and tests; the defaults suit most machines (see
# docs/operations.md). None: the job's own default for the engine in use.
TOOL_JOB_LEASE_SECONDS = env_float("LETHE_TOOL_JOB_LEASE_SECONDS", 30, 1, 86400)
TOOL_JOB_STEP_SECONDS = env_float("LETHE_TOOL_JOB_STEP_SECONDS", 60, 1, 86400)
# How long a job of one piece may run: a backup (pg_dump or SQLite's copy, then its check), a
# Compact database (VACUUM), a cleanup's first step (it reads the whole backup back). The
# cluster's own limit (JOB_TIMEOUT_SECONDS) would end them at 10 minutes, every time: a
# database that takes longer to copy could never be backed up (r21). Their lease's heartbeat
# keeps a second delivery of the same job (after `retry`) from running beside them.
TOOL_JOB_LONG_TIMEOUT_SECONDS = env_int("LETHE_TOOL_JOB_LONG_TIMEOUT_SECONDS", 86400, 60, 7 * 86400,
                                        "a whole number of seconds")
TOOL_CLEANUP_BATCH = env_int("LETHE_TOOL_CLEANUP_BATCH", None, 1, 100_000, "a whole number of items")
TOOL_CLEANUP_BATCH_BYTES = env_int("LETHE_TOOL_CLEANUP_BATCH_BYTES", 64_000_000, 1, 1024**3, "a whole number of bytes")
TOOL_CLEANUP_CONVERSATIONS = env_int("LETHE_TOOL_CLEANUP_CONVERSATIONS", 200, 1, 10_000,
                                     "a whole number of conversations")
TOOL_CLEANUP_BATCH_SECONDS = env_float("LETHE_TOOL_CLEANUP_BATCH_SECONDS", None, 0.001, 60)
TOOL_CLEANUP_PAUSE = env_float("LETHE_TOOL_CLEANUP_PAUSE", None, 0, 60)
# at most 30,000: a batch names its conversations in one statement (SQLite allows 32,766 parameters)
TOOL_ANALYSIS_BATCH = env_int("LETHE_TOOL_ANALYSIS_BATCH", 2000, 1, 30_000, "a whole number of conversations")
ERASURE_HORIZON_WAIT = env_float("LETHE_ERASURE_HORIZON_WAIT", 10, 0, 3600)
# Free disk space the jobs that write copies (a backup, SQLite's Compact database) leave on the
# disk they write to: they do not start, or stop, rather than go below it
DISK_RESERVE_BYTES = env_int("LETHE_DISK_RESERVE_BYTES", 256 * 1024**2, 0, 2**62, "a whole number of bytes")
# The backup folder and the folder of pg_dump are read where they are used (retention/backups.py:
# the environment variable, or a Django setting of that name); their values are checked here, at
# start, as every other path's.
path_value("LETHE_BACKUP_DIR")
path_value("LETHE_PG_BIN_DIR")

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "console",
    "lifecycle",
    "retention",
    "ops",
    # After ops: ops's `qcluster` (the cluster restarted when a process is killed; ops/cluster.py)
    # replaces django-q2's, since the first app listed wins.
    "django_q",
    "insight",
    "remote",
]

MIDDLEWARE = [
    # First: request ids, request metrics and the access log; answers health probes.
    "ops.middleware.OpsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "console.middleware.NoStoreMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "console.auth.BearerTokenMiddleware",
    "console.middleware.RejectNulMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.viewer.ViewerTimezoneMiddleware",
    "console.viewer.SignedOutMiddleware",
    # Last: a view that found the database too busy answers 503 (console/busy.py).
    "console.middleware.DatabaseBusyMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
                "console.context.console",
                "remote.context.remote_engine",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "lifecycle:conversation-list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("es", _("Spanish"))]
# English short dates name the month (see console/formats/en/formats.py).
FORMAT_MODULE_PATH = ["console.formats"]
LOCALE_PATHS = [BASE_DIR / "locale"]
USE_I18N = True
USE_TZ = True
TIME_ZONE = "UTC"

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = env_path("STATIC_ROOT", "staticfiles")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
CSRF_FAILURE_VIEW = "console.views.csrf_failure"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# HTTPS=true: Lethe is served over HTTPS (usually behind a proxy that terminates TLS and
# sets X-Forwarded-Proto). Secure cookies, HSTS and the redirect to https:// all follow.
# Whether a request came over https is the web server's answer (gunicorn believes
# X-Forwarded-Proto only from FORWARDED_ALLOW_IPS, 127.0.0.1 and ::1 by default), not the header's:
# with SECURE_PROXY_SSL_HEADER any client reaching the server directly could claim https and
# skip the redirect (r22).
HTTPS = env_bool("HTTPS", False)
if HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    # The language and time zone cookies too (console/views.py; lethe.js sets the browser's
    # zone with "secure" on https pages)
    LANGUAGE_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    # 0 turns HSTS off; two years is the longest anyone recommends.
    SECURE_HSTS_SECONDS = env_int("HSTS_SECONDS", 365 * 24 * 3600, 0, 2 * 365 * 24 * 3600, "a whole number of seconds")
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # Browser preload lists are a commitment for every subdomain: the operator opts in.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

# Content-Security-Policy: scripts, styles and everything else from this origin only; no
# inline script or style and no eval (htmx is configured for that in base.html).
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "font-src": [CSP.SELF],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

# API tokens expire this many days after they are made (`manage.py api_tokens create --days`).
# At most console.tokens.MAX_DAYS, as for a lifetime chosen on the tokens screen.
API_TOKEN_DAYS = env_int("API_TOKEN_DAYS", 90, 1, 3650, "a whole number of days")

# Failed sign-ins, per username and per client address (and bad API tokens, per address):
# the first LOGIN_FREE_FAILURES failures cost no wait; each failure after them makes the next
# attempt wait LOGIN_DELAY_SECONDS, doubling up to 60 s; at LOCK_AFTER failures the key is locked for LOGIN_LOCK_SECONDS. Failures older
# than LOGIN_FAILURE_WINDOW_SECONDS are forgotten. See docs/operations.md.
LOGIN_THROTTLE = {
    "free_failures": env_int("LOGIN_FREE_FAILURES", 3, 0, 1000),
    "delay_seconds": env_int("LOGIN_DELAY_SECONDS", 1, 0, 60, "a whole number of seconds"),
    "max_delay_seconds": 60,
    "user_lock_after": env_int("LOGIN_USER_LOCK_AFTER", 10, 1, 10_000),
    "address_lock_after": env_int("LOGIN_ADDRESS_LOCK_AFTER", 30, 1, 100_000),
    "lock_seconds": env_int("LOGIN_LOCK_SECONDS", 15 * 60, 1, 7 * 86400, "a whole number of seconds"),
    "window_seconds": env_int("LOGIN_FAILURE_WINDOW_SECONDS", 15 * 60, 1, 7 * 86400, "a whole number of seconds"),
}
# Reverse proxies in front of Lethe that append to X-Forwarded-For; 0 uses the socket address.
TRUSTED_PROXIES = env_int("TRUSTED_PROXIES", 0, 0, 10)

# JSON bodies larger than this are refused with 413 before they are parsed.
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 2 * 1024 * 1024, 1024, 1024**3, "a whole number of bytes")
# Deeper JSON is refused with 400 `too_deep` (tool payloads nest a few levels, never hundreds).
API_MAX_JSON_DEPTH = env_int("API_MAX_JSON_DEPTH", 64, 1, 500)
# An item page stops early once its messages reach this many bytes (at least one item is sent).
API_MAX_PAGE_BYTES = env_int("API_MAX_PAGE_BYTES", 4 * 1024 * 1024, 1024, 1024**3, "a whole number of bytes")

# The job cluster's main process restarts its processes when their guard shows no sign of
# life for this long (ops/cluster.py; the guard ticks every 0.5 s).
Q_STALL_SECONDS = env_float("Q_STALL_SECONDS", 120.0, 5, 3600)

# The longest a job may run unless it says otherwise (TOOL_JOB_LONG_TIMEOUT_SECONDS); a job
# not acknowledged by then plus a minute is delivered again.
JOB_TIMEOUT_SECONDS = env_int("LETHE_JOB_TIMEOUT_SECONDS", 600, 2, 86400, "a whole number of seconds")
Q_CLUSTER = {
    "name": "lethe",
    "workers": env_int("Q_WORKERS", 2, 0, 64),  # 0: one per CPU (django-q's default)
    "timeout": JOB_TIMEOUT_SECONDS,
    "retry": JOB_TIMEOUT_SECONDS + 60,
    "max_attempts": 3,
    "catch_up": False,
    "orm": "default",
    "poll": 1,
    "label": "Jobs",
}

# Where gunicorn's worker processes add up their request figures (serve removes the figures files
# of an earlier run from it at start, and hands it to gunicorn as this absolute path).
METRICS_DIR = env_path("PROMETHEUS_MULTIPROC_DIR", VAR_DIR / "prometheus")
if path_value("PROMETHEUS_MULTIPROC_DIR") is None:
    # Blank is unset here too: prometheus-client reads the variable itself and takes even a blank
    # one for its multiprocess mode, writing its files into the current folder (r114).
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)

# Logs: JSON lines on stderr (LOG_FORMAT=json, the default) or text (LOG_FORMAT=text); never
# content (see ops/logs.py). ACCESS_LOG=false drops the one line per request.
LOG_FORMAT = env_choice("LOG_FORMAT", "json", ("json", "text"))
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
                       also=("NOTSET", "WARN", "FATAL"))
LOGGING = logging_config(LOG_FORMAT, LOG_LEVEL)
ACCESS_LOG = env_bool("ACCESS_LOG", True)

# /metrics is readable by admins, and by `Authorization: Bearer <METRICS_TOKEN>` when set.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "").strip()
# /readyz fails when no job has finished on any job cluster for this long.
# Every cluster runs the heartbeat job each minute, so less than a minute would fail at random.
READYZ_HEARTBEAT_SECONDS = env_int("READYZ_HEARTBEAT_SECONDS", 300, 60, 7 * 86400, "a whole number of seconds")

# The web server's (gunicorn's) figures: checked here, so a bad value stops `serve` with the
# one-line error before gunicorn starts; serve hands gunicorn these values (ops/gunicorn_config.py).
WEB_SERVER = {
    "WEB_CONCURRENCY": env_int("WEB_CONCURRENCY", 2, 1, 64),
    "WEB_THREADS": env_int("WEB_THREADS", 4, 1, 256),
    "WEB_TIMEOUT": env_int("WEB_TIMEOUT", 60, 1, 3600, "a whole number of seconds"),
    "WEB_GRACEFUL_TIMEOUT": env_int("WEB_GRACEFUL_TIMEOUT", 10, 1, 600, "a whole number of seconds"),
    # A connection that has not delivered its request (head and body) within this long is
    # answered 408 and closed (ops/gunicorn_worker.py).
    "WEB_READ_TIMEOUT": env_int("WEB_READ_TIMEOUT", 30, 1, 3600, "a whole number of seconds"),
    # A client that has not taken an answer whole within this long is cut off, so a reader that
    # stops reading does not hold a thread (ops/gunicorn_worker.py).
    "WEB_WRITE_TIMEOUT": env_int("WEB_WRITE_TIMEOUT", 30, 1, 3600, "a whole number of seconds"),
    # The bytes a worker holds at most for the requests it is still reading (an announced body
    # counts in full); past it a request is answered 503 and closed (ops/gunicorn_worker.py).
    "WEB_READ_BUFFER_BYTES": env_int("WEB_READ_BUFFER_BYTES", 64 * 1024 * 1024, 1024 * 1024, 16 * 1024**3,
                                     "a whole number of bytes"),
    "WEB_MAX_REQUESTS": env_int("WEB_MAX_REQUESTS", 5000, 1, 10_000_000),
}
