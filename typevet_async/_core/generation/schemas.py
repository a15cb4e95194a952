"""JSON Schema checks for schema-bound generation: the schema before any request, the output after.

No check ever touches the network: every ``$ref`` must resolve inside the schema itself (a
local ``#...`` pointer or an ``$id`` the schema declares); anything else is refused, not
fetched. A depth limit stops pathological schemas before they reach jsonschema (outputs: see
`typevet_async._core.generation.records`).

Before any request the schema's references are followed too (`_check_references`): a ``$ref``
that points to nothing, and a reference cycle with no structure in between, are refused. A
cycle is "in place" when every step of it applies to the same instance: ``$ref``,
``$dynamicRef``, ``allOf``/``anyOf``/``oneOf``, ``not``, ``if``/``then``/``else``,
``dependentSchemas``. Validating against it would recurse forever (``{"$ref": "#"}``,
``{"allOf": [{"$ref": "#"}]}``, two ``$defs`` that refer to each other), so it can never check
anything. A recursive schema that steps into the instance between two visits (a tree: ``$ref``
under ``properties``, ``items``, ``additionalProperties``...) is well-founded, since every
visit is one level deeper into a finite value, and is accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError as JsonSchemaError
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from typevet_async._core.wires.jsonvalues import check_json_value, json_depth
from typevet_async._errors import GenerationError, OutputValidationError, SchemaError

if TYPE_CHECKING:
    from referencing._core import Resolver  # not exported; referencing.typing does the same

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


#: Keywords whose subschemas apply to the same instance as the schema holding them (a cycle of
#: these never ends), by the shape they hold them in; the rest step into the instance.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas",)
#: Keywords that step into the instance (or, for ``$defs``, only hold schemas to refer to).
_STEPPING_ONE = (
    "additionalProperties",
    "contains",
    "contentSchema",
    "items",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_STEPPING_LIST = ("prefixItems",)
_STEPPING_MAP = ("$defs", "definitions", "patternProperties", "properties")
_REFERENCES = ("$ref", "$dynamicRef")


def _subschemas(node: dict[str, Any], path: str) -> Iterator[tuple[Any, str, bool]]:
    """Each subschema of ``node`` with its path, and whether it applies in place."""
    for in_place, one, many, mapping in (
        (True, _IN_PLACE_ONE, _IN_PLACE_LIST, _IN_PLACE_MAP),
        (False, _STEPPING_ONE, _STEPPING_LIST, _STEPPING_MAP),
    ):
        for key in one:
            if key in node:
                yield node[key], f"{path}.{key}", in_place
        for key in many:
            for index, child in enumerate(node.get(key, ())):
                yield child, f"{path}.{key}[{index}]", in_place
        for key in mapping:
            for name, child in node.get(key, {}).items():
                yield child, f"{path}.{key}.{name}", in_place


def _check_references(schema: dict[str, Any]) -> None:
    """Resolve every reference of ``schema`` offline and look for an in-place cycle.

    The schema has passed the meta-schema, so every keyword above holds what it should.

    :raises SchemaError: a reference that points to nothing (or to something that is not a
        schema), or an in-place reference cycle (see the module's docstring).
    """
    root = DRAFT202012.create_resource(schema)
    Work = list[tuple[dict[str, Any], "Resolver[Any]", str]]
    pending: Work = [(schema, _OFFLINE.resolver_with_root(root), "$")]
    # Targets of references wait until every subschema has been reached where it is, so that
    # a node's path is where it sits, not the reference that reached it first.
    referred: Work = []
    paths: dict[int, str] = {}
    #: node -> the nodes it applies in place, each with the path of the step.
    in_place: dict[int, list[tuple[int, str]]] = {}
    while pending or referred:
        node, resolver, path = pending.pop() if pending else referred.pop()
        if id(node) in paths:
            continue
        paths[id(node)] = path
        edges = in_place.setdefault(id(node), [])
        if "$id" in node:
            resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
        for key in _REFERENCES:
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            where = f"{path}.{key}"
            try:
                resolved = resolver.lookup(ref)
            except Unresolvable:
                raise SchemaError(
                    f"{key} {ref!r} points to nothing in the schema", path=where
                ) from None
            target = resolved.contents
            if isinstance(target, bool):
                continue
            if not isinstance(target, dict):
                raise SchemaError(
                    f"{key} {ref!r} points to a {type(target).__name__}, not a schema",
                    path=where,
                )
            edges.append((id(target), where))
            referred.append((target, resolved.resolver, where))
        for child, child_path, applies_in_place in _subschemas(node, path):
            if isinstance(child, dict):
                if applies_in_place:
                    edges.append((id(child), child_path))
                pending.append((child, resolver, child_path))
    _refuse_in_place_cycle(in_place, paths)


def _refuse_in_place_cycle(
    in_place: dict[int, list[tuple[int, str]]], paths: dict[int, str]
) -> None:
    """Depth-first search without recursion; a step back onto the current path is a cycle."""
    done: set[int] = set()
    for start in in_place:
        if start in done:
            continue
        on_path: dict[int, int] = {start: 0}  # node -> its index in ``steps``
        steps: list[str] = []
        stack: list[tuple[int, Iterator[tuple[int, str]]]] = [(start, iter(in_place[start]))]
        while stack:
            node, edges = stack[-1]
            step = next(edges, None)
            if step is None:
                stack.pop()
                del on_path[node]
                done.add(node)
                if steps:
                    steps.pop()
                continue
            target, where = step
            if target in on_path:
                loop = [*steps[on_path[target] :], where]
                raise SchemaError(
                    "the schema refers to itself with no structure in between, so no value "
                    f"could ever be checked against it: {' -> '.join(loop)} comes back to "
                    f"{paths[target]}",
                    path=loop[0],
                )
            if target not in done:
                on_path[target] = len(steps) + 1
                steps.append(where)
                stack.append((target, iter(in_place[target])))


def _sendable(message: str, path: str) -> SchemaError:
    return SchemaError(message, path=path)


def check_schema(schema: Any) -> Draft202012Validator:
    """A validator for ``schema``, once it passes the Draft 2020-12 meta-schema and our limits.

    :raises SchemaError: not an object or boolean, too deep, not sendable as JSON (NaN,
        Infinity, a lone surrogate, an integer beyond 64 bits), malformed, a ``$ref`` that
        would need a document from outside the schema or points to nothing, or a reference
        cycle with no structure in between.
    """
    if not isinstance(schema, dict | bool):
        raise SchemaError(f"a schema must be a JSON object or boolean, got {type(schema).__name__}")
    depth = json_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"schema nesting depth {depth} exceeds the limit of {MAX_SCHEMA_DEPTH}")
    # The schema goes into the request body as it is (orjson): what JSON cannot carry exactly
    # would be sent as null or fail inside the client.
    big = check_json_value(schema, "the schema", _sendable)
    if big is not None:
        raise SchemaError(
            f"the schema at {big} holds an integer beyond 64 bits, which cannot be sent",
            path=big,
        )
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
    if isinstance(schema, dict):
        _check_references(schema)
    # ``format`` is asserted, not only annotated: callers who write "format": "ipv4" expect it
    # (formats whose checker needs a package that is not installed are skipped by jsonschema).
    return Draft202012Validator(
        schema, registry=_OFFLINE, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def validate_output(validator: Draft202012Validator, value: Any, raw: str) -> None:
    """:raises OutputValidationError: with the first failing path, when ``value`` does not pass.

    ``value`` comes from `typevet_async._core.generation.records.interpret_output`, which has
    already
    refused values nested deeper than `MAX_JSON_DEPTH`.
    """
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except (RecursionError, Unresolvable) as error:
        # Not expected after `check_schema` (a deep value against a long chain of references
        # could still exhaust Python's stack): a typed error, never a raw one.
        raise GenerationError(
            f"the output could not be checked against the schema: {type(error).__name__}",
            raw=raw,
            payload=value,
        ) from None
    if errors:
        first = errors[0]
        raise OutputValidationError(
            f"output does not pass the schema at {first.json_path}: {first.message}",
            raw=raw,
            value=value,
            path=first.json_path,
        )
