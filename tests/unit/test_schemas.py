from __future__ import annotations

from typing import Any

import pytest

import typevet_async as tv
from typevet_async._core.jsonvalues import json_depth
from typevet_async._core.schemas import MAX_SCHEMA_DEPTH, check_schema, validate_output


@pytest.mark.parametrize(
    ("schema", "message", "path"),
    [
        ({"type": "nope"}, "meta-schema", "$.type"),
        ({"properties": {"a": {"minimum": "x"}}}, "meta-schema", "$.properties.a.minimum"),
        ({"$ref": "https://example.com/s.json"}, "never fetched", "$.$ref"),
        ({"items": {"$ref": "other.json#/x"}}, "never fetched", "$.items.$ref"),
        ([1, 2], "JSON object or boolean", "$"),
    ],
)
def test_bad_schemas(schema: Any, message: str, path: str) -> None:
    with pytest.raises(tv.SchemaError, match=message) as caught:
        check_schema(schema)
    assert caught.value.path == path
    assert isinstance(caught.value, ValueError)


def test_too_deep_schema() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):
        schema = {"type": "array", "items": schema}
    with pytest.raises(tv.SchemaError, match="depth"):
        check_schema(schema)


def test_local_refs_and_declared_ids_resolve_offline() -> None:
    validator = check_schema({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"})
    validate_output(validator, "text", '"text"')
    with pytest.raises(tv.OutputValidationError):
        validate_output(validator, 3, "3")
    check_schema({"$id": "urn:example:root", "$ref": "urn:example:root#/$defs/a",
                  "$defs": {"a": {"type": "integer"}}})  # fmt: skip


def test_output_validation_names_the_path() -> None:
    validator = check_schema(
        {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}
    )
    with pytest.raises(tv.OutputValidationError) as caught:
        validate_output(validator, {"items": [1, "two"]}, '{"items": [1, "two"]}')
    assert caught.value.path == "$.items[1]"
    assert caught.value.raw == '{"items": [1, "two"]}'


def test_json_depth() -> None:
    assert json_depth(1) == 0
    assert json_depth({"a": [1, {"b": []}]}) == 3
