"""Static files for the production storage (hashed names from a manifest, which only
`collectstatic` writes): commands that render pages collect them first when they are
missing or older than their sources, so a fresh clone works without a separate step."""

from __future__ import annotations

from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command


def _newest_source() -> float:
    newest = 0.0
    for finder in finders.get_finders():
        for path, storage in finder.list([]):
            newest = max(newest, storage.get_modified_time(path).timestamp())
    return newest


def ensure_static_files() -> bool:
    """Run collectstatic when the manifest is missing or stale; True when it ran."""
    manifest = getattr(staticfiles_storage, "manifest_name", None)
    if manifest is None:  # a storage that serves the sources directly (tests)
        return False
    store = staticfiles_storage.manifest_storage
    if store.exists(manifest) and store.get_modified_time(manifest).timestamp() >= _newest_source():
        return False
    call_command("collectstatic", interactive=False, verbosity=0)
    return True
