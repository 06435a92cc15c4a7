from __future__ import annotations

from importlib import import_module

from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from console import api, token_views
from console import views as core_views
from console.login import LoginView

# Modules that declare JSON endpoints with `console.api.endpoint`; importing them registers
# the endpoints, and the URL patterns and the OpenAPI document are built from the registry.
API_MODULES = ("console.endpoints", "console.token_api", "lifecycle.api", "retention.api", "insight.api", "remote.api")
for module in API_MODULES:
    import_module(module)

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="lifecycle:conversation-list"), name="home"),
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("favicon.ico", core_views.favicon, name="favicon"),
    path("i18n/setlang/", core_views.set_language, name="set-language"),
    path("i18n/settz/", core_views.set_timezone, name="set-timezone"),
    # The breadcrumb's levels: each holds one page today.
    path("settings/", RedirectView.as_view(pattern_name="retention:data-storage"), name="settings"),
    path("settings/system/", RedirectView.as_view(pattern_name="retention:data-storage"), name="settings-system"),
    path("settings/api-tokens/", token_views.api_tokens, name="api-tokens"),
    path("settings/api-tokens/<int:token_id>/revoke/", token_views.api_token_revoke, name="api-token-revoke"),
    path("", include((api.urlpatterns(), "api"))),
    # Anything else under the API prefixes, and the prefixes without their slash (found here,
    # they are not redirected to the slashed address with an HTML answer): JSON 404.
    re_path(r"^(?:v1|api/v1)(?:/(?P<unmatched>.*))?$", api.not_found),
    path("", include("lifecycle.urls")),
    path("", include("retention.urls")),
    path("", include("remote.urls")),
    path("", include("ops.urls")),
    path("", include("insight.urls")),
]

handler400 = "console.views.bad_request"
handler404 = "console.views.page_not_found"
handler500 = "console.views.server_error"
