from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from console import views as core_views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="lifecycle:conversation-list"), name="home"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="registration/login.html"),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/setlang/", core_views.set_language, name="set-language"),
    path("i18n/settz/", core_views.set_timezone, name="set-timezone"),
    # The breadcrumb's levels: each holds one page today.
    path("settings/", RedirectView.as_view(pattern_name="retention:data-storage"), name="settings"),
    path("settings/system/", RedirectView.as_view(pattern_name="retention:data-storage"), name="settings-system"),
    path("", include("lifecycle.urls")),
    path("", include("retention.urls")),
]
