"""The connection parameters a PostgreSQL DATABASE_URL may carry after its `?`.

`postgres://user:password@host:port/name?sslmode=verify-full&sslrootcert=/etc/lethe/ca.pem`:
each accepted parameter goes to the driver (settings DATABASES OPTIONS) and, as its libpq
environment variable, to the client tools Lethe runs (the backup's pg_dump), so both connect
alike. A parameter not listed here, one given twice or a value libpq would not take stops
Lethe at start (settings.py raises ImproperlyConfigured): a dropped `sslmode=require` would
connect in plain text without a word.

Only parameters with a libpq environment variable are listed: a value that could reach
pg_dump only on its command line would be visible to every user of the computer (`ps`), and
the password never goes there. `sslpassword` (a passphrase for the client key) has no such
variable: use a key file without a passphrase, readable only by the user Lethe runs as.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
TLS_VERSIONS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")
ENCRYPTION_MODES = ("disable", "prefer", "require")


class BadParameter(ValueError):
    """A query of DATABASE_URL libpq would not take; its text says why, in one sentence."""


def _shown(raw: str, limit: int = 60) -> str:
    """A value as a message quotes it: escaped, cut after `limit` characters (as settings.py)."""
    return repr(raw if len(raw) <= limit else raw[:limit] + "…")


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values[:-1]) + " or " + values[-1]


def _choice(values: tuple[str, ...]) -> tuple[str, Callable[[str, Path], str]]:
    def parse(raw: str, base: Path) -> str:
        if raw not in values:
            raise ValueError(raw)
        return raw
    return f"one of {_listed(values)}", parse


def _path(raw: str, base: Path) -> str:
    """A file or folder; a relative one from the project folder, as every path setting."""
    path = Path(raw)
    return str(path if path.is_absolute() else base / path)


def _root_certificate(raw: str, base: Path) -> str:
    return raw if raw == "system" else _path(raw, base)  # "system": the system's CAs (libpq 16+)


def _seconds(raw: str, base: Path) -> int:
    if not raw.isascii() or not raw.isdigit() or int(raw) > 3600:
        raise ValueError(raw)
    return int(raw)


def _application_name(raw: str, base: Path) -> str:
    if len(raw) > 63 or not all(" " <= c <= "~" for c in raw):
        raise ValueError(raw)
    return raw


def _text(raw: str, base: Path) -> str:
    return raw


# name: (libpq environment variable, what is accepted, parse(value, project folder))
PARAMETERS: dict[str, tuple[str, str, Callable[[str, Path], object]]] = {
    "sslmode": ("PGSSLMODE", *_choice(SSL_MODES)),
    "sslrootcert": ("PGSSLROOTCERT", "a file (or system)", _root_certificate),
    "sslcert": ("PGSSLCERT", "a file", _path),
    "sslkey": ("PGSSLKEY", "a file", _path),
    "sslcrl": ("PGSSLCRL", "a file", _path),
    "sslcrldir": ("PGSSLCRLDIR", "a folder", _path),
    "sslsni": ("PGSSLSNI", *_choice(("0", "1"))),
    "ssl_min_protocol_version": ("PGSSLMINPROTOCOLVERSION", *_choice(TLS_VERSIONS)),
    "ssl_max_protocol_version": ("PGSSLMAXPROTOCOLVERSION", *_choice(TLS_VERSIONS)),
    "channel_binding": ("PGCHANNELBINDING", *_choice(ENCRYPTION_MODES)),
    "gssencmode": ("PGGSSENCMODE", *_choice(ENCRYPTION_MODES)),
    "passfile": ("PGPASSFILE", "a file", _path),
    "connect_timeout": ("PGCONNECT_TIMEOUT", "a whole number of seconds from 0 (no limit) to 3600", _seconds),
    "application_name": ("PGAPPNAME", "up to 63 printable ASCII characters", _application_name),
    "target_session_attrs": ("PGTARGETSESSIONATTRS", *_choice(SESSION_ATTRS)),
    "options": ("PGOPTIONS", "the server options to set, such as -c search_path=lethe", _text),
}


def parse_query(query: str, base: Path) -> dict[str, object]:
    """The parameters of a URL's query (`a=1&b=2`, each name and value percent-decoded; "+" is
    a plus sign, as libpq reads it), ready for the driver. BadParameter says what is wrong."""
    found: dict[str, object] = {}
    for field in query.split("&"):
        raw_name, equals, raw_value = field.partition("=")
        try:  # percent-escapes must spell UTF-8: libpq would get other bytes than the ones written
            name, value = unquote(raw_name, errors="strict"), unquote(raw_value, errors="strict")
        except UnicodeDecodeError:
            raise BadParameter(f"DATABASE_URL's query holds percent-escapes that are not UTF-8 text: "
                               f"{_shown(field)}") from None
        if not equals or not name:
            raise BadParameter(f"DATABASE_URL's query must be name=value pairs joined by &, not {_shown(field)}")
        if name not in PARAMETERS:
            raise BadParameter(f"DATABASE_URL names a connection parameter Lethe does not use ({_shown(name)}); it takes "
                               f"{_listed(tuple(PARAMETERS))}")
        if name in found:
            raise BadParameter(f"DATABASE_URL gives {name} twice; give each parameter once")
        _variable, accepted, parse = PARAMETERS[name]
        try:
            if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise ValueError(value)
            found[name] = parse(value, base)
        except ValueError:
            raise BadParameter(f"DATABASE_URL's {name} must be {accepted}, not {_shown(value)}") from None
    return found


def environment(options: dict) -> dict[str, str]:
    """The libpq environment variables of the parameters in a database's OPTIONS, for a client
    tool (pg_dump) to connect as the driver does."""
    return {variable: str(options[name]) for name, (variable, _, _) in PARAMETERS.items() if name in options}
