"""Decide from its syntax tree whether a template is in the bounded subset, which is safe to render in-process.

Rendering in-process costs microseconds; rendering in an isolated child (templates_app.isolation) costs a
round trip. The hard limits of the child hold for any template, so this check only has to be sound, never
complete: it is an allow-list. A template is bounded when every node is one of the kinds below, and anything
it does not know (a macro, a call block, a recursive loop, `**`, an unknown filter, a call of anything but a
few linear methods, a list literal built from variables) sends the template to the child instead.

Why the subset is bounded, whatever the payload:
- no macros, call blocks or recursive loops: the code runs once per loop iteration and has no other way to
  repeat, and loop iterations are counted and capped (templates_app.budget);
- every value is a part of the payload, a literal of the template, a small number, or the result of an
  allowed filter, method or `~`, whose size is at most a constant factor of its inputs and is checked against
  the part limit right after it is made (so chains of them cannot grow without bound);
- no operation makes references multiply: list literals hold literals only, and the arithmetic operators
  take numbers (the bounded environment sends anything else to the child at run time, see
  `rendering._BoundedSandbox`), so a list never aliases one big string thousands of times;
- each allowed operation is linear in its input (no backtracking regular expression, no padding, no
  replacement), and the clock is checked at every loop iteration, filter, call, `~` and printed value.
"""

from __future__ import annotations

from jinja2 import nodes

# Filters whose output is at most a constant factor of their input and which take time linear in it.
# Padding (center, indent, wordwrap, format), replacement (replace) and regrouping (batch, slice) are not
# here: their cost depends on an argument, so templates using them render in the child.
BOUNDED_FILTERS = frozenset(
    {
        "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "filesizeformat", "first",
        "float", "forceescape", "groupby", "int", "items", "join", "last", "length", "list", "lower", "map",
        "max", "min", "reject", "rejectattr", "reverse", "round", "safe", "select", "selectattr", "sort",
        "string", "striptags", "title", "tojson", "trim", "truncate", "unique", "upper", "urlencode",
        "wordcount",
    }
)  # fmt: skip
# Methods of payload values (str, dict) that are linear and return a value no larger than a constant
# factor of their owner.
BOUNDED_METHODS = frozenset(
    {
        "capitalize", "endswith", "get", "items", "keys", "lower", "lstrip", "rstrip", "split", "startswith",
        "strip", "title", "upper", "values",
    }
)  # fmt: skip

_STATEMENTS = (
    nodes.Template, nodes.Output, nodes.TemplateData, nodes.If, nodes.For, nodes.Assign, nodes.AssignBlock,
    nodes.With, nodes.FilterBlock, nodes.Scope, nodes.ScopedEvalContextModifier, nodes.EvalContextModifier,
)  # fmt: skip
_EXPRESSIONS = (
    nodes.Name, nodes.Const, nodes.Getattr, nodes.Getitem, nodes.Slice, nodes.CondExpr, nodes.And, nodes.Or,
    nodes.Not, nodes.Neg, nodes.Pos, nodes.Compare, nodes.Operand, nodes.Test, nodes.Concat, nodes.Add,
    nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod, nodes.Keyword, nodes.MarkSafe,
    nodes.MarkSafeIfAutoescape,
)  # fmt: skip
# `map`, `select` and their kin apply a filter or test named by an argument; only these forms are bounded.
_BY_ATTRIBUTE = frozenset({"map"})


def unbounded_reason(tree: nodes.Template) -> str | None:
    """Return why a parsed template is outside the bounded subset, or None when it is inside."""
    for node in tree.find_all(nodes.Node):
        reason = _node_reason(node)
        if reason is not None:
            return f"line {node.lineno}: {reason}"
    return None


def _node_reason(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.For):
        return "a recursive loop" if node.recursive else None
    if isinstance(node, nodes.Call):
        return _call_reason(node)
    if isinstance(node, nodes.Filter):
        return _filter_reason(node)
    if isinstance(node, nodes.List | nodes.Tuple | nodes.Dict | nodes.Pair):
        return _literal_reason(node)
    if isinstance(node, _STATEMENTS + _EXPRESSIONS):
        return None
    return f"'{type(node).__name__}'"


def _call_reason(node: nodes.Call) -> str | None:
    if node.dyn_args is not None or node.dyn_kwargs is not None:
        return "a call with * or ** arguments"
    callee = node.node
    if isinstance(callee, nodes.Getattr) and callee.attr in BOUNDED_METHODS:
        return None
    if isinstance(callee, nodes.Getattr) and callee.attr == "cycle" and _is_name(callee.node, "loop"):
        return None
    if _is_name(callee, "range") and _is_loop_iterable(node):
        return None
    return "a call"


def _filter_reason(node: nodes.Filter) -> str | None:
    if node.name not in BOUNDED_FILTERS:
        return f"the filter '{node.name}'"
    if node.dyn_args is not None or node.dyn_kwargs is not None:
        return "a filter with * or ** arguments"
    if node.name == "tojson" and (node.args or node.kwargs):
        return "'tojson' with an indent"  # the indent repeats on every line of the output
    if node.name in _BY_ATTRIBUTE and (node.args or [kw.key for kw in node.kwargs] != ["attribute"]):
        return f"'{node.name}' other than by attribute"
    if node.name in ("select", "reject", "selectattr", "rejectattr") and not all(
        isinstance(arg, nodes.Const) for arg in node.args
    ):
        return f"'{node.name}' with a test named by a variable"
    return None


def _literal_reason(node: nodes.Node) -> str | None:
    # A literal of literals is bounded by the template's own size; variables in one could alias a big value.
    for child in node.iter_child_nodes():
        if not isinstance(child, nodes.Const | nodes.Pair | nodes.List | nodes.Tuple | nodes.Dict):
            if isinstance(node, nodes.Tuple) and node.ctx == "store":
                return None  # `{% for k, v in ... %}` or `{% set a, b = ... %}`: names, not values
            return "a list, tuple or dict literal holding variables"
    return None


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.name == name


def _is_loop_iterable(call: nodes.Call) -> bool:
    # `{% for i in range(n) %}` never builds the range; its iterations are counted like any loop's.
    # find_all gives no parents, so this is marked while walking (see mark_loop_ranges).
    return getattr(call, "notifier_loop_iterable", False)


def mark_loop_ranges(tree: nodes.Template) -> None:
    """Mark the `range(...)` calls that are a loop's iterable (the only place `range` is bounded)."""
    for loop_node in tree.find_all(nodes.For):
        if isinstance(loop_node.iter, nodes.Call):
            loop_node.iter.notifier_loop_iterable = True  # type: ignore[attr-defined]
