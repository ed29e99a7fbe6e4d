"""Budgets of one rendering: output size, loop iterations, time, and the sandbox's amplifying operations.

Templates are written by staff but rendered with callers' payloads on workers and API processes; one template
must never exhaust either. Every `render()` runs under a `Budget` (a context variable, so concurrent renders
in threads do not share one):

- output: each part at most TEMPLATE_MAX_PART_CHARS; everything a rendering produces (printed values, `~`
  concatenation, the static text of every loop iteration) at most TEMPLATE_MAX_RENDER_CHARS, counted as it is
  produced, so a `{% set %}` block or a doubling namespace is stopped before it holds gigabytes;
- loops: TEMPLATE_MAX_LOOP_ITERATIONS iterations over all loops of one rendering (nested loops multiply);
- time: TEMPLATE_MAX_RENDER_SECONDS, checked at every loop iteration, printed value and concatenation;
- operations that amplify their input are checked before they run: padding and format widths
  (`"%50000000d"|format(1)`, `center`, `ljust`, `"{:>99999999}".format`), `replace`, `join`, `indent`,
  `wordwrap`, `batch`, `slice`, `+` on strings and lists, big-integer `*` and `**`.

`static_problems` finds at save time what can be known from the template alone (literal widths, literal
`range` sizes and their nesting), so such a template is refused with a 400 before anyone sends it.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from jinja2 import nodes
from jinja2.filters import FILTERS
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import SecurityError
from jinja2.utils import pass_eval_context

# printf-style specs: "%-50000000d", "%.9999f", "%*d" (a width taken from the arguments).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")
# Numbers in a str.format spec ("{:>50000000}", "{:09999.2f}").
_SPEC_NUMBER = re.compile(r"\d+")
# str methods whose first argument is a width (or a tab size) the result grows with.
WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
MAX_INT_BITS = 100_000


class TemplateBudgetError(SecurityError):
    """A rendering went over one of its budgets (size, iterations, time) or tried an amplifying operation."""


@functools.cache
def limits() -> dict[str, float]:
    """Return the configured budgets (read once; a changed setting, as tests make, clears the cache)."""
    return {
        "part_chars": settings.TEMPLATE_MAX_PART_CHARS,
        "render_chars": settings.TEMPLATE_MAX_RENDER_CHARS,
        "iterations": settings.TEMPLATE_MAX_LOOP_ITERATIONS,
        "seconds": settings.TEMPLATE_MAX_RENDER_SECONDS,
        "width": settings.TEMPLATE_MAX_WIDTH,
    }


@receiver(setting_changed)
def _forget_limits(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("TEMPLATE_MAX_"):
        limits.cache_clear()


@dataclass(slots=True)
class Budget:
    """What one rendering may still spend."""

    deadline: float
    chars_left: int
    iterations_left: int
    part_chars: int
    width: int

    def tick(self) -> None:
        """Raise when the rendering is past its time."""
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(f"rendering took longer than {settings.TEMPLATE_MAX_RENDER_SECONDS} s")

    def spend_chars(self, n: int) -> None:
        """Count `n` produced characters against the rendering's total."""
        self.chars_left -= n
        if self.chars_left < 0:
            raise TemplateBudgetError(f"rendering produced more than {settings.TEMPLATE_MAX_RENDER_CHARS} characters")

    def check_size(self, n: int, what: str = "value") -> None:
        """Refuse a value (string or list) longer than a part may be."""
        if n > self.part_chars:
            raise TemplateBudgetError(f"{what} longer than {self.part_chars} characters")

    def check_width(self, width: Any, what: str) -> None:
        """Refuse a padding or format width above the configured maximum."""
        if isinstance(width, int) and width > self.width:
            raise TemplateBudgetError(f"{what} width {width} is above {self.width}")


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("template_budget", default=None)


def start() -> contextvars.Token[Budget | None]:
    """Give the current rendering a fresh budget; pass the token to `finish`."""
    lim = limits()
    return _CURRENT.set(
        Budget(
            deadline=time.monotonic() + lim["seconds"],
            chars_left=int(lim["render_chars"]),
            iterations_left=int(lim["iterations"]),
            part_chars=int(lim["part_chars"]),
            width=int(lim["width"]),
        )
    )


def finish(token: contextvars.Token[Budget | None]) -> None:
    """Restore the budget that was current before `start`."""
    _CURRENT.reset(token)


