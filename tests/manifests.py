"""Read the deployment files the tests compare: the Kubernetes base, the Procfile and docker/compose.yml."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"


def _load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@cache
def base_resources() -> tuple[dict[str, Any], ...]:
    """Return every object of deploy/kubernetes/base, in the order its kustomization lists the files."""
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += _load_all(K8S / "base" / name)
    return tuple(docs)


def render_overlay(name: str = "example") -> list[dict[str, Any]] | None:
    """Render an overlay with `kubectl kustomize` (offline); None when kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / name)], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """Return {name: object} of one kind."""
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """Return the pod spec of a Deployment or Job."""
    return obj["spec"]["template"]["spec"]


def celery_worker_args(command: list[str] | str) -> dict[str, str] | None:
    """Parse a `celery -A config worker` command line into {queues, pool, concurrency}; None if not a worker."""
    args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if "worker" not in args or not any(a.endswith("celery") for a in args):
        return None
    found: dict[str, str] = {}
    for flag, key in (("-Q", "queues"), ("--pool", "pool"), ("--concurrency", "concurrency")):
        if flag in args:
            # A shell or compose default (${HIGH_CONCURRENCY:-8}) stands for its default value.
            found[key] = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", args[args.index(flag) + 1])
    return found


def procfile() -> dict[str, str]:
    """Return the Procfile as {process: command}."""
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip() and not line.startswith("#"))


def compose() -> dict[str, Any]:
    """Return docker/compose.yml parsed."""
    return yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())
