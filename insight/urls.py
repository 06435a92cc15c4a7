from __future__ import annotations

from django.urls import path

from insight import views

app_name = "insight"

urlpatterns = [
    path("settings/system/data-storage/storage-insight/measure/", views.storage_measure, name="storage-measure"),
]
