"""Reproducible builds: hash-locked requirements split into runtime and development, and the image's files.

No container engine runs here: the Dockerfile and its ignore file are checked as text, and the build context
is computed from the ignore file the way BuildKit applies it (for the patterns this project uses).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    """Return {normalised name: version} of every `name==version` line of a requirements file."""
    pins = {}
    for line in path.read_text().splitlines():
        match = NAME.match(line.strip())
        if match:
            pins[_normalise(match.group(1))] = match.group(2)
    return pins


def _lock_entries(path: Path) -> list[str]:
    """Return the lock's requirement blocks (a pin with its hash lines)."""
    text = path.read_text()
    return [block for block in re.split(r"\n(?=[A-Za-z0-9])", text) if NAME.match(block)]


def test_every_locked_requirement_is_pinned_with_hashes() -> None:
    """Both locks pin every package (==) with at least one sha256 hash, and name no local index."""
    for name in ("requirements.txt", "requirements-dev.txt"):
        entries = _lock_entries(ROOT / name)
        assert len(entries) > 50, name
        for entry in entries:
            assert "--hash=sha256:" in entry, entry.splitlines()[0]
        text = (ROOT / name).read_text()
        assert "--extra-index-url" not in text and "--find-links" not in text and "file://" not in text


def test_locks_hold_every_direct_requirement_at_its_pin() -> None:
    """What requirements.in / requirements-dev.in pin is what the locks hold (`make lock` was run)."""
    runtime_in, dev_in = _pins(ROOT / "requirements.in"), _pins(ROOT / "requirements-dev.in")
    runtime, dev = _pins(ROOT / "requirements.txt"), _pins(ROOT / "requirements-dev.txt")
    for name, version in runtime_in.items():
        assert runtime.get(name) == version, name
        assert dev.get(name) == version, name
    for name, version in dev_in.items():
        assert dev.get(name) == version, name
    # The development set includes the runtime set at the same versions (the dev lock is constrained by it).
    for name, version in runtime.items():
        assert dev.get(name) == version, name


def test_runtime_and_development_requirements_are_split() -> None:
    """Test, benchmark and tooling packages are not runtime; what the service imports at runtime is."""
    runtime = _pins(ROOT / "requirements.txt")
    for dev_only in ("standardwebhooks", "psutil", "honcho", "pytest", "ruff", "moto", "aiosmtpd", "pip-tools"):
        assert dev_only not in runtime, dev_only
    for needed in ("cryptography", "gunicorn", "opentelemetry-instrumentation-django", "django", "celery"):
        assert needed in _pins(ROOT / "requirements.in"), needed


def _make_dry_run(*targets: str) -> list[str]:
    """Return the commands `make` would run for these targets (`make -n -B`: everything, nothing executed)."""
    done = subprocess.run(["make", "-n", "-B", *targets], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_make_installs_from_the_locks_and_can_regenerate_them() -> None:
    """`make run`/`make test` install every lock with --require-hashes; `make lock` compiles all three."""
    install = _make_dry_run(".venv/.installed")
    # pip installs the installer from its own lock; the installer installs the rest from theirs.
    assert any("pip install" in c and "--require-hashes -r requirements-bootstrap.txt" in c for c in install), install
    assert any("uv pip install" in c and "--require-hashes -r requirements-dev.txt" in c for c in install), install
    # A local package cannot be hash-locked: installed on its own, without dependencies.
    assert any("uv pip install" in c and "--no-deps ./clients/python" in c for c in install), install
    assert list(_pins(ROOT / "requirements-bootstrap.txt")) == ["uv"]
    compiles = [c for c in _make_dry_run("lock") if "pip-compile" in c]
    assert len(compiles) == 3 and all("--generate-hashes" in c for c in compiles), compiles
    assert "--output-file=requirements-bootstrap.txt requirements-bootstrap.in" in compiles[0]
    assert "--output-file=requirements.txt requirements.in" in compiles[1]
    assert "--output-file=requirements-dev.txt requirements-dev.in" in compiles[2]


def _glob(path: str, pattern: str) -> bool:
    """Match like Docker: `*` and `?` stay within one path segment."""
    regex = re.escape(pattern).replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    return re.fullmatch(regex, path) is not None


def _ignored(path: str, patterns: list[str]) -> bool:
    """Apply .dockerignore patterns (last match wins; `!` re-includes; a directory covers its contents)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.removeprefix("!")
        if pattern.startswith("**/"):
            # Any run of segments, at any depth.
            spans = ["/".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)]
            hit = any(_glob(span, pattern[3:]) for span in spans)
        else:
            hit = any(_glob(prefix, pattern) for prefix in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_image_build_context_has_the_runtime_and_no_tests() -> None:
    """The ignore file leaves out tests, benchmarks, CI, docs and development requirements; keeps the app."""
    patterns = [
        line.strip()
        for line in (ROOT / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert _ignored("tests/conftest.py", patterns)
    for path in ("tests/accepting/test_accept.py", ".ci/run", "bench/e2e.py", "requirements-dev.txt",
                 "docs/operations.md", "notifier/__pycache__/x.pyc", ".venv/bin/python", "docker/.env",
                 "scripts/optional.py"):  # fmt: skip
        assert _ignored(path, patterns), path
    for path in ("manage.py", "config/settings.py", "notifier/models.py", "gunicorn.conf.py", "pyproject.toml",
                 "requirements.txt", "LICENSE", "README.md", "channels_app/providers/base.py"):  # fmt: skip
        assert not _ignored(path, patterns), path


def test_dockerfile_is_multi_stage_non_root_with_a_healthcheck() -> None:
    """Two stages; the runtime lock only, with hashes; a numeric non-root user; HEALTHCHECK; gunicorn.conf.py."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)", text, flags=re.MULTILINE)
    assert stages == ["build", "runtime"]
    final = text.split("AS runtime", 1)[1]
    assert "COPY --from=build /opt/venv /opt/venv" in final
    assert "pip install" not in final
    assert "pip install --require-hashes -r /tmp/requirements.txt" in text
    assert "requirements-dev" not in text
    user = re.findall(r"^USER (\S+)", final, flags=re.MULTILINE)
    assert user and user[-1].split(":")[0] not in {"0", "root"}
    assert re.search(r"^HEALTHCHECK .*\n.*/healthz", final, flags=re.MULTILINE)
    assert 'CMD ["gunicorn", "-c", "gunicorn.conf.py", "config.wsgi"]' in final
