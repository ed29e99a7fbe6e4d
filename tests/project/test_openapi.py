"""The OpenAPI schema documents every operation: its success answer, the send and batch bodies with examples,
the one error body, unique operation ids and a tag per area (docs/api.md, "The schema")."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from core.openapi import AREAS


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Generate the schema as `make test` does: validated, failing on any warning."""
    target = Path(tmp_path_factory.mktemp("openapi")) / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target), stderr=io.StringIO())
    return yaml.safe_load(target.read_text())


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    methods = {"get", "put", "post", "patch", "delete"}
    return [(path, m, op) for path, item in schema["paths"].items() for m, op in item.items() if m in methods]


def test_every_operation_documents_its_success_answer(schema: dict[str, Any]) -> None:
    operations = _operations(schema)
    assert len(operations) >= 45
    for path, method, op in operations:
        success = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert success, f"{method} {path} documents no 2xx answer"
        for code, response in success.items():
            if code == "204":
                continue
            body = response.get("content", {}).get("application/json", {}).get("schema")
            assert body, f"{method} {path} {code} has no response schema"


def test_operation_ids_are_unique_and_every_operation_has_an_area(schema: dict[str, Any]) -> None:
    operations = _operations(schema)
    ids = Counter(op["operationId"] for _, _, op in operations)
    assert [i for i, n in ids.items() if n > 1] == []
    areas = {tag for _, tag in AREAS}
    for path, method, op in operations:
        assert len(op["tags"]) == 1 and op["tags"][0] in areas, f"{method} {path}: {op['tags']}"
    assert {t["name"] for t in schema["tags"]} == {op["tags"][0] for _, _, op in operations}


def test_the_send_and_batch_calls_document_bodies_and_examples(schema: dict[str, Any]) -> None:
    send = schema["paths"]["/api/v1/notifications"]["post"]
    batch = schema["paths"]["/api/v1/notifications/batch"]["post"]
    for op in (send, batch):
        body = op["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] and body["examples"]
    send_body = schema["components"]["schemas"]["NotificationInput"]
    assert {"recipient", "topic", "template", "workflow", "dedup_key", "send_at_local", "strategy"} <= set(
        send_body["properties"]
    )
    assert "required" not in send_body  # a template or a workflow: exactly one, checked by the serializer
    assert set(send["responses"]) >= {"200", "202", "400", "409", "429"}
    accepted = send["responses"]["202"]["content"]["application/json"]
    assert accepted["schema"]["$ref"].endswith("/AcceptOutput") and accepted["examples"]
    items = schema["components"]["schemas"]["BatchInput"]["properties"]["notifications"]
    assert items["items"]["$ref"].endswith("/NotificationInput") and items["maxItems"] == 1000
    answer = batch["responses"]["200"]["content"]["application/json"]
    assert answer["schema"]["$ref"].endswith("/BatchOutput") and answer["examples"]


def test_errors_are_documented_with_the_one_error_body(schema: dict[str, Any]) -> None:
    error = schema["components"]["schemas"]["Error"]
    assert error["properties"]["error"]["$ref"].endswith("/ErrorDetail")
    assert set(schema["components"]["schemas"]["ErrorDetail"]["properties"]) == {"code", "message", "fields"}
    for path, method, op in _operations(schema):
        if not path.startswith("/api/v1/"):
            continue
        assert {"400", "401", "403", "429"} <= set(op["responses"]), f"{method} {path}"
        for code, response in op["responses"].items():
            if code in ("414", "431"):
                # Answered by gunicorn before the app runs, in its own HTML.
                assert set(response["content"]) == {"text/html"}, f"{method} {path} {code}"
            elif code.startswith(("4", "5")):
                content = response["content"]["application/json"]
                assert content["schema"]["$ref"].endswith("/Error"), f"{method} {path} {code}"
    invalid = schema["paths"]["/api/v1/notifications"]["post"]["responses"]["400"]["content"]["application/json"]
    example = next(iter(invalid["examples"].values()))["value"]
    assert set(example["error"]) == {"code", "message", "fields"}


def test_every_operation_documents_the_statuses_it_can_answer(schema: dict[str, Any]) -> None:
    """Bodies are bounded everywhere (413), objects in the path may be missing (404), views add their own."""
    for path, method, op in _operations(schema):
        codes = set(op["responses"])
        if path.startswith(("/api/v1/", "/inbox/v1/", "/callbacks/")):
            assert {"414", "431", "503"} <= codes, f"{method} {path}"
        if method in ("post", "put", "patch"):
            assert "413" in codes, f"{method} {path}"
        if "{" in path and not path.startswith("/callbacks/"):
            assert "404" in codes, f"{method} {path}"
    endpoint = schema["paths"]["/api/v1/event-endpoint"]
    assert "404" in endpoint["get"]["responses"] and "404" not in endpoint["put"]["responses"]
    assert "409" in schema["paths"]["/api/v1/dead-letters/{dead_letter_id}/replay"]["post"]["responses"]
    too_large = schema["paths"]["/callbacks/ses"]["post"]["responses"]["413"]["content"]["application/json"]
    assert next(iter(too_large["examples"].values()))["value"]["error"]["code"] == "payload_too_large"


def test_schema_and_docs_pages_are_served_without_a_key(client: Any) -> None:
    assert client.get("/api/schema/").status_code == 200
    for page in ("/api/docs/", "/api/redoc/"):
        response = client.get(page)
        assert response.status_code == 200
        html = response.content.decode()
        # The UI's scripts come from our own static files, never from a CDN.
        assert "cdn.jsdelivr.net" not in html and "/static/drf_spectacular_sidecar/" in html
