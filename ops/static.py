"""Static files for the production storage (hashed names from a manifest, which only
`collectstatic` writes): commands that render pages collect them first when they are
missing or older than their sources, so a fresh clone works without a separate step."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command


def _newest_source() -> float:
    newest = 0.0
    for finder in finders.get_finders():
        for path, storage in finder.list([]):
            newest = max(newest, storage.get_modified_time(path).timestamp())
    return newest


def _unusable_root(error: OSError) -> Exception:
    """STATIC_ROOT as every path setting reports one it cannot use: one line (manage.py:
    "Lethe configuration error: ...", exit status 2), not a traceback."""
    root = Path(settings.STATIC_ROOT)
    if error.filename and not Path(error.filename).is_relative_to(root):
        return error  # a source folder (STATICFILES_DIRS), not STATIC_ROOT: as it was
    if root.exists() and not root.is_dir():
        return ImproperlyConfigured(f"STATIC_ROOT names {root}, which is not a folder.")
    where = f"{error.filename}: " if error.filename and str(error.filename) != str(root) else ""
    return ImproperlyConfigured(
        f"STATIC_ROOT names {root}, where the static files cannot be written ({where}{error.strerror}). Make it a "
        "folder the user Lethe runs as can write, or set STATIC_ROOT to one that is.")


def ensure_static_files() -> bool:
    """Run collectstatic when the manifest is missing or stale; True when it ran.
    ImproperlyConfigured when STATIC_ROOT cannot hold them (a file, a read-only disk)."""
    try:
        # The storage reads the manifest as it is made, here
        manifest = getattr(staticfiles_storage, "manifest_name", None)
        if manifest is None:  # a storage that serves the sources directly (tests)
            return False
        store = staticfiles_storage.manifest_storage
        if store.exists(manifest) and store.get_modified_time(manifest).timestamp() >= _newest_source():
            return False
        call_command("collectstatic", interactive=False, verbosity=0)
    except OSError as error:
        raise _unusable_root(error) from None
    return True
