"""Templates render within their budgets by construction: the bounded subset in-process, the rest in children.

A generated corpus of hostile templates (tests/hostile_templates.py) runs against a real gunicorn process:
each is refused at save or rendered/failed within budget, /healthz keeps answering promptly and the API
process's memory stays flat. On a real worker, a hostile template fails its delivery with `template_budget`
while the good deliveries of the same batch are sent.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import psutil
import pytest
from jinja2 import nodes

from notifier.deliveries.models import Delivery
from templates_app import bounded, isolation, rendering
from templates_app.models import Template, TemplateVersion
from templates_app.services import template_put
from tests.batches import make_batch, publish_as_one, webhook_template
from tests.conftest import free_port, wait_for
from tests.hostile_templates import PAYLOAD, TREE_BOMB, corpus
from tests.stubs.webhook import TimedReceiver

BOUNDED = [
    "Hi {{ name }}",
    "{% for i in items %}{{ loop.index }}. {{ i.name|upper ~ ' x' ~ i.qty }}{% endfor %}",
    "{% if total > 10 %}big{% else %}small{% endif %} {{ tags|join(', ') }} {{ note|default('-')|truncate(20) }}",
    "{% for k, v in data|dictsort %}{{ k }}={{ v|tojson }}{% endfor %} {{ name.strip().title() }}",
    "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %} {{ price * qty }} {{ ['a', 'b']|join }}",
    "{% set x = name ~ '!' %}{% filter upper %}{{ x }}{% endfilter %}{{ users|map(attribute='id')|join(',') }}",
]
UNBOUNDED = [
    "{% macro f() %}x{% endmacro %}{{ f() }}",
    "{{ 2 ** 8 }}",
    "{{ '%s'|format(name) }}",
    "{{ [name, name]|join }}",
    "{{ range(5)|list }}",
    "{{ name.format(1) }}",
    "{% for x in items recursive %}{{ loop(x.children) }}{% endfor %}",
    "{{ items|map('center', 9)|join }}",
    "{% set ns = namespace(a=1) %}{{ ns.a }}",
    "{{ name|replace('a', 'b') }}",
    "{{ data|tojson(indent=100000) }}",
]


def _tree(source: str) -> nodes.Template:
    tree = rendering._TEXT_ENV.parse(source)
    bounded.mark_loop_ranges(tree)
    return tree


def test_the_bounded_subset_is_an_allow_list() -> None:
    for source in BOUNDED:
        assert bounded.unbounded_reason(_tree(source)) is None, source
    for source in UNBOUNDED:
        assert bounded.unbounded_reason(_tree(source)) is not None, source


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("{{ a }}" * 6000, "expressions and blocks"),
        ("{{ a }}" * 11_000, "tags"),
        ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nested too deeply"),
    ],
)
def test_templates_too_big_or_too_deep_to_compile_are_refused_at_save(api: Any, source: str, reason: str) -> None:
    response = api.put("/api/v1/templates/huge", _body(source), format="json")
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "template_budget"
    assert "template budget" in error["fields"]["content.en.inapp.body"][0]
    assert reason in error["fields"]["content.en.inapp.body"][0] and error["message"].startswith(
        "content.en.inapp.body"
    )


def _version(body: str, pk: int | None = None) -> TemplateVersion:
    template = Template(key="t", default_locale="en")
    return TemplateVersion(pk=pk, template=template, content={"en": {"inapp": {"title": "t", "body": body}}})


def _render(body: str, payload: dict[str, Any], pk: int | None = None) -> str:
    return str(rendering.render(_version(body, pk), channel="inapp", locale="en", payload=payload).parts["body"])


def test_bounded_templates_render_in_process_and_the_rest_in_a_child_with_the_same_result() -> None:
    before = isolation.POOL.renders
    assert _render("Hi {{ name|upper }}", {"name": "ada"}) == "Hi ADA"
    loops = "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{{ i }}{% endfor %} {{ name.strip().title() }}"
    assert _render(loops, {"name": " ada "}) == "a0b1a2 Ada"
    assert isolation.POOL.renders == before  # no round trip for the bounded subset
    macro = "{% macro greet(n) %}Hi {{ n }}{% endmacro %}{{ greet(name) }} {{ 2 ** 10 }}"
    assert _render(macro, {"name": "ada"}) == "Hi ada 1024"
    assert isolation.POOL.renders == before + 1
    # Bounded by its syntax, but `+` on two lists is not in the subset: it goes to a child at run time.
    assert _render("{{ a + b }}", {"a": [1], "b": [2]}) == "[1, 2]"
    assert isolation.POOL.renders == before + 2
    # A payload beyond the in-process size goes to a child too; the result is the same.
    assert _render("{{ big|length }}", {"big": "y" * 70_000}) == "70000"
    assert isolation.POOL.renders == before + 3


# Hostile templates inside the bounded subset: they stay in this process and a budget stops each of them.
BOUNDED_HOSTILE = [
    "{% for i in range(10000) %}{{ items }}{% endfor %}",
    "{% for a in items %}{% for b in items %}{% for c in items %}{{ a ~ b ~ c }}{% endfor %}{% endfor %}{% endfor %}",
    "{% for i in range(10000) %}{{ s|urlencode|urlencode|urlencode|list|join }}{% endfor %}",
    "{% for i in range(10000) %}{% set t = s ~ s ~ s ~ s %}{{ t ~ t ~ t }}{% endfor %}",
    "{% for i in range(10000) %}{{ items|tojson }}{{ d.items() }}{% endfor %}",
    "{% for i in items %}{% for j in items %}{{ s.split('y')|length }}{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("source", BOUNDED_HOSTILE)
def test_hostile_templates_in_the_bounded_subset_are_stopped_in_process(source: str) -> None:
    assert bounded.unbounded_reason(_tree(source)) is None
    before = isolation.POOL.renders
    payload = {"items": ["y" * 300] * 150, "s": "y%" * 4000, "d": {"k": "v" * 4000}}
    with pytest.raises(rendering.RenderError) as stopped:
        _render(source, payload)
    assert stopped.value.code == "template_budget", stopped.value.message
    assert isolation.POOL.renders == before


def test_errors_from_a_child_keep_their_code_variable_and_path() -> None:
    with pytest.raises(rendering.RenderError) as missing:
        _render("{% macro f() %}{{ nope }}{% endmacro %}{{ f() }}", {})
    assert missing.value.code == "render_error" and missing.value.variable == "nope"
    assert missing.value.path == "inapp.body"
    with pytest.raises(rendering.RenderError) as deep:
        _render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {})
    assert deep.value.code == "template_budget" and "recursion" in deep.value.message


def test_a_batch_renders_in_one_round_trip_and_a_bad_item_fails_alone(settings: Any) -> None:
    settings.TEMPLATE_MAX_RENDER_SECONDS = 0.5
    good = _version("{% macro f(n) %}<{{ n }}>{% endmacro %}{{ f(name) }}", pk=900_001)
    bomb = _version('{{ (["y" * 99999] * 20000)|join }}', pk=900_002)
    slow = _version(TREE_BOMB, pk=900_003)
    requests: list[rendering.RenderRequest] = [
        (good, "inapp", "en", {"name": "a"}),
        (bomb, "inapp", "en", {}),
        (good, "inapp", "en", {"name": "b"}),
        (slow, "inapp", "en", {}),
        (good, "inapp", "en", {"name": "c"}),
    ]
    started = time.monotonic()
    outcomes = rendering.render_many(requests)
    elapsed = time.monotonic() - started
    bodies = [o.rendered.parts["body"] if o.rendered else o.error.code for o in outcomes if o.rendered or o.error]
    assert bodies == ["<a>", "template_budget", "<b>", "template_budget", "<c>"]
    # Two budgets' worth at most, plus a child's start-up or two on a shared machine.
    print(f"batch of 5 with two bombs: {elapsed:.2f} s")
    assert elapsed < 2 * (0.5 + settings.TEMPLATE_RENDER_KILL_GRACE_SECONDS) + 10


def test_a_rendering_that_finds_every_child_busy_is_refused_as_busy_not_over_budget(settings: Any) -> None:
    settings.TEMPLATE_RENDER_PROCESSES = 1
    settings.TEMPLATE_RENDER_WAIT_SECONDS = 0.2
    settings.TEMPLATE_MAX_RENDER_SECONDS = 1.0
    pool = isolation.RenderPool()

    def item(body: str) -> isolation.IsolatedItem:
        content = {"en": {"inapp": {"title": "t", "body": body}}}
        return isolation.IsolatedItem(None, "en", content, "inapp", "en", {})

    try:
        assert "ok" in pool.render([item("{% macro f() %}warm{% endmacro %}{{ f() }}")])[0]
        slow: list[dict[str, Any]] = []
        holder = threading.Thread(target=lambda: slow.extend(pool.render([item(TREE_BOMB)])))
        holder.start()
        time.sleep(0.3)  # the one child is busy with the bomb
        [busy] = pool.render([item("{% macro f() %}x{% endmacro %}{{ f() }}")])
        holder.join(timeout=30)
        assert busy["error"]["code"] == "renderer_busy"
        assert slow[0]["error"]["code"] == "template_budget"
        assert pool.render([item("{% macro f() %}again{% endmacro %}{{ f() }}")])[0]["ok"]["parts"]["body"] == "again"
    finally:
        pool.close()


def _call(base: str, method: str, path: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(), method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _body(text: str) -> dict[str, Any]:
    return {
        "category": "transactional",
        "default_locale": "en",
        "content": {"en": {"inapp": {"title": "t", "body": text}}},
    }


@pytest.mark.django_db(transaction=True)
def test_the_hostile_corpus_against_a_real_api_process(start_process: Any) -> None:
    from core.scopes import SCOPES
    from notifier.clients.services import api_client_create

    _, key = api_client_create(name="corpus", allowed_categories=[], scopes=list(SCOPES))
    seconds, grace = 0.5, 0.25
    port = free_port()
    env = {
        "PORT": str(port), "WEB_WORKERS": "1", "WEB_THREADS": "4", "LOG_LEVEL": "WARNING",
        "TEMPLATE_MAX_RENDER_SECONDS": str(seconds), "TEMPLATE_RENDER_KILL_GRACE_SECONDS": str(grace),
    }  # fmt: skip
    server = start_process("api", ["gunicorn", "-c", "gunicorn.conf.py", "config.wsgi:application"], env)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"{base}/healthz", timeout=1).status == 200
        except OSError:
            return False

    wait_for(up, timeout=60)
    # Warm up: a bounded and an isolated template, so the render children exist before memory is measured.
    assert _call(base, "PUT", "/api/v1/templates/warm", key, _body("{% macro f() %}w{% endmacro %}{{ f() }}"))[0] == 201
    assert _call(base, "POST", "/api/v1/templates/warm/preview", key, {"payload": {}, "locale": "en"})[0] == 200
    # WEB_WORKERS=1: the master's one child is the worker (named as the zygote it was forked from, tests/zygote.py).
    (worker,) = psutil.Process(server.proc.pid).children()
    rss_before = worker.memory_info().rss

    healthz: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.monotonic()
            with urllib.request.urlopen(f"{base}/healthz", timeout=10) as response:
                assert response.status == 200
            healthz.append(time.monotonic() - started)
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    outcomes: dict[str, tuple[str, float]] = {}
    rss_peak = rss_before
    try:
        for i, (name, source) in enumerate(corpus().items()):
            started = time.monotonic()
            status, answer = _call(base, "PUT", f"/api/v1/templates/h{i}", key, _body(source))
            assert status in (200, 201, 400), (name, status, answer)
            if status == 400:
                outcomes[name] = (f"refused at save: {answer['error']['code']}", time.monotonic() - started)
                continue
            started = time.monotonic()
            status, answer = _call(
                base, "POST", f"/api/v1/templates/h{i}/preview", key, {"payload": PAYLOAD, "locale": "en"}
            )
            assert status in (200, 400), (name, status, answer)
            outcome = "rendered" if status == 200 else f"failed: {answer['error']['code']}"
            outcomes[name] = (outcome, time.monotonic() - started)
            rss_peak = max(rss_peak, worker.memory_info().rss)
    finally:
        stop.set()
        prober.join(timeout=15)
    rss_after = worker.memory_info().rss
    children = [p.memory_info().rss for p in worker.children(recursive=True)]

    slowest = max(outcomes.items(), key=lambda item: item[1][1])
    budget_failures = sum(1 for outcome, _ in outcomes.values() if "template_budget" in outcome)
    print(
        f"\ncorpus: {len(outcomes)} hostile templates; {budget_failures} stopped by a budget; "
        f"slowest: {slowest[0]} ({slowest[1][0]}) in {slowest[1][1]:.2f} s\n"
        f"healthz during the corpus: {len(healthz)} probes, median {1000 * statistics.median(healthz):.1f} ms, "
        f"max {1000 * max(healthz):.1f} ms\n"
        f"API worker RSS: {rss_before / 2**20:.0f} MB before, {rss_peak / 2**20:.0f} MB peak, "
        f"{rss_after / 2**20:.0f} MB after; zygote and render children: {[round(c / 2**20) for c in children]} MB"
    )
    assert len(outcomes) >= 200
    assert budget_failures >= len(outcomes) // 2
    # Each request is held at most the time budget plus the kill's grace, plus a fork of a replacement child
    # (milliseconds) and the HTTP round trip; generous for a shared machine.
    assert slowest[1][1] < seconds + grace + 2, slowest
    # /healthz answers promptly while hostile previews run: the API threads only wait on a pipe.
    assert statistics.median(healthz) < 0.1
    assert max(healthz) < 2.0
    assert rss_peak - rss_before < 100 * 2**20
    # The good template still renders after the corpus.
    assert _call(base, "POST", "/api/v1/templates/warm/preview", key, {"payload": {}, "locale": "en"})[0] == 200


@pytest.mark.django_db(transaction=True)
def test_a_hostile_template_fails_its_delivery_while_the_rest_of_its_batch_is_sent(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    webhook_template("good")
    content = {"en": {"webhook": {"body": {"event": TREE_BOMB}}}}
    template_put(key="hostile", category="transactional", default_locale="en", content=content)
    url = f"{receiver.url}/hooks"
    good = make_batch(n=3, address=url, template_key="good")
    bad = make_batch(n=3, address=url, template_key="hostile")  # one notification, three deliveries
    more = make_batch(n=3, address=url, template_key="good")
    batch = [*good, bad[0], *more, *bad[1:]]
    publish_as_one(batch)
    start_worker(queues=["webhook.high"], env={**webhook_env, "WEBHOOK_PROVIDERS": "webhook"}, concurrency=1)

    def settled() -> bool:
        statuses = dict(Delivery.objects.filter(pk__in=batch).values_list("pk", "status"))
        return all(statuses[pk] == "failed" for pk in bad) and all(
            statuses[pk] in ("sent", "delivered") for pk in [*good, *more]
        )

    wait_for(settled, timeout=90)
    for failed in Delivery.objects.filter(pk__in=bad):
        assert failed.reason == "template_budget" and "template budget" in failed.last_error
    assert not Delivery.objects.filter(pk__in=[*good, *more], reason="template_budget").exists()
