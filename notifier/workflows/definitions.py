"""What a workflow definition may say, checked when it is saved: every problem names its step.

A definition is a list of steps run in order. A condition (`if`) may only look at an earlier step: a step
that refers to itself or to a later one would make the order circular, and is refused as a cycle.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import time
from typing import Any

from django.conf import settings

STEP_TYPES = ("send", "delay", "digest", "throttle")
# What a condition on an earlier send step can ask about: the statuses its deliveries reached.
CONDITION_STATUSES = ("queued", "sent", "delivered", "opened", "clicked", "failed", "bounced", "suppressed",
                      "cancelled", "skipped")  # fmt: skip
STEP_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# A digest key names payload fields only ("{{ thread_id }}", "{{ post.id }}"): a key, not a template.
KEY_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s*\}\}")
MAX_STEPS = 50
MAX_SECONDS = 366 * 86400

# Template lookups are passed in (templates_app sits below this app, but the caller decides the resolution).
TemplateChannels = Callable[[str], tuple[str, list[str]] | None]


class DefinitionError(ValueError):
    """A definition is not valid; `field` is where (e.g. "steps[2].template") and the message names the step."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _positive_int(step: dict[str, Any], name: str, where: str, label: str, *, most: int = MAX_SECONDS) -> None:
    value = step.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise DefinitionError(f"{where}.{name}", f"step '{label}': '{name}' must be an integer from 1 to {most}.")


def validate(*, category: str, steps: Any, template_channels: TemplateChannels) -> list[dict[str, Any]]:
    """Return the steps if they form a valid definition; raise DefinitionError naming the first bad step.

    `template_channels(key)` answers (category, channels) of a template's published version, or None when
    there is no such template.
    """
    if category not in settings.NOTIFIER_CATEGORIES:
        raise DefinitionError("category", f"Unknown category '{category}'.")
    if not isinstance(steps, list) or not steps:
        raise DefinitionError("steps", "A workflow needs a list of at least one step.")
    if len(steps) > MAX_STEPS:
        raise DefinitionError("steps", f"At most {MAX_STEPS} steps.")
    seen: dict[str, str] = {}  # step id -> type, of the steps before the current one
    all_ids = {s.get("id") for s in steps if isinstance(s, dict)}
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if not isinstance(step, dict):
            raise DefinitionError(where, f"Step {index + 1} must be an object.")
        step_id = step.get("id")
        if not isinstance(step_id, str) or not STEP_ID.match(step_id):
            raise DefinitionError(f"{where}.id", f"Step {index + 1} needs an 'id' of letters, digits, '-' or '_'.")
        if step_id in seen:
            raise DefinitionError(f"{where}.id", f"step '{step_id}': the id is used by an earlier step.")
        kind = step.get("type")
        if kind not in STEP_TYPES:
            raise DefinitionError(
                f"{where}.type", f"step '{step_id}': unknown step type {kind!r} (known: {', '.join(STEP_TYPES)})."
            )
        _CHECKS[kind](step, where, step_id, category, template_channels)
        if "if" in step:
            _check_condition(step["if"], f"{where}.if", step_id, seen, all_ids)
        allowed = _FIELDS[kind] | {"id", "type", "if"}
        unknown = sorted(set(step) - allowed)
        if unknown:
            raise DefinitionError(f"{where}.{unknown[0]}", f"step '{step_id}': unknown field '{unknown[0]}'.")
        seen[step_id] = kind
    return steps


def _check_send(step: dict[str, Any], where: str, label: str, category: str, lookup: TemplateChannels) -> None:
    has_one, has_many = "channel" in step, "channels" in step
    if has_one == has_many:
        raise DefinitionError(f"{where}.channel", f"step '{label}': give exactly one of 'channel' and 'channels'.")
    channels = [step["channel"]] if has_one else step["channels"]
    if not isinstance(channels, list) or not channels or len(set(map(str, channels))) != len(channels):
        raise DefinitionError(f"{where}.channels", f"step '{label}': 'channels' must be a list of distinct channels.")
    for channel in channels:
        if channel not in settings.CHANNELS:
            raise DefinitionError(
                f"{where}.channel",
                f"step '{label}': unknown channel {channel!r} (known: {', '.join(settings.CHANNELS)}).",
            )
    template = step.get("template")
    if not isinstance(template, str) or not template:
        raise DefinitionError(f"{where}.template", f"step '{label}': a send step needs a 'template'.")
    found = lookup(template)
    if found is None:
        raise DefinitionError(f"{where}.template", f"step '{label}': unknown template '{template}'.")
    template_category, template_channels = found
    if template_category != category:
        raise DefinitionError(
            f"{where}.template",
            f"step '{label}': template '{template}' is of category '{template_category}', "
            f"the workflow of '{category}'.",
        )
    missing = [c for c in channels if c not in template_channels]
    if missing:
        raise DefinitionError(
            f"{where}.channel",
            f"step '{label}': template '{template}' has no content for channel(s) {', '.join(missing)}.",
        )


