"""Rendering of template versions: channels, escaping, missing variables, the sandbox, locales, the cache."""

from __future__ import annotations

from typing import Any

import pytest

from templates_app import rendering
from templates_app.rendering import RenderError, render
from templates_app.selectors import TemplateNotFound, template_version_resolve
from templates_app.services import template_put

CONTENT: dict[str, Any] = {
    "en": {
        "email": {
            "subject": "Order {{ order_id }} shipped",
            "text": "Hi {{ name }}, order {{ order_id }} is on its way.",
            "html": "<p>Hi {{ name }}, order <b>{{ order_id }}</b> is on its way.</p>",
        },
        "push": {
            "title": "Shipped",
            "body": "Order {{ order_id }} is on its way",
            "data": {"order": "{{ order_id }}", "kind": "shipped"},
        },
        "sms": {"text": "Order {{ order_id }} shipped"},
        "inapp": {"title": "Shipped", "body": "Order {{ order_id }} for {{ name }}"},
        "webhook": {
            "body": {
                "event": "order.shipped",
                "order": "{{ order_id }}",
                "items": ["{{ name }}", 3, {"nested": "<{{ name }}>"}],
                "flag": True,
            }
        },
    },
    "pt": {
        "email": {"subject": "Pedido {{ order_id }} enviado", "text": "Olá {{ name }}"},
        "sms": {"text": "Pedido {{ order_id }} enviado"},
    },
    "pt-BR": {"sms": {"text": "Seu pedido {{ order_id }} foi enviado"}},
}
PAYLOAD = {"order_id": "A-1001", "name": "Ann <script>alert(1)</script> & Co"}


def _put_sms(key: str, text: str) -> Any:
    """Create and publish a template with only an English SMS text."""
    return template_put(key=key, category="transactional", default_locale="en", content={"en": {"sms": {"text": text}}})


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    rendering.cache_clear()


@pytest.fixture
def version(db: None) -> Any:
    return template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)


@pytest.mark.django_db
def test_render_every_channel(version: Any) -> None:
    email = render(version, channel="email", locale="en", payload=PAYLOAD)
    assert email.locale == "en"
    assert email.parts["subject"] == "Order A-1001 shipped"
    assert email.parts["text"] == "Hi Ann <script>alert(1)</script> & Co, order A-1001 is on its way."

    push = render(version, channel="push", locale="en", payload=PAYLOAD).parts
    assert push == {
        "title": "Shipped",
        "body": "Order A-1001 is on its way",
        "data": {"order": "A-1001", "kind": "shipped"},
    }
    assert render(version, channel="sms", locale="en", payload=PAYLOAD).parts == {"text": "Order A-1001 shipped"}
    assert render(version, channel="inapp", locale="en", payload=PAYLOAD).parts == {
        "title": "Shipped",
        "body": f"Order A-1001 for {PAYLOAD['name']}",
        "url": "",  # the optional action URL, absent from this template
    }
    webhook = render(version, channel="webhook", locale="en", payload=PAYLOAD).parts
    assert webhook == {
        "body": {
            "event": "order.shipped",
            "order": "A-1001",
            "items": [PAYLOAD["name"], 3, {"nested": f"<{PAYLOAD['name']}>"}],
            "flag": True,
        }
    }


@pytest.mark.django_db
def test_autoescape_only_in_email_html(version: Any) -> None:
    email = render(version, channel="email", locale="en", payload=PAYLOAD).parts
    assert "<script>" not in email["html"]
    assert "Ann &lt;script&gt;alert(1)&lt;/script&gt; &amp; Co" in email["html"]
    # The author's own markup is kept.
    assert email["html"].startswith("<p>Hi ") and "<b>A-1001</b>" in email["html"]
    assert "<script>" in email["text"] and "<script>" in email["subject"] + email["text"]
    assert (
        "<script>"
        in render(version, channel="sms", locale="en", payload={**PAYLOAD, "order_id": "<script>"}).parts["text"]
    )