def current() -> Budget:
    """Return the budget of the running rendering (a strict default when rendered outside `render`)."""
    budget = _CURRENT.get()
    if budget is None:
        # Called outside render() (a filter used directly): size and width checks still apply, per call.
        token = start()
        budget = _CURRENT.get()
        finish(token)
        assert budget is not None
    return budget


# --- what the compiled templates call --------------------------------------------------------------------


def joined_output(chunks: Iterable[str], path: str) -> str:
    """Join a part's output and refuse it when it is longer than a part may be.

    Joining first is safe: everything a part prints is already bounded by the rendering's character budget
    (printed values and loop text are counted as they are produced), plus the template's own static text.
    """
    budget = current()
    text = "".join(chunks)
    if len(text) > budget.part_chars:
        raise TemplateBudgetError(f"{path} is longer than {budget.part_chars} characters")
    budget.tick()
    return text


def finalize(value: Any) -> Any:
    """Print None as "" and count every printed value against the rendering's budget, as long as it prints.

    A list or dict prints as its text, which can be far longer than the value looks (a list printed in every
    iteration of a loop), so it is turned into that text here, as Jinja would do next, and counted.
    """
    if value is None:
        return ""
    budget = current()
    if isinstance(value, str):
        budget.spend_chars(len(value))
    elif isinstance(value, bool | float):
        budget.spend_chars(16)
    elif isinstance(value, int):
        budget.spend_chars(value.bit_length() * 3 // 10 + 2)  # its decimal digits
    elif not hasattr(value, "__html__"):
        value = str(value)
        budget.spend_chars(len(value))
    else:
        budget.spend_chars(16)
    budget.tick()
    return value


def loop(iterable: Any, static_chars: int = 0) -> Iterator[Any]:
    """Iterate a template loop, counting iterations (and the loop body's static text) against the budget."""
    budget = current()
    for item in iterable:
        budget.iterations_left -= 1
        if budget.iterations_left < 0:
            raise TemplateBudgetError(f"more than {settings.TEMPLATE_MAX_LOOP_ITERATIONS} loop iterations")
        if static_chars:
            budget.spend_chars(static_chars)
        budget.tick()
        yield item


@pass_eval_context
def concat(eval_ctx: Any, items: list[Any]) -> str:
    """`a ~ b`: join the operands exactly as Jinja would, refusing a result longer than a part may be."""
    result = markup_join(items) if eval_ctx.volatile or eval_ctx.autoescape else str_join(items)
    budget = current()
    budget.check_size(len(result), "concatenation")
    budget.spend_chars(len(result))
    return result


# --- guarded operations ----------------------------------------------------------------------------------


def check_percent_format(template: str) -> None:
    """Refuse printf-style widths or precisions above the maximum, and `*` widths taken from the arguments."""
    budget = current()
    for match in _PERCENT_SPEC.finditer(template):
        for number in match.groups():
            if number == "*":
                raise TemplateBudgetError("'*' widths are not allowed in templates")
            if number is not None:
                budget.check_width(int(number), "format")


def check_format_spec(spec: str) -> None:
    """Refuse a str.format spec with a number (width or precision) above the maximum."""
    budget = current()
    for number in _SPEC_NUMBER.findall(spec):
        budget.check_width(int(number), "format")


def check_result(value: Any) -> Any:
    """Refuse a string or list result longer than a part may be; return it otherwise."""
    if isinstance(value, str | list | tuple):
        current().check_size(len(value))
    return value


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse `+`, `*`, `**` and `%` whose result would be too large, before computing it."""
    budget = current()
    if operator == "+":
        if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
            budget.check_size(len(left) + len(right), "concatenation")
    elif operator == "*":
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateBudgetError("integer product too large")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() * abs(right) > MAX_INT_BITS:
            raise TemplateBudgetError("integer power too large")
    elif operator == "%" and isinstance(left, str):
        check_percent_format(left)
    budget.tick()


def check_str_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse calls of str methods that would build a huge string (widths, replace, join)."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if not isinstance(owner, str):
        return
    budget = current()
    if name in WIDTH_METHODS and args:
        budget.check_width(args[0], name)
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
    elif name == "join" and args:
        _check_join(owner, args[0])


def _check_replace(text: Any, old: Any, new: Any, count: Any) -> None:
    text, old, new = str(text), str(old), str(new)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    current().check_size(len(text) + hits * max(len(new) - len(old), 0), "replace result")


def _check_join(separator: str, items: Any) -> None:
    if isinstance(items, list | tuple | range | str):
        n = len(items)
        current().check_size(len(separator) * max(n - 1, 0), "join result")


def _guard(original: Callable[..., Any], check: Callable[..., None]) -> Callable[..., Any]:
    """Wrap a Jinja filter: run `check` on its arguments first and `check_result` on what it returns.

    The wrapper passes on whatever the filter asks Jinja for first (environment, eval or template context).
    """
    pass_arg = getattr(original, "jinja_pass_arg", None)
    if pass_arg is None:

        def guarded(value: Any, *args: Any, **kwargs: Any) -> Any:
            check(value, *args, **kwargs)
            return check_result(original(value, *args, **kwargs))

        return guarded

    def guarded_passing(first: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        check(value, *args, **kwargs)
        return check_result(original(first, value, *args, **kwargs))

    # Jinja reads this marker (set by its pass_* decorators) off the function object.
    guarded_passing.jinja_pass_arg = pass_arg  # type: ignore[attr-defined]
    return guarded_passing


def _width_arg(name: str) -> Callable[..., None]:
    def check(value: Any, width: Any = 80, *args: Any, **kwargs: Any) -> None:
        current().check_width(len(width) if isinstance(width, str) else width, name)

    return check


def _check_indent(value: Any, width: Any = 4, *args: Any, **kwargs: Any) -> None:
    budget = current()
    w = len(width) if isinstance(width, str) else width
    budget.check_width(w, "indent")
    text = str(value)
    if isinstance(w, int):
        budget.check_size(len(text) + (text.count("\n") + 1) * w, "indent result")


def _check_wordwrap(value: Any, width: Any = 79, *args: Any, **kwargs: Any) -> None:
    wrap = kwargs.get("wrapstring", args[1] if len(args) > 1 else None) or "\n"
    text = str(value)
    lines = len(text) // max(int(width), 1) + 1 if isinstance(width, int) else len(text) + 1
    current().check_size(len(text) + lines * len(str(wrap)), "wordwrap result")


def _check_format(value: Any, *args: Any, **kwargs: Any) -> None:
    check_percent_format(str(value))


def _check_replace_filter(value: Any, old: Any = "", new: Any = "", count: Any = None) -> None:
    _check_replace(value, old, new, -1 if count is None else count)


def _check_join_filter(value: Any, d: Any = "", attribute: Any = None) -> None:
    _check_join(str(d), value)


def _check_count(name: str) -> Callable[..., None]:
    def check(value: Any, *args: Any, **kwargs: Any) -> None:
        count = args[0] if args else kwargs.get("linecount" if name == "batch" else "slices")
        if isinstance(count, int) and count > current().part_chars:
            raise TemplateBudgetError(f"{name} count {count} too large")
        if isinstance(count, int) and count < 1:
            raise TemplateBudgetError(f"{name} count must be positive")

    return check


def _no_check(value: Any, *args: Any, **kwargs: Any) -> None:
    return None


def guarded_filters() -> dict[str, Callable[..., Any]]:
    """Return Jinja's filters with the amplifying ones guarded and every string result size-checked."""
    checks: dict[str, Callable[..., None]] = {
        "center": _width_arg("center"),
        "indent": _check_indent,
        "wordwrap": _check_wordwrap,
        "format": _check_format,
        "replace": _check_replace_filter,
        "join": _check_join_filter,
        "batch": _check_count("batch"),
        "slice": _check_count("slice"),
        "truncate": _no_check,
    }
    filters = dict(FILTERS)
    for name, check in checks.items():
        filters[name] = _guard(FILTERS[name], check)
    filters["_budget_loop"] = loop
    filters["_budget_concat"] = concat
    return filters


def ticked_filters(filters: dict[str, Callable[..., Any]], names: Iterable[str]) -> dict[str, Callable[..., Any]]:
    """Return `filters` with each named one checking the clock and its result's size after it runs.

    The bounded environment (templates_app.bounded) has only these filters, so a chain of them is capped at
    every step, and the clock is read between any two of them.
    """
    out = dict(filters)
    for name in names:
        out[name] = _guard(filters[name], _tick_check)
    return out


def _tick_check(value: Any, *args: Any, **kwargs: Any) -> None:
    current().tick()


# --- compile time ----------------------------------------------------------------------------------------


def _static_chars(body: list[nodes.Node]) -> int:
    """Return the length of the static text directly in a loop body (printed on every iteration)."""
    total = 0
    for node in body:
        for data in node.find_all(nodes.TemplateData):
            total += len(data.data)
        if isinstance(node, nodes.TemplateData):
            total += len(node.data)
    return total


def instrument(tree: nodes.Template) -> None:
    """Rewrite a parsed template so its loops and `~` concatenations run through the budget."""
    for loop_node in tree.find_all(nodes.For):
        static = _static_chars(loop_node.body)
        loop_node.iter = nodes.Filter(
            loop_node.iter, "_budget_loop", [nodes.Const(static)], [], None, None, lineno=loop_node.lineno
        )
    for concat_node in tree.find_all(nodes.Concat):
        concat_node.nodes = [
            nodes.Filter(nodes.List(concat_node.nodes), "_budget_concat", [], [], None, None, lineno=concat_node.lineno)
        ]


def _const_int(node: nodes.Node) -> int | None:
    return node.value if isinstance(node, nodes.Const) and isinstance(node.value, int) else None


def _range_size(node: nodes.Node) -> int | None:
    """Return the size of `range(<literals>)`, or None when it is not one."""
    if not (isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name == "range"):
        return None
    values = [_const_int(arg) for arg in node.args]
    if not values or any(v is None for v in values) or len(values) > 3 or (len(values) == 3 and values[2] == 0):
        return None
    return len(range(*values))  # type: ignore[arg-type]  # None ruled out above; any() does not narrow items


def _loop_problems(node: nodes.Node, outer: int, limit: int, found: list[str]) -> None:
    for child in node.iter_child_nodes():
        if isinstance(child, nodes.For):
            size = _range_size(child.iter)
            total = outer * (size if size is not None else 1)
            if size is not None and total > limit:
                found.append(f"line {child.lineno}: loops of {total} iterations (at most {limit})")
                continue
            _loop_problems(child, total, limit, found)
        else:
            _loop_problems(child, outer, limit, found)


def static_problems(tree: nodes.Template) -> list[str]:
    """Return what breaks a budget in a parsed template whatever the payload (literal widths and loop sizes)."""
    lim = limits()
    width, found = int(lim["width"]), []
    for node in tree.find_all((nodes.Filter, nodes.Call, nodes.Mod)):
        if isinstance(node, nodes.Filter) and node.node is not None:
            first = _const_int(node.args[0]) if node.args else None
            if node.name in ("center", "indent") and first is not None and first > width:
                found.append(f"line {node.lineno}: {node.name} width {first} is above {width}")
            if node.name == "format" and isinstance(node.node, nodes.Const) and isinstance(node.node.value, str):
                found += _spec_problems(node.node.value, width, node.lineno, percent=True)
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            first = _const_int(node.args[0]) if node.args else None
            target = node.node.node
            if node.node.attr in WIDTH_METHODS and first is not None and first > width:
                found.append(f"line {node.lineno}: {node.node.attr} width {first} is above {width}")
            if node.node.attr == "format" and isinstance(target, nodes.Const) and isinstance(target.value, str):
                found += _spec_problems(target.value, width, node.lineno, percent=False)
        elif isinstance(node, nodes.Mod) and isinstance(node.left, nodes.Const) and isinstance(node.left.value, str):
            found += _spec_problems(node.left.value, width, node.lineno, percent=True)
    _loop_problems(tree, 1, int(lim["iterations"]), found)
    # Compiling costs time and memory in the saving process (a 100 kB template of 14,000 expressions took
    # over a second and 140 MB): the number of nodes bounds both.
    count = sum(1 for _ in tree.find_all(nodes.Node))
    max_nodes = int(settings.TEMPLATE_MAX_NODES)
    if count > max_nodes:
        found.append(f"{count} expressions and blocks (at most {max_nodes})")
    return found


def _spec_problems(template: str, width: int, lineno: int, *, percent: bool) -> list[str]:
    numbers: list[str] = []
    if percent:
        for match in _PERCENT_SPEC.finditer(template):
            numbers += [n for n in match.groups() if n]
    else:
        for spec in re.findall(r"\{[^{}]*:([^{}]*)\}", template):
            numbers += _SPEC_NUMBER.findall(spec)
    if "*" in numbers:
        return [f"line {lineno}: '*' widths are not allowed"]
    too_big = [int(n) for n in numbers if int(n) > width]
    return [f"line {lineno}: format width {too_big[0]} is above {width}"] if too_big else []
