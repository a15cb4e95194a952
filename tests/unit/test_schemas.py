from __future__ import annotations

import math
from typing import Any

import pytest

import typevet_async as tv
from typevet_async._core.generation.records import interpret_output
from typevet_async._core.generation.schemas import MAX_SCHEMA_DEPTH, check_schema, validate_output
from typevet_async._core.wires.jsonvalues import MAX_JSON_DEPTH, json_depth


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


# -- issue 13: references that never resolve or never end; values JSON cannot carry ---------


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"$ref": "#"}, "$.$ref"),
        ({"$ref": "#", "properties": {"a": {}}}, "$.$ref"),  # the ref applies in place too
        ({"allOf": [{"$ref": "#"}]}, "$.allOf[0]"),
        ({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, "$.anyOf[1]"),
        ({"not": {"$ref": "#"}}, "$.not"),
        ({"if": {"$ref": "#"}, "then": {}}, "$.if"),
        ({"dependentSchemas": {"a": {"$ref": "#"}}}, "$.dependentSchemas.a"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
             "$ref": "#/$defs/a"},
            "$.$defs.a.$ref",
        ),
        (  # unreachable from the root, and still a schema that can never check anything
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"oneOf": [{"$ref": "#/$defs/a"}]}}},
            "$.$defs.b.oneOf[0]",
        ),
        ({"$dynamicAnchor": "m", "allOf": [{"$dynamicRef": "#m"}]}, "$.allOf[0]"),
        ({"x-note": {"$ref": "#"}, "$ref": "#/x-note"}, "$.$ref"),
        (
            {"$defs": {"a": {"$id": "http://example.com/a", "$ref": "#"}},
             "$ref": "http://example.com/a"},
            "$.$defs.a.$ref",
        ),
    ],
)  # fmt: skip
def test_a_reference_cycle_with_no_structure_in_between_is_refused(schema: Any, path: str) -> None:
    with pytest.raises(tv.SchemaError, match="refers to itself with no structure in between"):
        check_schema(schema)
    with pytest.raises(tv.SchemaError) as caught:
        check_schema(schema)
    assert caught.value.path == path


@pytest.mark.parametrize(
    ("schema", "message", "path"),
    [
        ({"$ref": "#/$defs/nope"}, r"\$ref '#/\$defs/nope' points to nothing", "$.$ref"),
        (
            {"properties": {"a": {"items": {"$ref": "#/$defs/nope"}}}},
            "points to nothing",
            "$.properties.a.items.$ref",
        ),
        ({"$ref": "#nope"}, "points to nothing", "$.$ref"),
        ({"$ref": "#/required", "required": ["a"]}, "points to a list, not a schema", "$.$ref"),
        ({"$dynamicRef": "#/$defs/gone"}, r"\$dynamicRef .* points to nothing", "$.$dynamicRef"),
    ],
)
def test_a_dangling_local_reference_is_refused(schema: Any, message: str, path: str) -> None:
    with pytest.raises(tv.SchemaError, match=message) as caught:
        check_schema(schema)
    assert caught.value.path == path


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
        {
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node",
        },
        {"additionalProperties": {"$ref": "#"}},
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]},
        {
            "$defs": {"s": {"type": "string"},
                      "a": {"$ref": "#/$defs/s"}, "b": {"$ref": "#/$defs/s"}},
            "anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        },  # two paths to one schema: a diamond, not a cycle
        {"$dynamicAnchor": "m", "type": "object", "properties": {"c": {"$dynamicRef": "#m"}}},
        {"$defs": {"t": True}, "$ref": "#/$defs/t"},
        {"const": {"$ref": "#/nowhere"}},  # data, not a reference
    ],
)  # fmt: skip
def test_well_founded_recursion_and_shared_definitions_are_accepted(schema: Any) -> None:
    check_schema(schema)


def test_a_recursive_schema_still_validates_a_deep_tree() -> None:
    validator = check_schema(
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]}
    )
    value: Any = 1
    for _ in range(MAX_JSON_DEPTH):
        value = [value]
    validate_output(validator, value, "raw")
    with pytest.raises(tv.OutputValidationError):
        validate_output(validator, [["x"]], "raw")


@pytest.mark.parametrize(
    ("schema", "message", "path"),
    [
        ({"maximum": math.nan}, r"the schema at \$\.maximum is nan", "$.maximum"),
        ({"enum": [1, math.inf]}, r"the schema at \$\.enum\[1\] is inf", "$.enum[1]"),
        ({"maximum": 10**30}, "integer beyond 64 bits, which cannot be sent", "$.maximum"),
        ({"pattern": "a\ud800"}, "has a lone surrogate", "$.pattern"),
        ({"properties": {"a\udcff": {}}}, "a key of the schema at", "$.properties"),
    ],
)
def test_a_schema_json_cannot_carry_exactly_is_refused(
    schema: Any, message: str, path: str
) -> None:
    with pytest.raises(tv.SchemaError, match=message) as caught:
        check_schema(schema)
    assert caught.value.path == path


def test_a_validation_that_exhausts_the_stack_is_a_typed_error() -> None:
    # A chain of 400 in-place references, each visited once per level: no cycle, but deep
    # enough that checking a nested value could exhaust Python's stack.
    defs = {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(400)}
    defs["d400"] = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]}
    validator = check_schema({"$defs": defs, "$ref": "#/$defs/d0"})
    value: Any = 1
    for _ in range(MAX_JSON_DEPTH):
        value = [value]
    with pytest.raises(tv.GenerationError, match="could not be checked against the schema"):
        validate_output(validator, value, "raw")


# -- generated integers beyond 64 bits -------------------------------------------------------

INTEGER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"n": 12345678901234567890123}', 12345678901234567890123),
        ('{"n": -9223372036854775809}', -9223372036854775809),  # one below int64
        ('{"n": 18446744073709551616}', 18446744073709551616),  # one above uint64
        ('{"n": 18446744073709551615}', 18446744073709551615),  # orjson's own range
        ('{"n": 7}', 7),
    ],
)
def test_generated_integers_of_any_size_stay_exact_integers(text: str, value: int) -> None:
    generation = interpret_output(tv.ChatOutput(text, "stop"), check_schema(INTEGER))
    assert generation.value == {"n": value}
    assert type(generation.value["n"]) is int


def test_a_big_generated_integer_is_still_checked_by_the_schema() -> None:
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10**18}}}
    with pytest.raises(tv.OutputValidationError, match="is greater than the maximum") as caught:
        interpret_output(
            tv.ChatOutput('{"n": 12345678901234567890123}', "stop"), check_schema(bounded)
        )
    assert caught.value.value == {"n": 12345678901234567890123}


def test_long_digit_runs_elsewhere_parse_as_before() -> None:
    text = '{"s": "12345678901234567890123", "f": 0.12345678901234567890123, "n": [1, 2.5]}'
    generation = interpret_output(tv.ChatOutput(text, "stop"), check_schema(True))
    assert generation.value == {
        "s": "12345678901234567890123",
        "f": 0.12345678901234568,
        "n": [1, 2.5],
    }
    for refused in ("NaN", '{"n": Infinity}', '{"n": 1e400}'):
        with pytest.raises(tv.GenerationError, match="not valid JSON"):
            interpret_output(tv.ChatOutput(refused, "stop"), check_schema(True))
