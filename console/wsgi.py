"""The web server's entry (gunicorn's workers, ops/gunicorn_config.py; `runserver` through
WSGI_APPLICATION). What is set here holds for the web server's processes only, never for the
job cluster or a management command."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()

from console.web_database import bound_lock_waits  # noqa: E402 (after Django is set up)

# A request waits at most DB_LOCK_WAIT_SECONDS for a PostgreSQL lock, then answers 503.
bound_lock_waits()
