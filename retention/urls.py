from __future__ import annotations

from django.urls import path

from retention import views

app_name = "retention"

urlpatterns = [
    path("settings/system/data-storage/", views.data_storage, name="data-storage"),
    path(
        "settings/system/data-storage/tool-payload-cleanup/",
        views.tool_policy_save,
        name="tool-policy-save",
    ),
    path("settings/system/data-storage/status/", views.cleanup_status, name="cleanup-status"),
    path("settings/system/data-storage/tool-payload-cleanup/analyze/", views.cleanup_analyze, name="cleanup-analyze"),
    path("settings/system/data-storage/tool-payload-cleanup/run/", views.cleanup_run, name="cleanup-run"),
    path("settings/system/data-storage/tool-payload-cleanup/cancel/", views.cleanup_cancel, name="cleanup-cancel"),
    path("settings/system/data-storage/tool-payload-cleanup/retry/", views.cleanup_retry, name="cleanup-retry"),
    path(
        "settings/system/data-storage/tool-payload-cleanup/cancel-preparation/",
        views.cleanup_cancel_preparation,
        name="cleanup-cancel-preparation",
    ),
    path("settings/system/data-storage/compact/", views.database_compact, name="database-compact"),
    path("settings/system/data-storage/retained-facts/", views.facts_policy_save, name="facts-policy-save"),
]
