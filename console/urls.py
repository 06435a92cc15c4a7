from __future__ import annotations

from importlib import import_module

from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from console import api
from console import views as core_views

# Modules that declare JSON endpoints with `console.api.endpoint`; importing them registers
# the endpoints, and the URL patterns and the OpenAPI document are built from the registry.
API_MODULES = ("console.endpoints", "lifecycle.api")
for module in API_MODULES:
    import_module(module)

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="lifecycle:conversation-list"), name="home"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="registration/login.html"),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/setlang/", core_views.set_language, name="set-language"),
    path("", include((api.urlpatterns(), "api"))),
    re_path(r"^(?:v1|api/v1)/(?P<unmatched>.*)$", api.not_found),
    path("", include("lifecycle.urls")),
    path("", include("retention.urls")),
]

handler400 = "console.views.bad_request"
handler404 = "console.views.page_not_found"
handler500 = "console.views.server_error"
