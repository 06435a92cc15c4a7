"""Every command the README gives works as written: the make targets and manage.py commands
(with their options) exist, and a fresh database goes through the documented commands with
the production settings, static files not yet collected."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_it_names_only_make_targets_that_exist():
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    named = set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", README, re.MULTILINE))
    assert {"run", "test", "setup", "lock", "bench-seed", "messages", "lint"} <= named
    assert named <= targets, f"README names make targets that do not exist: {named - targets}"


def test_it_names_only_commands_and_options_that_exist():
    commands = get_commands()
    used = re.findall(r"manage\.py ([a-z_]+)([^`\n]*)", README)
    assert {name for name, _rest in used} >= {"seed_demo", "create_api_token", "retention_table", "bench_pages",
                                               "serve", "migrate"}
    for name, rest in used:
        assert name in commands, f"README names manage.py {name}, which does not exist"
        parser = load_command_class(commands[name], name).create_parser("manage.py", name)
        options = set(parser._option_string_actions)
        for action in parser._actions:  # a command with subcommands: their options count too
            choices = getattr(action, "choices", None)
            for sub in choices.values() if isinstance(choices, dict) else ():
                options |= set(getattr(sub, "_option_string_actions", {}))
        for option in re.findall(r"--[a-z][\w-]*", rest):
            assert option in options, f"manage.py {name} has no {option}"


def test_it_takes_a_fresh_database_through_the_readme_commands(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(LETHE_VAR_DIR=str(tmp_path / "var"), ENGINE_HOME=str(tmp_path / "engine"),
               STATIC_ROOT=str(tmp_path / "static"), SECRET_KEY="readme-test-" + "s" * 40,
               LETHE_DEMO_PASSWORD="readme-pass-1", LOG_LEVEL="WARNING")

    def manage(*args: str) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}"
        return result.stdout

    manage("migrate", "-v0")
    manage("seed_demo", "--conversations", "3", "--messages", "6", "--seed", "1")
    token = manage("create_api_token", "admin").strip().splitlines()[-1]
    assert len(token) > 20
    assert not (tmp_path / "static").exists()
    out = manage("bench_pages", "--requests", "2")
    assert "Collected the static files first" in out and "/conversations/" in out
    assert (tmp_path / "static" / "staticfiles.json").exists()
    assert "Collected" not in manage("bench_pages", "--requests", "1")  # still fresh: not collected again
    manage("retention_table", "--check")
