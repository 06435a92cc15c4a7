from __future__ import annotations

from django.urls import path

from lifecycle import action_views, views

app_name = "lifecycle"

urlpatterns = [
    path("conversations/", views.conversation_list, name="conversation-list"),
    path("conversations/<str:public_id>/", views.conversation_detail, name="conversation-detail"),
    path(
        "conversations/<str:public_id>/items/<int:item_id>/output/",
        views.item_output,
        name="item-output",
    ),
    path("conversations/<str:public_id>/archive/", action_views.conversation_archive, name="conversation-archive"),
    path("conversations/<str:public_id>/close/", action_views.conversation_close, name="conversation-close"),
    path("conversations/<str:public_id>/delete/", action_views.conversation_delete, name="conversation-delete"),
    path("operations/", action_views.operation_list, name="operation-list"),
    path("operations/<str:operation_id>/", action_views.operation_detail, name="operation-detail"),
    path("operations/<str:operation_id>/retry/", action_views.operation_retry, name="operation-retry"),
    # The row's id travels in the form (a runtime writes it: any text, a slash or nothing too).
    path("subagents/resolve/", action_views.subagent_resolve, name="subagent-resolve"),
]
