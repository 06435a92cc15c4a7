"""Database functions the ORM lacks, on both engines."""

from __future__ import annotations

from django.db.models import BigIntegerField, Func


class OctetLength(Func):
    """The stored size of a text expression in bytes (UTF-8), not characters."""

    function = "OCTET_LENGTH"
    output_field = BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)
