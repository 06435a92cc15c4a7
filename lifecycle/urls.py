from __future__ import annotations

from django.urls import path

from lifecycle import api, views

app_name = "lifecycle"

urlpatterns = [
    path("conversations/", views.conversation_list, name="conversation-list"),
    path("conversations/<str:public_id>/", views.conversation_detail, name="conversation-detail"),
    path(
        "conversations/<str:public_id>/items/<int:item_id>/output/",
        views.item_output,
        name="item-output",
    ),
    path("v1/threads", api.thread_list, name="api-thread-list"),
    path("v1/threads/<str:public_id>", api.thread_detail, name="api-thread-detail"),
    path("v1/threads/<str:public_id>/items", api.thread_items, name="api-thread-items"),
    path("v1/threads/<str:public_id>/items/<int:item_id>", api.thread_item, name="api-thread-item"),
]
