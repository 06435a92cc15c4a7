"""Test settings: the same as production, with a fast hasher and a private engine folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Tests run without DEBUG, as production does; they need a key of their own.
os.environ.setdefault("SECRET_KEY", "lethe-tests-only-" + "k" * 50)

from console.settings import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# A configured ENGINE_HOME as settings resolved it (a relative one from the project folder).
ENGINE_HOME = ENGINE_HOME if os.environ.get("ENGINE_HOME", "").strip() else Path(tempfile.mkdtemp(prefix="lethe-engine-"))  # noqa: F405
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_AUTOREFRESH = True
Q_CLUSTER = {**Q_CLUSTER, "sync": False}  # noqa: F405
# Every API answer is checked against its declared schema; a mismatch fails the test.
API_VALIDATE_RESPONSES = True
