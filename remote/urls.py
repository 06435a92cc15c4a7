from __future__ import annotations

from django.urls import path

from remote import views

app_name = "remote"

urlpatterns = [
    path("engine/conversations/", views.binding_list, name="binding-list"),
    path("engine/conversations/sync/", views.bindings_sync, name="bindings-sync"),
    path("engine/conversations/<str:binding_id>/delete/", views.binding_delete, name="binding-delete"),
    path("engine/deletes/<str:delete_id>/", views.bound_delete_detail, name="bound-delete"),
]
