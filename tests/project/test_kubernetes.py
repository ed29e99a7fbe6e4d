"""The Kubernetes manifests under deploy/kubernetes, validated offline.

Every object validates against the Kubernetes JSON schemas shipped in `kubernetes-validate` (no network, no
cluster); the KEDA objects, whose CRDs those schemas do not cover, are checked for the fields KEDA requires,
for targets that exist and for queues that core/queues.py declares.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from django.conf import settings
from kubernetes_validate.utils import ValidationError

from core.queues import WORKER_CLASSES, build_queues
from tests.cluster.servers import ADVANCED_CONFIG
from tests.manifests import base_resources, celery_worker_args, of_kind, pod_spec, render_overlay

# The oldest Kubernetes the manifests support (preStop `sleep` is on by default from 1.30) and the newest the
# pinned schemas know.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
KEDA_API = "keda.sh/v1alpha1"
BASE = base_resources()
DEPLOYMENTS = of_kind(BASE, "Deployment")
WORKERS = {f"notifier-worker-{w.name}": w for w in WORKER_CLASSES}
QUEUES = {q.name for q in build_queues()}


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(obj)
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_base_object_validates_against_the_kubernetes_schemas(version: str) -> None:
    """Strict schema validation (unknown fields rejected) of every non-KEDA object of the base."""
    checked = 0
    for doc in BASE:
        if doc["apiVersion"] == KEDA_API:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 20


def test_the_example_overlay_renders_and_validates() -> None:
    """`kubectl kustomize` renders the example overlay; everything in it validates and carries its namespace."""
    rendered = render_overlay("example")
    if rendered is None:
        pytest.skip("kubectl is not installed (the base is validated without it)")
    assert len(rendered) == len(BASE) + 1  # + the Namespace
    for doc in rendered:
        if doc["apiVersion"] != KEDA_API:
            kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
        if doc["kind"] not in {"Namespace", "PriorityClass"}:
            assert doc["metadata"]["namespace"] == "notifier", doc["metadata"]["name"]
    images = {c["image"] for d in rendered if d["kind"] in {"Deployment", "Job"} for c in _containers(d)}
    assert images == {"registry.example.com/notifier:0.1.0.dev0"}


def test_the_validator_rejects_a_broken_manifest() -> None:
    """The check can fail: a misspelt field and a wrong type are both caught."""
    api = copy.deepcopy(DEPLOYMENTS["notifier-api"])
    api["spec"]["replica"] = 2
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(api, K8S_VERSIONS[-1], strict=True)
    api = copy.deepcopy(DEPLOYMENTS["notifier-api"])
    api["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(api, K8S_VERSIONS[-1], strict=True)


def test_the_deployments_are_the_components_and_worker_classes() -> None:
    """API, stream, beat, Flower and one Deployment per worker class of core/queues.py."""
    assert set(DEPLOYMENTS) == {"notifier-api", "notifier-stream", "notifier-beat", "notifier-flower", *WORKERS}
    assert pod_spec(DEPLOYMENTS["notifier-stream"])["containers"][0]["command"][:2] == [
        "uvicorn",
        "config.asgi:application",
    ]
    assert "gunicorn.conf.py" in pod_spec(DEPLOYMENTS["notifier-api"])["containers"][0]["command"]


def test_worker_deployments_run_their_class_queues_and_pool() -> None:
    """Each worker Deployment consumes exactly its class's queues with its pool and concurrency."""
    for name, worker in WORKERS.items():
        args = celery_worker_args(pod_spec(DEPLOYMENTS[name])["containers"][0]["command"])
        assert args == {"queues": ",".join(worker.queues), "pool": worker.pool, "concurrency": str(worker.concurrency)}


def test_beat_is_exactly_one_replica_recreated_and_never_autoscaled() -> None:
    """Two beats would fire every schedule twice: one replica, Recreate, no HPA or ScaledObject on it."""
    beat = DEPLOYMENTS["notifier-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    autoscalers = {"ScaledObject", "HorizontalPodAutoscaler"}
    scaled = [d["spec"]["scaleTargetRef"]["name"] for d in BASE if d["kind"] in autoscalers]
    assert "notifier-beat" not in scaled


def test_http_components_probe_readyz_and_healthz() -> None:
    """The API and the stream: readiness on /readyz, liveness on /healthz; Host allowed by pod IP."""
    for name in ("notifier-api", "notifier-stream"):
        container = pod_spec(DEPLOYMENTS[name])["containers"][0]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "$(POD_IP)" in env["ALLOWED_HOSTS"] and "$(PUBLIC_HOSTS)" in env["ALLOWED_HOSTS"]
    for name in WORKERS:
        container = pod_spec(DEPLOYMENTS[name])["containers"][0]
        assert container["livenessProbe"] and container["readinessProbe"]


def test_every_container_has_requests_and_a_memory_limit() -> None:
    """Requests for CPU and memory (scheduling, HPA utilisation) and a memory limit on every container."""
    for obj in [*DEPLOYMENTS.values(), *of_kind(BASE, "Job").values()]:
        for container in _containers(obj):
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (obj["metadata"]["name"], container["name"])
            assert "memory" in resources["limits"], (obj["metadata"]["name"], container["name"])


def test_pods_refer_only_to_config_that_exists() -> None:
    """envFrom names the ConfigMap and Secret of the base; PriorityClasses exist; env references resolve."""
    configmap = of_kind(BASE, "ConfigMap")["notifier-config"]["data"]
    secrets = set(of_kind(BASE, "Secret")["notifier-secrets"]["stringData"])
    priority_classes = set(of_kind(BASE, "PriorityClass"))
    for obj in [*DEPLOYMENTS.values(), *of_kind(BASE, "Job").values()]:
        spec = pod_spec(obj)
        if "priorityClassName" in spec:
            assert spec["priorityClassName"] in priority_classes
        for container in _containers(obj):
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] == "notifier-config"
                else:
                    assert source["secretRef"]["name"] == "notifier-secrets"
    assert {"SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"} <= secrets
    assert "PUBLIC_HOSTS" in configmap and configmap["DEBUG"] == "false"


