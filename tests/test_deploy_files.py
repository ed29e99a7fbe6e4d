"""The compose files are valid for Docker Compose (checked with the compose CLI when this machine has one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {"SECRET_KEY": "x", "POSTGRES_PASSWORD": "x", "RABBITMQ_PASSWORD": "x", "FLOWER_BASIC_AUTH": "a:b"}


def _compose() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.mark.parametrize("name", ["compose.yml", "compose.deps.yml"])
def test_compose_config_accepts_the_file(name: str) -> None:
    compose = _compose()
    if compose is None:
        pytest.skip("no docker compose CLI on this machine (test_compose_structure checks the structure)")
    env = {**os.environ, **REQUIRED}
    result = subprocess.run(
        [*compose, "-f", str(ROOT / "docker" / name), "config", "-q"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr


def test_compose_refuses_to_start_without_secrets() -> None:
    compose = _compose()
    if compose is None:
        pytest.skip("no docker compose CLI on this machine")
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED}
    result = subprocess.run(
        [*compose, "-f", str(ROOT / "docker" / "compose.yml"), "config", "-q"], capture_output=True, text=True, env=env
    )
    assert result.returncode != 0
    assert "set " in result.stderr


def test_compose_structure() -> None:
    """Check what a deployment relies on, without the compose CLI: pools per priority, beat, Flower, health."""
    import yaml

    spec = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())
    services = spec["services"]
    assert {"postgres", "rabbitmq", "redis", "api", "beat", "flower", "migrate"} <= set(services)
    commands = {name: " ".join(map(str, svc.get("command") or [])) for name, svc in services.items()}
    high = next(c for c in commands.values() if "push.high" in c)
    low = next(c for c in commands.values() if "push.low" in c)
    assert "low" not in high.split("-Q", 1)[1].split()[0]
    assert "high" not in low.split("-Q", 1)[1].split()[0]
    assert any("fanout" in c for c in commands.values())
    for name in ("postgres", "rabbitmq", "redis"):
        assert "healthcheck" in services[name]
