#!/usr/bin/env python
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    try:
        # Read the settings first: a bad environment value stops here, with its own message
        # (Django would otherwise hold it back, or show another error in its place).
        settings.INSTALLED_APPS  # noqa: B018
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        if "--traceback" in sys.argv:
            raise
        # One line, no traceback: the message names the variable, the value and what is accepted.
        message = " ".join(str(error).split())
        print(f"Lethe configuration error: {message}", file=sys.stderr)
        sys.exit(2)
    except DatabaseError as error:
        # A SQLite database Lethe cannot write (a read-only disk or folder, a file of another
        # user): one line naming the file or folder and what to do, instead of the traceback.
        from console.sqlite.base import cannot_write_explained

        database = settings.DATABASES["default"]
        explained = cannot_write_explained(database, error) if database["ENGINE"] == "console.sqlite" else None
        if explained is None or "--traceback" in sys.argv:
            raise
        print(f"Lethe database error: {explained}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