def test_migrations_run_in_a_job_and_every_database_user_waits_for_them() -> None:
    """The Job migrates; every Deployment that touches the database waits in an init container for it."""
    job = of_kind(BASE, "Job")["notifier-migrate"]
    assert pod_spec(job)["containers"][0]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    for name, deployment in DEPLOYMENTS.items():
        if name in {"notifier-flower", "notifier-stream"}:
            continue
        init = pod_spec(deployment).get("initContainers", [])
        assert any("migrate --check" in " ".join(c["command"]) for c in init), name


def test_the_recovery_settings_are_the_shipped_defaults() -> None:
    """The manifests run the lease, relay and stall settings that `make run` ships (and the fault tests use)."""
    data = of_kind(BASE, "ConfigMap")["notifier-config"]["data"]
    for name in ("SENDING_LEASE_SECONDS", "OUTBOX_RELAY_INTERVAL_SECONDS", "OUTBOX_REPUBLISH_AFTER_SECONDS",
                 "FANOUT_STALL_SECONDS"):  # fmt: skip
        assert float(data[name]) == float(getattr(settings, name)), name
    # A dead worker's claim is taken again within a minute of its death, a live one renews it in time.
    assert settings.SENDING_LEASE_SECONDS + settings.OUTBOX_RELAY_INTERVAL_SECONDS <= 60
    assert settings.SENDING_HEARTBEAT_SECONDS == 0  # a third of the lease: two renewals may fail in a row
    for name in WORKERS:
        # The heartbeat renews the lease until the process exits, so the grace period need not stay below it.
        assert pod_spec(DEPLOYMENTS[name])["terminationGracePeriodSeconds"] >= 60, name


