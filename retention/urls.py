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
    path("settings/system/data-storage/retained-facts/", views.facts_policy_save, name="facts-policy-save"),
]
