"""The sign-in form and view, throttled (see console/throttle.py)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from console import throttle


class ThrottledAuthenticationForm(AuthenticationForm):
    throttled_for = ""  # "5 minutes" while the username or the address must wait

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        password = self.cleaned_data.get("password") or ""
        if not username or not password:
            # A field is missing (its error is shown): no password is checked, so nothing is
            # counted, and nothing is cleared either (an empty password is not a sign-in).
            return super().clean()
        address = throttle.client_address(self.request)
        keys = throttle.login_keys(username, address)
        wait, attempt = throttle.begin_attempt(keys, address=address, username=username)
        if wait:
            self.throttled_for = throttle.describe_wait(wait)
            raise ValidationError("throttled", code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError as error:
            if error.code == "invalid_login":
                throttle.failed(attempt)
            else:
                throttle.taken_back(attempt)
            raise
        except BaseException:
            throttle.taken_back(attempt)
            raise
        throttle.succeeded(attempt)  # with both fields given, no error means a user was authenticated
        return cleaned


class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    form_class = ThrottledAuthenticationForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.throttled_for:
            response.status_code = 429
        return response
