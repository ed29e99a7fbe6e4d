"""The Grafana dashboard and the Prometheus alert rules under deploy/observability.

They parse, they follow the house rules (severity, summary, description, one data source variable), every
metric and label they name is exported by /metrics, and `promtool check rules` accepts the rules and every
dashboard query when promtool is installed (Debian's `prometheus` package).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from core import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "observability" / "prometheus" / "alerts.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
DASHBOARD = ROOT / "deploy" / "observability" / "grafana" / "notifier.json"
SELECTOR = re.compile(r"\b(notifier_[a-z_]+)(\{[^}]*\})?")
DURATION = re.compile(r"^\d+[smhd]$")


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def _all_exprs() -> list[str]:
    return [rule["expr"] for rule in _rules()] + _dashboard_exprs()


@pytest.mark.pure
def test_alert_rules_parse_and_follow_the_house_rules() -> None:
    """Unique alert names, a `for`, a known severity, a summary and a description; balanced brackets."""
    spec = yaml.safe_load(RULES.read_text())
    groups = [g["name"] for g in spec["groups"]]
    assert len(groups) == len(set(groups))
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert DURATION.match(rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"page", "warning", "ticket"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        expr = rule["expr"]
        for opening, closing in ("()", "[]", "{}"):
            assert expr.count(opening) == expr.count(closing), rule["alert"]


def _anchor(heading: str) -> str:
    """Return the anchor a Markdown renderer (GitHub's rules) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _runbook_sections() -> dict[str, str]:
    """Return {anchor: section text} of the second-level sections of docs/runbooks.md."""
    sections: dict[str, str] = {}
    for part in re.split(r"^## ", RUNBOOKS.read_text(), flags=re.MULTILINE)[1:]:
        heading, _, body = part.partition("\n")
        sections[_anchor(heading)] = body
    return sections


@pytest.mark.pure
def test_every_alert_has_a_runbook_section_that_says_what_to_do() -> None:
    """Each rule's runbook_url points at a section of docs/runbooks.md that exists and says what the alert
    means, what to look at first and what fixes it; no section is left for an alert that is gone."""
    sections = _runbook_sections()
    linked = set()
    for rule in _rules():
        url = rule["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/runbooks.md" and anchor, f"{rule['alert']}: runbook_url {url!r}"
        assert (ROOT / path).is_file()
        assert anchor in sections, f"{rule['alert']}: no heading with the anchor #{anchor} in docs/runbooks.md"
        body = sections[anchor]
        for part in ("**Means.**", "**Look first.**", "**Fix.**"):
            assert part in body, f"{rule['alert']}: its runbook has no {part}"
        linked.add(anchor)
    assert set(sections) == linked, f"runbook sections without an alert: {set(sections) - linked}"
    for target in re.findall(r"\]\(#([^)]+)\)", RUNBOOKS.read_text()):
        assert target in sections, f"docs/runbooks.md links to a missing section #{target}"


@pytest.mark.pure
def test_alerts_cover_what_an_operator_must_hear_about() -> None:
    """Queue depth and age, dead letters growing, breaker open, outbox backlog, OTP latency, nothing sent."""
    by_metric = " ".join(rule["expr"] for rule in _rules())
    for needed in (
        "notifier_queue_depth",
        "notifier_queued_oldest_seconds",
        "notifier_dead_letters_pending",
        "notifier_breaker_state",
        "notifier_outbox_backlog",
        "notifier_delivery_latency_seconds_bucket",
        'notifier_deliveries_total{status="sent"}',
    ):
        assert needed in by_metric, needed


@pytest.mark.pure
def test_dashboard_parses_and_shows_every_topic() -> None:
    """Unique panel ids, panels inside the 24-column grid, one data source variable, every topic present."""
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
    exprs = " ".join(_dashboard_exprs())
    for needed in (
        "notifier_notifications_accepted_total",  # accept rate
        "notifier_deliveries_total",  # by status and channel
        "notifier_queue_depth",
        "notifier_provider_call_seconds_bucket",  # latency
        'notifier_provider_call_seconds_count{outcome!="ok"}',  # errors
        "notifier_breaker_state",
        "notifier_ratelimit_tokens_total",
        "notifier_dead_letters_pending",
        'notifier_delivery_latency_seconds_bucket{priority="high", channel="sms"}',  # OTP latency
        "notifier_fair_backlog",  # fair shares per project
        "notifier_fair_wait_seconds",
        "notifier_fair_share",
        "notifier_fair_fed_total",
        "notifier_render_cost_seconds",
    ):
        assert needed in exprs, needed


def _exported() -> dict[str, set[str]]:
    """Move every helper once, scrape /metrics, return {sample name: label names}."""
    metrics.count_accepted("transactional", "packs")
    metrics.count_deliveries("sms", "sandbox", "sent")
    metrics.observe_provider_call("sandbox", 0.01, "ok")
    metrics.count_throttled("sandbox")
    metrics.count_rate_limit("sandbox", "high", 2, 1)
    metrics.observe_delivery_latency("sms", "high", [0.2])
    metrics.set_breaker_state("sandbox", "closed")
    metrics.fanout_progress(created=1, channel="push")
    metrics.count_republished(1)
    metrics.observe_task("packs", "SUCCESS", 0.1)
    metrics.observe_http("GET", "packs", 200, 0.01)
    response = Client().get("/metrics")
    assert response.status_code == 200
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        if not family.samples:
            # A family read at scrape time with no series yet (no dead letters): its name is still exported.
            exported.setdefault(family.name, set())
            if family.type == "counter":  # its samples would be named `<name>_total`
                exported.setdefault(f"{family.name}_total", set())
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


@pytest.mark.django_db
def test_every_metric_and_label_the_packs_name_is_exported() -> None:
    """Each `notifier_*` series in a rule or panel is in the scrape, with the labels its selector uses."""
    exported = _exported()
    seen = set()
    for expr in _all_exprs():
        for name, selector in SELECTOR.findall(expr):
            seen.add(name)
            assert name in exported, f"{name} (in {expr!r}) is not exported by /metrics"
            for label in re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", selector or ""):
                assert label in exported[name] or not exported[name], f"{name} has no label {label}"
        for labels in re.findall(r"by \(([^)]*)\)", expr):
            wanted = {label.strip() for label in labels.split(",")} - {"le"}
            names = [n for n, _ in SELECTOR.findall(expr)]
            assert any(wanted <= exported[n] or not exported[n] for n in names), (expr, wanted)
    assert len(seen) >= 15


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus); the rules are linted above")
    return promtool


@pytest.mark.pure
def test_promtool_accepts_the_alert_rules() -> None:
    """`promtool check rules` parses every expression and template."""
    result = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.pure
def test_promtool_accepts_every_dashboard_query(tmp_path: Path) -> None:
    """Each panel query, Grafana's $__rate_interval made concrete, is valid PromQL (as a recording rule)."""
    promtool = _promtool()
    records = [
        {"record": f"notifier:dashboard_query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(_dashboard_exprs())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    unbalanced = {"record": "x:y", "expr": "sum(rate(x[5m])"}
    broken.write_text(yaml.safe_dump({"groups": [{"name": "b", "rules": [unbalanced]}]}))
    assert subprocess.run([promtool, "check", "rules", str(broken)], capture_output=True).returncode != 0
