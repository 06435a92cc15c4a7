from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RetentionConfig(AppConfig):
    name = "retention"
    verbose_name = _("Tool payload retention")
