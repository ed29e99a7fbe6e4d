"""A generated corpus of hostile templates: recursion, repetition, formatting, nesting, filters, combinations.

Each core is a way to spend time or memory that the budgets must stop; each wrapper puts a core in another
context (a loop, a macro called twice, a set block, a filter block, a call block). The corpus is every core
in every wrapper, plus the cores that only make sense alone (parser nesting), so new cores or wrappers grow
it multiplicatively. PAYLOAD carries the values the dynamic cores read.
"""

from __future__ import annotations

PAYLOAD = {"a": "z", "n": 100_000, "big": "y" * 99_999, "fmt": "%50000000d", "w": 50_000_000, "items": list(range(200))}

# Recursion that prints nothing: 2**40 calls, never a loop iteration or a printed value to check the clock at.
TREE_BOMB = (
    "{% macro f(n) %}{% if n %}{% set a = f(n-1) %}{% set b = f(n-1) %}{% endif %}{% endmacro %}{% set z = f(40) %}x"
)

CORES: dict[str, str] = {
    # recursion
    "tree_recursion_silent": (
        "{% macro f(n) %}{% if n %}{% set a = f(n-1) %}{% set b = f(n-1) %}{% endif %}{% endmacro %}"
        "{% set z = f(30) %}x"
    ),
    "tree_recursion_3": (
        "{% macro f(n) %}{% if n %}{% set a = f(n-1) %}{% set b = f(n-1) %}{% set c = f(n-1) %}{% endif %}"
        "{% endmacro %}{% set z = f(25) %}x"
    ),
    "deep_recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "mutual_recursion": (
        "{% macro a(n) %}{% set x = b(n) %}{% set y = b(n) %}{% endmacro %}"
        "{% macro b(n) %}{% if n %}{% set x = a(n - 1) %}{% endif %}{% endmacro %}{% set z = a(40) %}x"
    ),
    "recursive_loop": "{% for x in [1, 2] recursive %}{% set y = loop([1, 2]) %}{% endfor %}x",
    "caller_doubling": (
        "{% macro twice() %}{{ caller() }}{{ caller() }}{% endmacro %}"
        + "{% call twice() %}" * 40
        + "x"
        + "{% endcall %}" * 40
    ),
    # repetition
    "percent_repeat": '{{ ("%(a)s" * 16000) % {"a": "y" * 99999} }}',
    "format_repeat": '{{ ("{0}" * 20000).format(big) }}',
    "list_repeat_join": '{{ (["y" * 99999] * 20000)|join }}',
    "list_repeat_tojson": '{{ (["y" * 99999] * 20000)|tojson|length }}',
    "list_repeat_string": '{{ (["y" * 99999] * 20000)|string|length }}',
    "list_repeat_concat": '{{ ((["y" * 99999] * 20000) ~ "")|length }}',
    "payload_list_repeat_print": "{{ [big] * 20000 }}",
    # formatting
    "format_width_payload": "{{ fmt|format(1) }}",
    "format_map_repeat": '{{ ("{a}" * 20000).format_map({"a": big}) }}',
    "format_nested_width": '{{ "{:{w}}".format(1, w=w) }}',
    "percent_dict_repeat": '{{ ("%(b)s%(b)s" * 20000) % {"b": big} }}',
    # nesting
    "nested_ranges": "{% for i in range(n) %}{% for j in range(n) %}{% for k in range(n) %}{% endfor %}"
    "{% endfor %}{% endfor %}x",
    "namespace_doubling": (
        '{% set ns = namespace(s="y") %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}'
        "{{ ns.s|length }}"
    ),
    "namespace_list_doubling": (
        "{% set ns = namespace(l=[big]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"
        "{{ ns.l|tojson|length }}"
    ),
    "dict_nesting": (
        '{% set ns = namespace(d={"a": big}) %}{% for i in range(40) %}{% set ns.d = {"a": ns.d, "b": ns.d} %}'
        "{% endfor %}{{ ns.d|tojson|length }}"
    ),
    # filters
    "center_payload": '{{ "x"|center(w) }}',
    "indent_payload": "{{ big|indent(w) }}",
    "wordwrap_small": "{{ big|wordwrap(1) }}",
    "replace_amplify": '{{ big|replace("y", big) }}',
    "range_list": "{{ range(n * n)|list|length }}",
    "sort_huge": "{{ (range(n)|list * 100)|sort|length }}",
    "batch_fill": "{{ items|batch(w, big)|list|length }}",
    "map_center": '{{ items|map("center", w)|join }}',
    "sum_lists": "{{ ([[big]] * 20000)|sum(start=[])|length }}",
    "pprint_repeat": "{{ ([big] * 20000)|pprint|length }}",
    "urlize_big": "{{ ((big ~ ' ') * 10)|urlize|length }}",
    "power_tower": "{{ ((10 ** 1000) ** 1000) ** 1000 }}",
    "int_product": (
        "{% set ns = namespace(x=2) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x > 1 }}"
    ),
}

WRAPPERS: dict[str, str] = {
    "plain": "{core}",
    "loop": "{{% for i in range(50) %}}{core}{{% endfor %}}",
    "macro_twice": "{{% macro m() %}}{core}{{% endmacro %}}{{{{ m() }}}}{{{{ m() }}}}",
    "set_block": "{{% set s %}}{core}{{% endset %}}{{{{ s|length }}}}",
    "filter_block": "{{% filter upper %}}{core}{{% endfilter %}}",
    "call_block": "{{% macro w() %}}{{{{ caller() }}}}{{% endmacro %}}{{% call w() %}}{core}{{% endcall %}}",
}

# Cores that are hostile to the parser and compiler rather than the renderer.
ALONE: dict[str, str] = {
    "parenthesis_nesting": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "list_nesting": "{{ " + "[" * 5000 + "]" * 5000 + " }}",
    "if_nesting": "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000,
    "many_expressions": "{{ a }}" * 14_000,
}


def corpus() -> dict[str, str]:
    """Return every hostile template by name: each core in each wrapper, and the ones that stand alone."""
    out = {
        f"{core}.{wrapper}": shape.format(core=text)
        for core, text in CORES.items()
        for wrapper, shape in WRAPPERS.items()
    }
    out.update({f"{name}.alone": text for name, text in ALONE.items()})
    return out
