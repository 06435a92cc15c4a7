"""`manage.py dbshell` with every connection parameter of DATABASE_URL.

Django's own command hands psql only some of the driver's options (sslmode and the certificate
files, passfile, service); the other parameters a PostgreSQL DATABASE_URL may carry
(connect_timeout, application_name, target_session_attrs, options, sslcrl...) would be dropped,
so psql could connect otherwise than Lethe does. Each goes to psql as its libpq environment
variable, as it goes to pg_dump (console/libpq.py)."""

from __future__ import annotations

import os

from django.core.management.commands import dbshell
from django.db import connections

from console import libpq


class Command(dbshell.Command):
    def handle(self, **options):
        connection = connections[options["database"]]
        if connection.vendor == "postgresql":
            # psql is started with this process's environment (plus the password): the URL's
            # parameters win over the same variables set by hand, as they do for the driver.
            os.environ.update(libpq.environment(connection.settings_dict["OPTIONS"]))
        super().handle(**options)