def test_every_long_running_component_has_a_disruption_budget() -> None:
    """A PDB selects each Deployment but Flower; single-replica ones allow the drain (maxUnavailable)."""
    pdbs = of_kind(BASE, "PodDisruptionBudget")
    covered = set()
    for pdb in pdbs.values():
        selector = pdb["spec"]["selector"]["matchLabels"]
        matches = [
            n for n, d in DEPLOYMENTS.items() if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, pdb["metadata"]["name"]
        covered.add(matches[0])
        if DEPLOYMENTS[matches[0]]["spec"]["replicas"] == 1 and matches[0] not in WORKERS:
            assert "maxUnavailable" in pdb["spec"]
    assert covered == set(DEPLOYMENTS) - {"notifier-flower"}


# --- KEDA ------------------------------------------------------------------------------------------------


def _scaled_objects() -> dict[str, dict[str, Any]]:
    return of_kind(BASE, "ScaledObject")


def test_keda_objects_have_the_fields_keda_requires() -> None:
    """apiVersion, scaleTargetRef.name, triggers with type and metadata; rabbitmq needs queueName, mode, value
    and a host from a TriggerAuthentication whose secret key exists."""
    auths = of_kind(BASE, "TriggerAuthentication")
    secret = of_kind(BASE, "Secret")["notifier-secrets"]["stringData"]
    for auth in auths.values():
        assert auth["apiVersion"] == KEDA_API
        for ref in auth["spec"]["secretTargetRef"]:
            assert {"parameter", "name", "key"} <= set(ref)
            assert ref["name"] == "notifier-secrets" and ref["key"] in secret
    assert _scaled_objects()
    for obj in _scaled_objects().values():
        assert obj["apiVersion"] == KEDA_API
        spec = obj["spec"]
        assert spec["scaleTargetRef"]["name"]
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["triggers"]
        for trigger in spec["triggers"]:
            assert trigger["type"] == "rabbitmq"
            meta = trigger["metadata"]
            assert meta["queueName"] and meta["mode"] in {"QueueLength", "MessageRate"}
            assert isinstance(meta["value"], str) and float(meta["value"]) > 0  # KEDA wants a string
            assert meta["protocol"] in {"amqp", "http", "auto"}
            auth = auths[trigger["authenticationRef"]["name"]]
            assert any(ref["parameter"] == "host" for ref in auth["spec"]["secretTargetRef"])


def test_keda_targets_exist_and_scale_exactly_their_workers_queues() -> None:
    """One ScaledObject per worker class; it targets that Deployment and names exactly the queues it consumes."""
    targets = {obj["spec"]["scaleTargetRef"]["name"]: obj for obj in _scaled_objects().values()}
    assert set(targets) == set(WORKERS)
    for name, obj in targets.items():
        assert obj["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
        assert name in DEPLOYMENTS
        queues = [t["metadata"]["queueName"] for t in obj["spec"]["triggers"]]
        assert set(queues) <= QUEUES
        assert sorted(queues) == sorted(WORKERS[name].queues)


def test_high_priority_scales_first() -> None:
    """High polls more often, wants fewer messages per pod, has no scale-up delay and never drops below 2."""
    high = _scaled_objects()["notifier-worker-high"]["spec"]
    behavior = high["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
    assert behavior["stabilizationWindowSeconds"] == 0
    assert high["minReplicaCount"] >= 2
    for name in ("notifier-worker-low", "notifier-worker-fanout"):
        other = _scaled_objects()[name]["spec"]
        assert high["pollingInterval"] < other["pollingInterval"]
        other_up = other["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
        assert other_up["stabilizationWindowSeconds"] > 0
    low = _scaled_objects()["notifier-worker-low"]["spec"]
    assert float(high["triggers"][0]["metadata"]["value"]) < float(low["triggers"][0]["metadata"]["value"])
    # And when the cluster is full, high-priority pods preempt bulk ones.
    classes = of_kind(BASE, "PriorityClass")
    high_class = pod_spec(DEPLOYMENTS["notifier-worker-high"])["priorityClassName"]
    low_class = pod_spec(DEPLOYMENTS["notifier-worker-low"])["priorityClassName"]
    assert classes[high_class]["value"] > classes[low_class]["value"]


def test_postgresql_connection_budget_fits_the_pooler() -> None:
    """At every autoscaler's maximum the pods open no more connections than PgBouncer's max_client_conn
    (1,000, docs/kubernetes.md): one per gunicorn thread, per worker thread or child (+ the main process)."""
    max_replicas = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"]["maxReplicaCount"] for d in _scaled_objects().values()
    }
    for hpa in of_kind(BASE, "HorizontalPodAutoscaler").values():
        max_replicas[hpa["spec"]["scaleTargetRef"]["name"]] = hpa["spec"]["maxReplicas"]
    total = 0
    for name, deployment in DEPLOYMENTS.items():
        container = pod_spec(deployment)["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if name == "notifier-api":
            per_pod = int(env["WEB_WORKERS"]) * int(env["WEB_THREADS"])
        elif name in WORKERS:
            args = celery_worker_args(container["command"])
            assert args is not None, name
            per_pod = int(args["concurrency"]) + 1
        elif name == "notifier-stream":
            per_pod = 4
        elif name == "notifier-beat":
            per_pod = 1
        else:
            continue  # Flower reads the broker only
        total += per_pod * max_replicas.get(name, deployment["spec"]["replicas"])
    assert 400 < total <= 1000, total


def test_the_manifests_name_the_replicated_dependencies_as_the_cluster_tests_run_them() -> None:
    """Every broker node listed, Redis through Sentinel, the LISTEN connection on PostgreSQL's writable host."""
    from core.database_url import database_hosts, parse_database_url

    config = of_kind(BASE, "ConfigMap")["notifier-config"]["data"]
    secret = of_kind(BASE, "Secret")["notifier-secrets"]["stringData"]
    brokers = secret["CELERY_BROKER_URL"].split(";")
    assert len(brokers) == 3 and all(url.startswith("amqp://") and url.endswith("/notifier") for url in brokers)
    assert ";" not in secret["KEDA_RABBITMQ_URL"]  # KEDA takes one URL
    assert len(config["REDIS_SENTINELS"].split(",")) == 3 and config["REDIS_SENTINEL_MASTER"]
    listen = secret["INBOX_LISTEN_DATABASE_URL"]
    assert len(database_hosts(listen)) == 2
    assert parse_database_url(listen)["OPTIONS"]["target_session_attrs"] == "read-write"


def test_the_docs_ask_for_the_broker_settings_the_cluster_tests_run() -> None:
    """The broker's failure-detector poll interval the cluster suite's nodes run is what docs/kubernetes.md asks for."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    poll = re.fullmatch(r"\[\{aten, \[\{poll_interval, (\d+)\}\]\}\]\.\n", ADVANCED_CONFIG)
    assert poll, ADVANCED_CONFIG
    assert f"`{ADVANCED_CONFIG.strip()}`" in docs
    assert f"raft.adaptive_failure_detector.poll_interval = {poll[1]}" in docs
