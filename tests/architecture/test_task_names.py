"""One registry of task names: every Celery task is named from core.task_names, and nobody spells one elsewhere."""

from __future__ import annotations

import ast

import pytest

from config.celery import app
from core import task_names
from tests.architecture.sql_text import PACKAGES, ROOT

pytestmark = pytest.mark.pure


def _registered() -> set[str]:
    app.loader.import_default_modules()
    return {name for name in app.tasks if not name.startswith("celery.")}


def test_every_task_is_in_the_registry_and_every_name_is_a_task() -> None:
    registered = _registered()
    assert len(registered) >= 15
    assert registered == set(task_names.ALL)


def test_the_beat_schedule_names_registered_tasks() -> None:
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert scheduled
    assert scheduled <= set(task_names.ALL)


def test_no_module_spells_a_task_name() -> None:
    spelled = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "core" / "task_names.py" or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in task_names.ALL:
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert spelled == []