def parse_local_time(value: Any) -> time:
    """Parse "HH:MM" or "HH:MM:SS" (a wall-clock time of day); raise ValueError otherwise."""
    if not isinstance(value, str) or not re.match(r"^\d{2}:\d{2}(:\d{2})?$", value):
        raise ValueError("expected HH:MM")
    return time.fromisoformat(value)


def _check_delay(step: dict[str, Any], where: str, label: str, category: str, lookup: TemplateChannels) -> None:
    given = [name for name in ("seconds", "until", "until_local") if name in step]
    if len(given) != 1:
        raise DefinitionError(
            f"{where}.seconds", f"step '{label}': give exactly one of 'seconds', 'until' and 'until_local'."
        )
    if given[0] == "seconds":
        _positive_int(step, "seconds", where, label)
    elif given[0] == "until":
        if not isinstance(step["until"], str) or not step["until"]:
            raise DefinitionError(f"{where}.until", f"step '{label}': 'until' names a payload field with a time.")
    else:
        try:
            parse_local_time(step["until_local"])
        except ValueError:
            raise DefinitionError(
                f"{where}.until_local", f"step '{label}': 'until_local' is a time of day such as '09:00'."
            ) from None


def _check_digest(step: dict[str, Any], where: str, label: str, category: str, lookup: TemplateChannels) -> None:
    _positive_int(step, "window_seconds", where, label)
    key = step.get("key", "")
    if not isinstance(key, str) or len(key) > 255:
        raise DefinitionError(f"{where}.key", f"step '{label}': 'key' is a string of at most 255 characters.")
    if "{%" in KEY_PLACEHOLDER.sub("", key) or "{{" in KEY_PLACEHOLDER.sub("", key):
        raise DefinitionError(
            f"{where}.key", f"step '{label}': 'key' may only hold payload fields such as '{{{{ thread_id }}}}'."
        )


def _check_throttle(step: dict[str, Any], where: str, label: str, category: str, lookup: TemplateChannels) -> None:
    _positive_int(step, "max", where, label, most=1_000_000)
    _positive_int(step, "per_seconds", where, label)


def _check_condition(cond: Any, where: str, label: str, earlier: dict[str, str], all_ids: set[Any]) -> None:
    if not isinstance(cond, dict):
        raise DefinitionError(where, f"step '{label}': 'if' must be an object.")
    if "step" in cond:
        target = cond["step"]
        if target == label or (target in all_ids and target not in earlier):
            raise DefinitionError(
                f"{where}.step",
                f"step '{label}': its condition refers to step '{target}', which does not come before it (a cycle).",
            )
        if target not in earlier:
            raise DefinitionError(f"{where}.step", f"step '{label}': its condition refers to unknown step '{target}'.")
        if earlier[target] != "send":
            raise DefinitionError(
                f"{where}.step", f"step '{label}': its condition refers to step '{target}', which sends nothing."
            )
        ops = [op for op in ("status_in", "status_not_in") if op in cond]
        if len(ops) != 1 or set(cond) != {"step", ops[0]}:
            raise DefinitionError(
                where, f"step '{label}': a step condition has exactly one of status_in, status_not_in."
            )
        values = cond[ops[0]]
        bad = [v for v in values if v not in CONDITION_STATUSES] if isinstance(values, list) else [values]
        if not isinstance(values, list) or not values or bad:
            raise DefinitionError(
                f"{where}.{ops[0]}",
                f"step '{label}': {ops[0]} is a list of statuses from {', '.join(CONDITION_STATUSES)}.",
            )
        return
    if "payload" in cond:
        if not isinstance(cond["payload"], str) or not cond["payload"]:
            raise DefinitionError(f"{where}.payload", f"step '{label}': 'payload' names a payload field.")
        ops = [op for op in ("equals", "in", "exists") if op in cond]
        if len(ops) != 1 or set(cond) != {"payload", ops[0]}:
            raise DefinitionError(where, f"step '{label}': a payload condition has exactly one of equals, in, exists.")
        if ops[0] == "in" and not isinstance(cond["in"], list):
            raise DefinitionError(f"{where}.in", f"step '{label}': 'in' is a list of values.")
        if ops[0] == "exists" and not isinstance(cond["exists"], bool):
            raise DefinitionError(f"{where}.exists", f"step '{label}': 'exists' is true or false.")
        return
    raise DefinitionError(where, f"step '{label}': 'if' needs 'step' or 'payload'.")


_CHECKS = {"send": _check_send, "delay": _check_delay, "digest": _check_digest, "throttle": _check_throttle}
_FIELDS = {
    "send": {"channel", "channels", "template"},
    "delay": {"seconds", "until", "until_local"},
    "digest": {"window_seconds", "key"},
    "throttle": {"max", "per_seconds"},
}


def payload_value(payload: Any, path: str) -> tuple[bool, Any]:
    """Return (found, value) of a dotted field path ("order.id") in a payload."""
    node = payload
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def digest_key(source: str, payload: Any) -> str:
    """Return a digest step's key for a payload: each "{{ field }}" replaced by that field's value ("" if absent)."""

    def value(match: re.Match[str]) -> str:
        found, v = payload_value(payload, match.group(1))
        return "" if not found or v is None else str(v)

    return KEY_PLACEHOLDER.sub(value, source)[:255]
