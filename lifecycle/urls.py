from __future__ import annotations

from django.urls import path

from lifecycle import views

app_name = "lifecycle"

urlpatterns = [
    path("conversations/", views.conversation_list, name="conversation-list"),
    path("conversations/<str:public_id>/", views.conversation_detail, name="conversation-detail"),
    path(
        "conversations/<str:public_id>/items/<int:item_id>/output/",
        views.item_output,
        name="item-output",
    ),
]
