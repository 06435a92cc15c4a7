from __future__ import annotations

from django.urls import path

from ops import health, views

app_name = "ops"

# OpsMiddleware answers the probes (and /metrics for the metrics token) before URL routing;
# the patterns are here for reverse() and for any stack without it.
urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
]
