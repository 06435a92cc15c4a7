"""Signing in through the real login form, as an admin and as a member."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import log_in

pytestmark = pytest.mark.django_db(transaction=True)


@ALL_VIEWPORTS
@pytest.mark.parametrize("who", ["admin", "member"])
def test_it_signs_in_and_lands_on_the_conversation_list(seeded, live_server, open_page, viewport, who):
    page = open_page(viewport)
    username, password = ADMIN if who == "admin" else MEMBER

    log_in(page, live_server.url, username, password)

    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    expect(page.locator(".conv")).to_have_count(20)  # the 20 recent seeded conversations
    role = "Admin" if who == "admin" else "Member"
    who_line = page.locator(".who")
    if viewport == "desktop":
        expect(who_line).to_have_text(f"{username} · {role}")
    else:
        expect(who_line).to_be_hidden()  # phones keep the top bar to the brand and Sign out


def test_it_refuses_a_wrong_password(seeded, live_server, open_page):
    page = open_page("desktop")
    page.goto(f"{live_server.url}/conversations/")
    expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/conversations/")

    page.get_by_label("Username").fill(ADMIN[0])
    page.get_by_label("Password").fill("not-the-password")
    page.get_by_role("button", name="Sign in").click()

    expect(page.get_by_role("alert")).to_have_text("That username and password do not match. Try again.")
    expect(page.get_by_role("heading", name="Sign in to Lethe")).to_be_visible()
    # The username stays; the password is what to type again: focused, marked and described by the alert.
    expect(page.get_by_label("Username")).to_have_value(ADMIN[0])
    password = page.get_by_label("Password")
    expect(password).to_be_focused()
    expect(password).to_have_attribute("aria-invalid", "true")
    expect(password).to_have_accessible_description("That username and password do not match. Try again.")


_REFUSED = {"en": "That username and password do not match. Try again.",
            "es": "El nombre de usuario y la contraseña no coinciden. Vuelva a intentarlo."}


@pytest.mark.parametrize("lang", ["en", "es"])
@pytest.mark.parametrize("size", [(320, 300), (320, 640)], ids=["320x300", "320x640"])
def test_a_refused_sign_in_shows_its_reason_with_the_password_focused(seeded, live_server, open_page, size, lang):
    """320x300 is a phone with the on-screen keyboard open: the reason shows below the sticky
    top bar, on screen, with the password field it describes (where the focus is)."""
    page = open_page({"width": size[0], "height": size[1]})
    page.context.add_cookies([{"name": "django_language", "value": lang, "url": live_server.url}])
    page.goto(f"{live_server.url}/accounts/login/")
    page.locator("#id_username").fill(ADMIN[0])
    page.locator("#id_password").fill("not-the-password")
    page.locator("#id_password").press("Enter")

    reason = page.get_by_role("alert")
    expect(reason).to_have_text(_REFUSED[lang])
    password = page.locator("#id_password")
    expect(password).to_be_focused()
    expect(password).to_have_attribute("aria-invalid", "true")
    expect(password).to_have_accessible_description(_REFUSED[lang])
    expect(page.locator("#id_username")).to_have_value(ADMIN[0])
    page.wait_for_timeout(300)  # any scrolling done
    seen = page.evaluate("""() => {
      const box = (el) => { const r = el.getBoundingClientRect(); return [Math.round(r.top), Math.round(r.bottom)]; };
      return { top: box(document.querySelector(".topbar"))[1], screen: window.innerHeight,
               reason: box(document.getElementById("login-error")), password: box(document.getElementById("id_password")) };
    }""")
    for top, bottom in (seen["reason"], seen["password"]):
        assert seen["top"] <= top and bottom <= seen["screen"], seen
