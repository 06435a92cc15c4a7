"""Lethe's lock files: compile them from pyproject.toml, and check they still match it.

    python requirements/locks.py compile --uv PATH [--upgrade]   (what `make lock` runs)
    python requirements/locks.py check                           (what `make lint` runs)

Three locks, each every package pinned to one version with the SHA-256 of every file PyPI
has for it, so `pip install --require-hashes --no-deps -r` installs exactly them:

- runtime.txt: `[project] dependencies` and everything they pull in (what `make run` installs);
- test.txt: the `test` extra's packages that runtime.txt does not already hold, resolved
  against runtime.txt's pins (what `make test` adds);
- tools.txt: tools.in (uv, which compiles the locks; only `make lock` installs it).

Each lock starts with `# source-sha256:`, a digest of the dependency lists (and the compile
flags) it was compiled from. `check` recomputes it, so a lock compiled from an older
pyproject.toml fails `make lint` and the install step, and also checks that every declared
dependency is pinned in the lock at a version its specifier allows and every pin has hashes.

Only the standard library and `packaging` (pip's own copy when `packaging` is not installed)
are used: `check` runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare venv: pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYPROJECT = ROOT / "pyproject.toml"
TOOLS_IN = HERE / "tools.in"
RUNTIME, TEST, TOOLS = HERE / "runtime.txt", HERE / "test.txt", HERE / "tools.txt"

# One lock for every platform and every supported Python, so it does not depend on who runs
# `make lock`. Part of the source digest: changing the flags means compiling again.
FLAGS = ["--universal", "--python-version", "3.12", "--generate-hashes", "--no-config"]
DIGEST_LINE = "# source-sha256: "
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)(?:\s*;(?P<marker>[^\\]*))?")


def _sources() -> dict[Path, dict]:
    """What each lock is compiled from, as plain data (its digest is the lock's source-sha256)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    runtime = {"requires-python": project.get("requires-python", ""),
               "dependencies": sorted(project.get("dependencies", [])), "flags": FLAGS}
    test = {**runtime, "test": sorted(project.get("optional-dependencies", {}).get("test", []))}
    tools = {"tools.in": _requirement_lines(TOOLS_IN.read_text()), "flags": FLAGS}
    return {RUNTIME: runtime, TEST: test, TOOLS: tools}


def _requirement_lines(text: str) -> list[str]:
    return sorted(line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip())


def digest(source: dict) -> str:
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


@dataclass
class Pin:
    version: str
    marker: str = ""
    hashes: list[str] = field(default_factory=list)


def read_lock(path: Path) -> tuple[str | None, dict[str, Pin]]:
    """The lock's recorded source digest and its pins by canonical name."""
    recorded, pins, current = None, {}, None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if line.startswith(DIGEST_LINE):
            recorded = line[len(DIGEST_LINE):].split()[0]
        elif match := PIN.match(line):
            current = pins[canonicalize_name(match["name"])] = Pin(match["version"], (match["marker"] or "").strip())
        elif stripped.startswith("--hash=") and current is not None:
            current.hashes.append(stripped.split("=", 1)[1].rstrip(" \\"))
        elif line and not line[0].isspace() and not line.startswith("#"):
            raise ValueError(f"{path.name}: a line that is not a pinned requirement: {line!r}")
    return recorded, pins


def problems() -> list[str]:
    """Everything that makes the locks disagree with pyproject.toml (empty when they agree)."""
    found: list[str] = []
    sources = _sources()
    locks: dict[Path, dict[str, Pin]] = {}
    for path, source in sources.items():
        if not path.exists():
            found.append(f"{path.relative_to(ROOT)} is missing")
            continue
        try:
            recorded, pins = read_lock(path)
        except ValueError as exc:
            found.append(str(exc))
            continue
        locks[path] = pins
        if recorded != digest(source):
            found.append(f"{path.relative_to(ROOT)} was compiled from other dependency lists than the "
                         f"current {'requirements/tools.in' if path == TOOLS else 'pyproject.toml'}")
        for name, pin in pins.items():
            if not pin.hashes:
                found.append(f"{path.relative_to(ROOT)}: {name}=={pin.version} has no hash")
    runtime, test = locks.get(RUNTIME, {}), locks.get(TEST, {})
    for name in sorted(set(runtime) & set(test)):
        found.append(f"{name} is pinned in both runtime.txt and test.txt")
    declared = [(req, runtime, "runtime.txt") for req in sources[RUNTIME]["dependencies"]]
    declared += [(req, {**runtime, **test}, "runtime.txt or test.txt") for req in sources[TEST]["test"]]
    declared += [(req, locks.get(TOOLS, {}), "tools.txt") for req in sources[TOOLS]["tools.in"]]
    for raw, pins, where in declared:
        requirement = Requirement(raw)
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            found.append(f"{requirement.name} (pyproject.toml: {raw!r}) is not pinned in {where}")
        elif not requirement.specifier.contains(Version(pin.version), prereleases=True):
            found.append(f"{requirement.name}=={pin.version} in {where} does not satisfy {raw!r}")
    return found


def _compile(uv: str, out: Path, args: list[str], *, upgrade: bool, digest_hex: str, note: str) -> None:
    command = [uv, "pip", "compile", *args, *FLAGS, "--quiet", "--custom-compile-command", "make lock",
               "-o", str(out)]
    if upgrade:
        command.append("--upgrade")
    subprocess.run(command, cwd=ROOT, check=True)
    body = out.read_text()
    header = (
        f"# Lethe lock: {note}\n"
        "# Generated by `make lock`; never edit by hand. `make lint` checks the digest below against\n"
        "# the dependency lists it was compiled from (requirements/locks.py).\n"
        f"{DIGEST_LINE}{digest_hex}\n"
    )
    out.write_text(header + "\n".join(line for line in body.splitlines() if not line.startswith(DIGEST_LINE)) + "\n")


def compile_all(uv: str, *, upgrade: bool) -> None:
    sources = _sources()
    _compile(uv, TOOLS, [str(TOOLS_IN.relative_to(ROOT))], upgrade=upgrade, digest_hex=digest(sources[TOOLS]),
             note="the tool that compiles the locks (requirements/tools.in).")
    _compile(uv, RUNTIME, ["pyproject.toml"], upgrade=upgrade, digest_hex=digest(sources[RUNTIME]),
             note="runtime dependencies ([project] dependencies of pyproject.toml).")
    _, runtime = read_lock(RUNTIME)
    skip = [arg for name in sorted(runtime) for arg in ("--no-emit-package", name)]
    _compile(uv, TEST, ["pyproject.toml", "--extra", "test", "-c", str(RUNTIME.relative_to(ROOT)), *skip],
             upgrade=upgrade, digest_hex=digest(sources[TEST]),
             note="test tools (the `test` extra), beside runtime.txt's pins.")


def main(argv: list[str]) -> int:
    if argv[:1] == ["compile"]:
        if "--uv" not in argv:
            print("usage: locks.py compile --uv PATH [--upgrade]", file=sys.stderr)
            return 2
        compile_all(argv[argv.index("--uv") + 1], upgrade="--upgrade" in argv)
    elif argv[:1] != ["check"]:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: locks.py compile --uv PATH [--upgrade] | check", file=sys.stderr)
        return 2
    found = problems()
    for problem in found:
        print(f"lock check: {problem}", file=sys.stderr)
    if found:
        print("The lock files do not match pyproject.toml: run `make lock` and commit requirements/.",
              file=sys.stderr)
        return 1
    if argv[:1] == ["check"]:
        print("lock check: requirements/ matches pyproject.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