@pytest.mark.django_db
def test_missing_variable_names_it(version: Any) -> None:
    with pytest.raises(RenderError) as info:
        render(version, channel="email", locale="en", payload={"order_id": "A-1"})
    assert info.value.variable == "name"
    assert "'name'" in str(info.value)
    assert "email.text" in str(info.value)


@pytest.mark.django_db
def test_missing_nested_attribute_is_render_error(db: None) -> None:
    v = _put_sms("nested", "{{ user.city }}")
    assert render(v, channel="sms", locale="en", payload={"user": {"city": "Oslo"}}).parts["text"] == "Oslo"
    with pytest.raises(RenderError, match="city"):
        render(v, channel="sms", locale="en", payload={"user": {}})


@pytest.mark.django_db
def test_channel_the_version_lacks(version: Any) -> None:
    v = _put_sms("only_sms", "x")
    with pytest.raises(RenderError, match="email"):
        render(v, channel="email", locale="en", payload={})
    with pytest.raises(RenderError, match="carrier-pigeon"):
        render(v, channel="carrier-pigeon", locale="en", payload={})


def _version_with(text: str) -> Any:
    """Build an unsaved version (bypassing template_put's validation) to test what rendering itself refuses."""
    from templates_app.models import Template, TemplateVersion

    template = Template(key="raw", category="transactional", default_locale="en")
    return TemplateVersion(template=template, version=1, content={"en": {"sms": {"text": text}}})


@pytest.mark.pure
@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ ''['__cla' ~ 'ss__'] }}",
        "{{ (''|attr('__class__')).__mro__ }}",
        "{% include '/etc/passwd' %}",
        "{% import '/etc/passwd' as p %}",
        "{% extends '/etc/passwd' %}",
        "{% from '/etc/passwd' import x %}",
        "{{ payload.update({'a': 1}) }}",
        "{{ 'a' * 1000000000 }}",
        "{{ 10 ** 100000000 }}",
        "{{ range(100000000) | list }}",
        "{{ x.__class__ }}",
        "{% for %}",
    ],
)
def test_sandbox_escapes_fail_and_leak_nothing(source: str) -> None:
    with pytest.raises(RenderError) as info:
        render(_version_with(source), channel="sms", locale="en", payload={"x": "s", "payload": {}})
    message = str(info.value)
    for leak in ("root:", "<class", "object at 0x", "module", "built-in", "Traceback", "/usr/", "site-packages"):
        assert leak not in message
    assert message.startswith("sms.text")


@pytest.mark.django_db
def test_sandbox_escape_rejected_at_put(db: None) -> None:
    from rest_framework.exceptions import ValidationError

    for source in ("{{ ''.__class__ }}", "{% include '/etc/passwd' %}", "{{ x"):
        with pytest.raises(ValidationError) as info:
            template_put(
                key="evil", category="transactional", default_locale="en", content={"en": {"sms": {"text": source}}}
            )
        assert "content.en.sms.text" in info.value.detail


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("requested", "channel", "expected_locale", "expected_text"),
    [
        ("pt-BR", "sms", "pt-BR", "Seu pedido A-1 foi enviado"),
        ("pt_br", "sms", "pt-BR", "Seu pedido A-1 foi enviado"),
        ("PT-br", "sms", "pt-BR", "Seu pedido A-1 foi enviado"),
        ("pt-PT", "sms", "pt", "Pedido A-1 enviado"),
        ("pt", "sms", "pt", "Pedido A-1 enviado"),
        ("de-DE", "sms", "en", "Order A-1 shipped"),
        ("", "sms", "en", "Order A-1 shipped"),
        # pt-BR has no email: pt's email; nor push anywhere but the default locale.
        ("pt-BR", "email", "pt", None),
        ("pt-BR", "push", "en", None),
    ],
)
def test_locale_fallback(version: Any, requested: str, channel: str, expected_locale: str, expected_text: Any) -> None:
    result = render(version, channel=channel, locale=requested, payload={"order_id": "A-1", "name": "N"})
    assert result.locale == expected_locale
    if expected_text is not None:
        assert result.parts["text"] == expected_text


