from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from console import token_views
from console import views as core_views
from console.login import LoginView

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="lifecycle:conversation-list"), name="home"),
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/setlang/", core_views.set_language, name="set-language"),
    path("settings/api-tokens/", token_views.api_tokens, name="api-tokens"),
    path("settings/api-tokens/<int:token_id>/revoke/", token_views.api_token_revoke, name="api-token-revoke"),
    path("", include("lifecycle.urls")),
    path("", include("retention.urls")),
]
