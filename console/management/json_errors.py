"""`--json` commands answer a refusal as JSON too.

A script that runs a command with `--json` reads its standard output as one JSON document; a
refusal (an unknown id, a reused key, busy...) came only as text on standard error. With `--json`
it is also one document on standard output, `{"error": {"code", "message"}}`, and the exit
status is the refusal's (1, or 2 where the command says so)."""

from __future__ import annotations

import json
import re

from django.core.management.base import CommandError

_CODE = re.compile(r"[a-z][a-z_]*")


class JsonErrors:
    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            if not options.get("json"):
                raise
            text = str(exc)
            code, sep, message = text.partition(": ")
            if not (sep and _CODE.fullmatch(code)):
                code, message = "refused", text
            self.stdout.write(json.dumps({"error": {"code": code, "message": message}}, sort_keys=True))
            raise SystemExit(exc.returncode) from None
