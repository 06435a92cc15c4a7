from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class LifecycleConfig(AppConfig):
    name = "lifecycle"
    verbose_name = _("Conversation lifecycle")

    def ready(self) -> None:
        from lifecycle import checks  # noqa: F401  (registers the system check)
