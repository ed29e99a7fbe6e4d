"""The compose files are valid for Docker Compose (checked with the compose CLI when this machine has one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
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


# --- One source of truth: core/queues.py's worker classes in the Procfile, compose and Kubernetes --------


def _classes_in(commands: dict[str, Any]) -> dict[tuple[str, ...], tuple[str, str]]:
    """Return {sorted queues: (pool, concurrency)} of every Celery worker among `commands`."""
    from tests.manifests import celery_worker_args

    found: dict[tuple[str, ...], tuple[str, str]] = {}
    for command in commands.values():
        args = celery_worker_args(command)
        if args is None:
            continue
        queues = tuple(sorted(args["queues"].split(",")))
        assert queues not in found, f"two workers consume {queues}"
        found[queues] = (args["pool"], args["concurrency"])
    return found


def test_procfile_compose_and_kubernetes_start_the_same_worker_classes_as_config() -> None:
    """Same queues, pool and (default) concurrency per worker class in core/queues.py, the Procfile,
    docker/compose.yml and deploy/kubernetes; every work queue of the topology is consumed by exactly one."""
    from core.queues import WORKER_CLASSES, build_queues
    from tests.manifests import base_resources, compose, of_kind, pod_spec, procfile

    expected = {tuple(sorted(w.queues)): (w.pool, str(w.concurrency)) for w in WORKER_CLASSES}
    work_queues = {q.name for q in build_queues() if not q.name.startswith("dead.")}
    assert sorted(q for queues in expected for q in queues) == sorted(work_queues)

    sources = {
        "Procfile": _classes_in(procfile()),
        "docker/compose.yml": _classes_in({n: s.get("command") or [] for n, s in compose()["services"].items()}),
        "deploy/kubernetes": _classes_in(
            {n: pod_spec(d)["containers"][0]["command"] for n, d in of_kind(base_resources(), "Deployment").items()}
        ),
    }
    for source, classes in sources.items():
        assert classes == expected, source


def test_compose_runs_maintenance_on_its_own_worker() -> None:
    """The outbox relay's queue is not shared with fan-out (it would wait behind lanes and retention)."""
    from tests.manifests import celery_worker_args, compose

    for name, service in compose()["services"].items():
        args = celery_worker_args(service.get("command") or [])
        if args and "maintenance" in args["queues"].split(","):
            assert args["queues"] == "maintenance", name


def test_gunicorn_settings_live_in_one_file() -> None:
    """Procfile, compose and Kubernetes start gunicorn with gunicorn.conf.py and repeat none of its flags."""
    from tests.manifests import base_resources, compose, of_kind, pod_spec, procfile

    commands = [
        procfile()["web"],
        " ".join(compose()["services"]["api"]["command"]),
        " ".join(pod_spec(of_kind(base_resources(), "Deployment")["notifier-api"])["containers"][0]["command"]),
    ]
    for command in commands:
        assert "gunicorn -c gunicorn.conf.py config.wsgi" in command, command
        for flag in ("--workers", "--threads", "--graceful-timeout", "-b ", "--bind"):
            assert flag not in command, command
    conf = (ROOT / "gunicorn.conf.py").read_text()
    for setting in ("max_requests_jitter", "forwarded_allow_ips", "graceful_timeout", "threads"):
        assert f"\n{setting} = " in conf


