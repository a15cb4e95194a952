"""JSON Schema checks for schema-bound generation: the schema before any request, the output after.

No check ever touches the network: every ``$ref`` must resolve inside the schema itself (a
local ``#...`` pointer or an ``$id`` the schema declares); anything else is refused, not
fetched. A depth limit stops pathological schemas before they reach jsonschema (outputs: see
`typevet_async._core.generation`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError as JsonSchemaError
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from typevet_async._core.jsonvalues import json_depth
from typevet_async._errors import OutputValidationError, SchemaError

__all__ = ["MAX_SCHEMA_DEPTH", "check_schema", "validate_output"]

MAX_SCHEMA_DEPTH = 64


def _refuse_retrieval(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs class, untyped init


#: A registry that knows no documents and refuses to fetch any.
_OFFLINE = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


def _refs(schema: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    stack: list[tuple[Any, str]] = [(schema, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if key in ("$ref", "$dynamicRef") and isinstance(child, str):
                    yield child, f"{where}.{key}"
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{n}]") for n, child in enumerate(item))


def _declared_ids(schema: Any) -> set[str]:
    ids: set[str] = set()
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("$id"), str):
                ids.add(item["$id"].rstrip("#"))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return ids


def check_schema(schema: Any) -> Draft202012Validator:
    """A validator for ``schema``, once it passes the Draft 2020-12 meta-schema and our limits.

    :raises SchemaError: not an object or boolean, too deep, malformed, or a ``$ref`` that
        would need a document from outside the schema.
    """
    if not isinstance(schema, dict | bool):
        raise SchemaError(f"a schema must be a JSON object or boolean, got {type(schema).__name__}")
    depth = json_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"schema nesting depth {depth} exceeds the limit of {MAX_SCHEMA_DEPTH}")
    local = _declared_ids(schema)
    for ref, where in _refs(schema):
        base = ref.split("#", 1)[0]
        if base and base.rstrip("#") not in local:
            raise SchemaError(
                f"$ref {ref!r} points outside the schema; remote references are refused, "
                "never fetched",
                path=where,
            )
    try:
        Draft202012Validator.check_schema(schema)
    except JsonSchemaError as error:
        raise SchemaError(
            f"the schema does not pass the Draft 2020-12 meta-schema: {error.message}",
            path=error.json_path,
        ) from None
    # ``format`` is asserted, not only annotated: callers who write "format": "ipv4" expect it
    # (formats whose checker needs a package that is not installed are skipped by jsonschema).
    return Draft202012Validator(
        schema, registry=_OFFLINE, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def validate_output(validator: Draft202012Validator, value: Any, raw: str) -> None:
    """:raises OutputValidationError: with the first failing path, when ``value`` does not pass.

    ``value`` comes from `typevet_async._core.generation.interpret_output`, which has already
    refused values nested deeper than `MAX_JSON_DEPTH`.
    """
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        raise OutputValidationError(
            f"output does not pass the schema at {first.json_path}: {first.message}",
            raw=raw,
            value=value,
            path=first.json_path,
        )
