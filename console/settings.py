"""Lethe settings, read from the environment.

Every value that differs between a laptop, CI and a multi-host install comes from an
environment variable; nothing else here should need editing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP
from django.utils.translation import gettext_lazy as _

from ops.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("LETHE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def database_from_url(url: str) -> dict:
    """Turn `sqlite:///path` or `postgres://user:pass@host:port/name` into a Django dict."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # sqlite:///relative/path and sqlite:////absolute/path, like the common convention.
        raw = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        name = Path(raw) if raw.startswith("/") else BASE_DIR / raw
        return {
            "ENGINE": "django.db.backends.sqlite3",
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
                    "PRAGMA foreign_keys=ON;"
                    # Removed text must not linger in free pages.
                    "PRAGMA secure_delete=ON;"
                ),
            },
            # One file per test process, so parallel runs never share a test database.
            "TEST": {"NAME": str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")},
        }
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")) or "lethe",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(f"Unsupported DATABASE_URL scheme: {parts.scheme!r}")


DEBUG = env_bool("DEBUG", False)


def read_secret_key() -> str:
    """SECRET_KEY, else the file at SECRET_KEY_FILE (default var/secret-key, which `make setup`
    creates with 0600 permissions). Without either, only DEBUG=true starts, on a development key.
    """
    if key := os.environ.get("SECRET_KEY", "").strip():
        return key
    named = os.environ.get("SECRET_KEY_FILE", "").strip()
    path = Path(named) if named else VAR_DIR / "secret-key"
    if path.exists():
        if path.stat().st_mode & 0o077:
            raise ImproperlyConfigured(
                f"The secret key file {path} can be read by other users; run `chmod 600 {path}`.")
        if key := path.read_text().strip():
            return key
        raise ImproperlyConfigured(f"The secret key file {path} is empty.")
    if named:
        raise ImproperlyConfigured(f"SECRET_KEY_FILE names {path}, which does not exist.")
    if DEBUG:
        return "lethe-development-only-key-" + str(BASE_DIR)
    raise ImproperlyConfigured(
        "SECRET_KEY is not set. Set SECRET_KEY, or SECRET_KEY_FILE to a file only its owner can "
        "read, or run `make setup` once (it keeps a generated key in var/secret-key). For local "
        "development only, DEBUG=true starts with a built-in key. See docs/operations.md."
    )


SECRET_KEY = read_secret_key()

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'lethe.sqlite3'}"
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The engine's data directory: event logs, receipts, artifacts and the subagent fleet file.
ENGINE_HOME = Path(os.environ.get("ENGINE_HOME", VAR_DIR / "engine"))
# Empty: the engine is embedded in this process. A URL: another Lethe serving the engine API.
ENGINE_URL = os.environ.get("ENGINE_URL", "").strip()
# A token made by the engine's `manage.py create_api_token` (an admin of the engine).
ENGINE_TOKEN = os.environ.get("ENGINE_TOKEN", "").strip()
# Other engines (a computer's own, for its local-only conversations): {"<url>": "<token>"} as JSON.
ENGINE_TOKENS = {url.rstrip("/"): token for url, token in json.loads(os.environ.get("ENGINE_TOKENS") or "{}").items()}
ENGINE_CONNECT_TIMEOUT = float(os.environ.get("ENGINE_CONNECT_TIMEOUT", 3))
ENGINE_READ_TIMEOUT = float(os.environ.get("ENGINE_READ_TIMEOUT", 15))
ENGINE_RETRIES = int(os.environ.get("ENGINE_RETRIES", 2))
# A bound delete while the engine is offline: "pending" (record it, finish when the engine is
# back) or "refuse" (answer Unavailable up front and record nothing).
LIFECYCLE_OFFLINE_DELETE = os.environ.get("LIFECYCLE_OFFLINE_DELETE", "pending").strip().lower()
if LIFECYCLE_OFFLINE_DELETE not in ("pending", "refuse"):
    raise ImproperlyConfigured("LIFECYCLE_OFFLINE_DELETE must be pending or refuse.")
