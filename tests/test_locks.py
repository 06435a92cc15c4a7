"""The lock files: they match pyproject.toml, this environment was installed from them, and
the check fails on every way they can drift."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import Marker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "requirements"))
import locks  # noqa: E402


def test_it_finds_the_committed_locks_in_step_with_pyproject():
    assert locks.problems() == []


def test_it_runs_on_locked_versions_only():
    # What `make setup` installed is exactly what the locks pin (for this platform).
    for path in (locks.RUNTIME, locks.TEST):
        _, pins = locks.read_lock(path)
        assert pins
        for name, pin in pins.items():
            if pin.marker and not Marker(pin.marker).evaluate():
                continue
            assert importlib.metadata.version(name) == pin.version, f"{name} is not the locked version"
            assert all(h.startswith("sha256:") and len(h) == 71 for h in pin.hashes)


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of pyproject.toml and requirements/ to break."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    return tmp_path


def check(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(project / "requirements" / "locks.py"), "check"],
                          capture_output=True, text=True)


def test_it_accepts_an_untouched_copy(project):
    result = check(project)
    assert result.returncode == 0, result.stderr


def test_it_refuses_a_dependency_added_without_a_new_lock(project):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('dependencies = [\n', 'dependencies = [\n    "left-pad>=1",\n', 1))
    result = check(project)
    assert result.returncode == 1
    assert "runtime.txt was compiled from other dependency lists" in result.stderr
    assert "left-pad (pyproject.toml: 'left-pad>=1') is not pinned in runtime.txt" in result.stderr
    assert "run `make lock`" in result.stderr


def test_it_refuses_a_test_tool_added_without_a_new_lock(project):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('test = [\n', 'test = [\n    "axe-playwright-python>=0.1",\n', 1))
    result = check(project)
    assert result.returncode == 1
    assert "test.txt was compiled from other dependency lists" in result.stderr
    assert "runtime.txt was compiled" not in result.stderr


def test_it_refuses_a_pin_outside_the_declared_range_and_a_pin_without_hashes(project):
    runtime = project / "requirements" / "runtime.txt"
    text = runtime.read_text()
    _, pins = locks.read_lock(locks.RUNTIME)
    django = pins["django"].version
    text = text.replace(f"django=={django} ", "django==5.2.0 ", 1)
    # Drop every hash of whitenoise.
    lines, skipping = [], False
    for line in text.splitlines():
        if line.startswith("whitenoise=="):
            lines.append(line.split(" \\")[0])
            skipping = True
            continue
        if skipping and line.strip().startswith("--hash="):
            continue
        skipping = False
        lines.append(line)
    runtime.write_text("\n".join(lines) + "\n")
    result = check(project)
    assert result.returncode == 1
    assert "django==5.2.0 in runtime.txt does not satisfy 'django>=6.1,<6.2'" in result.stderr
    assert "whitenoise==" in result.stderr and "has no hash" in result.stderr


def test_it_refuses_a_package_pinned_in_both_locks_and_a_missing_lock(project):
    test_lock = project / "requirements" / "test.txt"
    runtime_text = (project / "requirements" / "runtime.txt").read_text()
    block = runtime_text[runtime_text.index("sqlparse=="):]
    block = block[: block.index("\n", block.index("# via"))]
    test_lock.write_text(test_lock.read_text() + block + "\n")
    (project / "requirements" / "tools.txt").unlink()
    result = check(project)
    assert result.returncode == 1
    assert "sqlparse is pinned in both runtime.txt and test.txt" in result.stderr
    assert "requirements/tools.txt is missing" in result.stderr


def test_it_installs_the_runtime_lock_alone_for_make_run():
    planned = subprocess.run(["make", "-n", "-B", "run"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    assert "--require-hashes --no-deps -r requirements/runtime.txt" in planned
    assert "requirements/test.txt" not in planned
    planned = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    assert "--require-hashes --no-deps -r requirements/test.txt" in planned