def test_compose_prometheus_scrapes_the_api_and_every_worker_and_loads_the_packs() -> None:
    """Prometheus targets api:8000 and each worker service on :9808; the rules and the dashboard are mounted."""
    import yaml

    from tests.manifests import celery_worker_args, compose

    services = compose()["services"]
    workers = {n for n, s in services.items() if celery_worker_args(s.get("command") or [])}
    prometheus = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    targets: dict[str, set[tuple[str, int]]] = {}
    for job in prometheus["scrape_configs"]:
        for sd in job["dns_sd_configs"]:
            targets.setdefault(job["job_name"], set()).update((name, sd["port"]) for name in sd["names"])
    scraped = set().union(*targets.values())
    assert ("api", 8000) in scraped
    assert {(w, 9808) for w in workers} <= scraped
    for worker in workers:
        assert services[worker]["environment"]["METRICS_WORKER_PORT"] == "9808"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"] if v.startswith(".")}
    assert mounts["/etc/prometheus/alerts.yml"] == "../deploy/observability/prometheus/alerts.yml"
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]
    api_job = next(job for job in prometheus["scrape_configs"] if job["job_name"] == "notifier-api")
    assert api_job["authorization"]["credentials_file"] == "/run/secrets/metrics_token"  # METRICS_TOKEN
    assert "metrics_token" in services["prometheus"]["secrets"]
    assert compose()["secrets"]["metrics_token"] == {"environment": "METRICS_TOKEN"}
    grafana = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"] if v.startswith(".")}
    for host_path in grafana.values():
        assert (ROOT / "docker" / host_path).exists(), host_path
    assert grafana["/var/lib/grafana/dashboards/notifier.json"] == "../deploy/observability/grafana/notifier.json"
    provider = yaml.safe_load((ROOT / "docker/grafana/provisioning/dashboards/notifier.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_env_example_lists_every_variable_compose_reads() -> None:
    """docker/.env.example names every ${VAR} of the compose file, the required secrets left empty."""
    import re

    text = (ROOT / "docker" / "compose.yml").read_text()
    used = set(re.findall(r"(?<!\$)\$\{(\w+)", text))  # $${X} is escaped: the container expands it
    example = dict(
        line.split("=", 1)
        for line in (ROOT / "docker" / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    missing = used - set(example) - {"NOTIFIER_IMAGE"}
    assert not missing, missing
    for required in set(re.findall(r"\$\{(\w+):\?", text)):
        assert example[required] == "", f"{required} must not have a default in .env.example"


# --- LOG_LEVEL governs the Celery processes too --------------------------------------------------------------


def _celery_log_levels(commands: dict[str, Any]) -> dict[str, str | None]:
    """Return {name: the --loglevel argument} of every Celery worker and beat among `commands`."""
    import shlex

    found: dict[str, str | None] = {}
    for name, command in commands.items():
        args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command or []]
        if not any(a.endswith("celery") for a in args) or not ({"worker", "beat"} & set(args)):
            continue
        found[name] = args[args.index("--loglevel") + 1] if "--loglevel" in args else None
    return found


def test_celery_workers_and_beat_log_at_log_level_everywhere() -> None:
    """A worker's --loglevel sets its root level over Django's LOGGING: each one passes LOG_LEVEL on.

    Celery's own default is WARNING, and a fixed INFO had made LOG_LEVEL=WARNING leave every worker at INFO.
    """
    from tests.manifests import base_resources, compose, of_kind, pod_spec, procfile

    sources = {
        "Procfile": (_celery_log_levels(procfile()), "${LOG_LEVEL:-INFO}"),
        "docker/compose.yml": (
            _celery_log_levels({n: s.get("command") for n, s in compose()["services"].items()}),
            "${LOG_LEVEL:-INFO}",
        ),
        "deploy/kubernetes": (
            _celery_log_levels(
                {n: pod_spec(d)["containers"][0]["command"] for n, d in of_kind(base_resources(), "Deployment").items()}
            ),
            "$(LOG_LEVEL)",  # expanded by the kubelet from the container's environment
        ),
    }
    for source, (levels, expected) in sources.items():
        assert len(levels) >= 6, (source, levels)  # five worker classes and beat
        assert set(levels.values()) == {expected}, (source, levels)
    # The kubelet leaves $(LOG_LEVEL) as it is unless the container's environment defines it.
    config = of_kind(base_resources(), "ConfigMap")["notifier-config"]["data"]
    assert config["LOG_LEVEL"]
    for name, deployment in of_kind(base_resources(), "Deployment").items():
        container = pod_spec(deployment)["containers"][0]
        if name in sources["deploy/kubernetes"][0]:
            refs = [e.get("configMapRef", {}).get("name") for e in container.get("envFrom", [])]
            assert "notifier-config" in refs, name


def test_the_procfiles_celery_lines_expand_log_level_in_the_shell() -> None:
    """Honcho runs each line with sh: LOG_LEVEL=WARNING reaches --loglevel, and INFO is the default."""
    import subprocess

    from tests.manifests import procfile

    line = procfile()["worker_high"]
    for env, expected in (({"LOG_LEVEL": "WARNING"}, "WARNING"), ({}, "INFO")):
        out = subprocess.run(
            ["sh", "-c", f"set -- {line}; while [ \"$1\" != --loglevel ]; do shift; done; echo $2"],
            capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **env},
        ).stdout.strip()  # fmt: skip
        assert out == expected, env