@pytest.mark.django_db
def test_locale_email_without_html_renders_empty_html(version: Any) -> None:
    parts = render(version, channel="email", locale="pt", payload={"order_id": "A-1", "name": "N"}).parts
    assert parts == {"subject": "Pedido A-1 enviado", "text": "Olá N", "html": ""}


@pytest.mark.django_db
def test_cache_picks_up_newly_published_version(version: Any) -> None:
    resolved = template_version_resolve("order_shipped")
    assert render(resolved, channel="sms", locale="en", payload=PAYLOAD).parts["text"] == "Order A-1001 shipped"
    misses = rendering.cache_info()["part_misses"]
    # Rendered again from the cache: no compile.
    assert render(template_version_resolve("order_shipped"), channel="sms", locale="en", payload=PAYLOAD)
    assert rendering.cache_info()["part_misses"] == misses

    template_put(
        key="order_shipped",
        category="transactional",
        default_locale="en",
        content={"en": {"sms": {"text": "v2: {{ order_id }}"}}},
    )
    latest = template_version_resolve("order_shipped")
    assert latest.version == 2
    assert render(latest, channel="sms", locale="en", payload=PAYLOAD).parts["text"] == "v2: A-1001"
    # The pinned old version still renders its own content.
    old = template_version_resolve("order_shipped@1")
    assert render(old, channel="sms", locale="en", payload=PAYLOAD).parts["text"] == "Order A-1001 shipped"


@pytest.mark.pure
def test_cache_is_bounded() -> None:
    cache = rendering._LRU(3)
    for i in range(10):

        def double(n: int = i) -> int:
            return n * 2

        cache.get_or_create(i, double)
    assert len(cache) == 3
    assert cache.get_or_create(9, lambda: "new") == 18
    assert cache.get_or_create(0, lambda: "new") == "new"


@pytest.mark.django_db
def test_none_renders_empty_and_defaults_work(db: None) -> None:
    v = template_put(
        key="opt",
        category="transactional",
        default_locale="en",
        content={"en": {"sms": {"text": "[{{ a }}][{{ b | default('none') }}]{% if c is defined %}c{% endif %}"}}},
    )
    assert render(v, channel="sms", locale="en", payload={"a": None}).parts["text"] == "[][none]"


@pytest.mark.django_db
def test_resolve(version: Any) -> None:
    assert template_version_resolve("order_shipped").pk == version.pk
    assert template_version_resolve("order_shipped@1").pk == version.pk
    draft = template_put(
        key="order_shipped", category="transactional", default_locale="en", content=CONTENT, publish=False
    )
    assert draft.version == 2
    assert template_version_resolve("order_shipped").pk == version.pk
    for spec, needle in (
        ("nope", "unknown template"),
        ("order_shipped@2", "draft"),
        ("order_shipped@9", "no version 9"),
        ("order_shipped@x", "positive integer"),
        ("nope@1", "unknown template"),
    ):
        with pytest.raises(TemplateNotFound, match=needle):
            template_version_resolve(spec)
    template_put(key="drafty", category="social", default_locale="en", content=CONTENT, publish=False)
    with pytest.raises(TemplateNotFound, match="no published version"):
        template_version_resolve("drafty")


@pytest.mark.pure
def test_environment_has_no_loader_even_without_the_compile_check() -> None:
    # Defence in depth: were the AST check bypassed, the sandbox has no loader to read a file with.
    template = rendering._TEXT_ENV.from_string("{% include '/etc/passwd' %}")
    with pytest.raises(TypeError, match="no loader"):
        template.render()