# Retries of a bound delete while the engine is unreachable: first wait, doubling, capped.
REMOTE_RETRY_SECONDS = float(os.environ.get("REMOTE_RETRY_SECONDS", 5))
REMOTE_RETRY_MAX_SECONDS = float(os.environ.get("REMOTE_RETRY_MAX_SECONDS", 300))

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "django_q",
    "console",
    "lifecycle",
    "retention",
    "ops",
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
    "console.viewer.HtmxSignedOutMiddleware",
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
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or BASE_DIR / "staticfiles")
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
HTTPS = env_bool("HTTPS", False)
if HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = int(os.environ.get("HSTS_SECONDS", 365 * 24 * 3600))
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
API_TOKEN_DAYS = int(os.environ.get("API_TOKEN_DAYS", 90))

# Failed sign-ins, per username and per client address (and bad API tokens, per address):
# after LOGIN_FREE_FAILURES failures each further attempt waits LOGIN_DELAY_SECONDS, doubling
# up to 60 s; at LOCK_AFTER failures the key is locked for LOGIN_LOCK_SECONDS. Failures older
# than LOGIN_FAILURE_WINDOW_SECONDS are forgotten. See docs/operations.md.
LOGIN_THROTTLE = {
    "free_failures": int(os.environ.get("LOGIN_FREE_FAILURES", 3)),
    "delay_seconds": int(os.environ.get("LOGIN_DELAY_SECONDS", 1)),
    "max_delay_seconds": 60,
    "user_lock_after": int(os.environ.get("LOGIN_USER_LOCK_AFTER", 10)),
    "address_lock_after": int(os.environ.get("LOGIN_ADDRESS_LOCK_AFTER", 30)),
    "lock_seconds": int(os.environ.get("LOGIN_LOCK_SECONDS", 15 * 60)),
    "window_seconds": int(os.environ.get("LOGIN_FAILURE_WINDOW_SECONDS", 15 * 60)),
}
# Reverse proxies in front of Lethe that append to X-Forwarded-For; 0 uses the socket address.
TRUSTED_PROXIES = int(os.environ.get("TRUSTED_PROXIES", 0))

# JSON bodies larger than this are refused with 413 before they are parsed.
API_MAX_BODY_BYTES = int(os.environ.get("API_MAX_BODY_BYTES", 2 * 1024 * 1024))
# Deeper JSON is refused with 400 `too_deep` (tool payloads nest a few levels, never hundreds).
API_MAX_JSON_DEPTH = int(os.environ.get("API_MAX_JSON_DEPTH", 64))
# An item page stops early once its messages reach this many bytes (at least one item is sent).
API_MAX_PAGE_BYTES = int(os.environ.get("API_MAX_PAGE_BYTES", 4 * 1024 * 1024))

Q_CLUSTER = {
    "name": "lethe",
    "workers": int(os.environ.get("Q_WORKERS", 2)),
    "timeout": 600,
    "retry": 660,
    "max_attempts": 3,
    "catch_up": False,
    "orm": "default",
    "poll": 1,
    "label": "Jobs",
}

# Logs: JSON lines on stderr (LOG_FORMAT=json, the default) or text (LOG_FORMAT=text); never
# content (see ops/logs.py). ACCESS_LOG=false drops the one line per request.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "json").strip().lower()
if LOG_FORMAT not in ("json", "text"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be json or text, not {LOG_FORMAT!r}.")
LOGGING = logging_config(LOG_FORMAT, os.environ.get("LOG_LEVEL", "INFO").upper())
ACCESS_LOG = env_bool("ACCESS_LOG", True)

# /metrics is readable by admins, and by `Authorization: Bearer <METRICS_TOKEN>` when set.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "").strip()
# /readyz fails when no job has finished on any job cluster for this long.
READYZ_HEARTBEAT_SECONDS = int(os.environ.get("READYZ_HEARTBEAT_SECONDS", 300))
