from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        from ops.orphans import arm_from_environment

        arm_from_environment()  # a child of serve: stop within a deadline once serve is gone
