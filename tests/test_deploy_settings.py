from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests import factories

ROOT = Path(__file__).resolve().parent.parent
HOST = {"HTTP_HOST": "127.0.0.1"}
CLEAR = ("SECRET_KEY", "SECRET_KEY_FILE", "DEBUG", "HTTPS", "DATABASE_URL", "HSTS_PRELOAD")


def manage(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run manage.py with the production settings module and a clean security environment."""
    base = {k: v for k, v in os.environ.items() if k not in CLEAR}
    base.update(DJANGO_SETTINGS_MODULE="console.settings", LETHE_VAR_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=base,
                          capture_output=True, text=True, timeout=120)


def test_it_refuses_to_start_without_a_secret_key_unless_debugging(tmp_path):
    refused = manage(tmp_path, "check")
    assert refused.returncode != 0
    assert "SECRET_KEY is not set" in refused.stderr and "docs/operations.md" in refused.stderr
    # the file it looked for: $LETHE_VAR_DIR/secret-key (it said var/secret-key whatever LETHE_VAR_DIR was)
    assert refused.stderr.startswith(f"Lethe configuration error: SECRET_KEY is not set, and there is no key file at "
                                     f"{tmp_path / 'secret-key'}. ")
    assert manage(tmp_path, "check", DEBUG="true").returncode == 0
    assert manage(tmp_path, "check", SECRET_KEY=secrets.token_urlsafe(50)).returncode == 0


def test_it_reads_the_kept_key_file_only_when_only_its_owner_can_read_it(tmp_path):
    key_file = tmp_path / "secret-key"
    key_file.write_text(secrets.token_urlsafe(50) + "\n")
    key_file.chmod(0o644)
    loose = manage(tmp_path, "check")
    assert loose.returncode != 0 and "chmod 600" in loose.stderr
    key_file.chmod(0o600)
    assert manage(tmp_path, "check").returncode == 0
    elsewhere = manage(tmp_path / "missing", "check", SECRET_KEY_FILE=str(tmp_path / "nope"))
    assert elsewhere.returncode != 0 and "does not exist" in elsewhere.stderr


def test_make_setup_keeps_a_private_key_for_local_runs():
    # `make setup` (part of `make run` and `make test`) created it for this checkout.
    key_file = ROOT / "var" / "secret-key"
    assert key_file.exists() and key_file.stat().st_mode & 0o777 == 0o600
    assert len(key_file.read_text().strip()) >= 50


def test_the_https_switch_makes_the_deploy_check_clean(tmp_path):
    key = secrets.token_urlsafe(50)
    plain = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=key)
    assert plain.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in plain.stderr
    https = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=key, HTTPS="true")
    assert https.returncode == 0, https.stderr
    assert "no issues" in https.stdout
    shown = manage(tmp_path, "shell", "-v0", "-c",
                   "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
                   "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0, s.SECURE_PROXY_SSL_HEADER, "
                   "s.LANGUAGE_COOKIE_SECURE)",
                   SECRET_KEY=key, HTTPS="true")
    # (the scheme is the web server's: tests/test_app_server.py, the forwarded scheme)
    assert shown.stdout.split("\n")[0] == "True True True True None True"


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_without_inline_script(admin_client, conversation):
    factories.add_tool(conversation)
    for url in ("/accounts/login/", "/conversations/", f"/conversations/{conversation.public_id}/",
                "/settings/system/data-storage/"):
        client = admin_client if url != "/accounts/login/" else type(admin_client)()
        response = client.get(url, **HOST)
        assert response.status_code == 200, url
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "style-src 'self'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        html = response.content.decode()
        scripts = re.findall(r"<script\b[^>]*>", html)
        assert scripts and all(" src=" in tag for tag in scripts), url
        assert not re.search(r"\sstyle=|\son[a-z]+=", html), url
        assert '"allowEval": false' in html and '"includeIndicatorStyles": false' in html


@pytest.mark.django_db
def test_signed_in_pages_and_every_api_answer_are_never_stored(admin_client, client, conversation):
    for url in ("/conversations/", f"/conversations/{conversation.public_id}/", "/settings/system/data-storage/",
                "/v1/threads", "/v1/threads/c_nope"):
        response = admin_client.get(url, **HOST)
        assert "no-store" in response["Cache-Control"], url
    for url in ("/v1/threads", "/v1/threads/c_nope"):  # refused API answers too
        response = client.get(url, **HOST)
        assert response.status_code in (401, 403, 404) and "no-store" in response["Cache-Control"], url
    token_client = type(client)(HTTP_AUTHORIZATION="Bearer lethe_unknown")
    assert "no-store" in token_client.get("/v1/threads", **HOST)["Cache-Control"]
