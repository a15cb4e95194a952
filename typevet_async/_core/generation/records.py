"""Schema-bound generation: the request, the server's output, and turning that output into a
`Generation` (or a typed error)."""

from __future__ import annotations

from typing import Any

import attrs
from jsonschema import Draft202012Validator

from typevet_async._core.generation.schemas import validate_output
from typevet_async._core.prompts.layouts import ImagePart
from typevet_async._core.wires.jsonvalues import MAX_JSON_DEPTH, check_text, json_depth, parse_json
from typevet_async._errors import GenerationError, TruncatedOutputError

__all__ = ["ChatOutput", "Generation", "GenerationRequest", "interpret_output"]


def _sendable_prompt(_: Any, __: attrs.Attribute[Any], prompt: Any) -> None:
    if isinstance(prompt, str):  # the session refuses other types (with the prompt's index)
        check_text(prompt, "the prompt")


@attrs.frozen
class GenerationRequest:
    """One schema-bound generation, checked: what a backend sends."""

    #: Checked here too, so that no way of building a request sends one a server cannot read.
    prompt: str = attrs.field(validator=_sendable_prompt)
    #: The JSON Schema, already checked against Draft 2020-12.
    schema: Any
    images: tuple[ImagePart, ...]
    max_tokens: int


@attrs.frozen
class ChatOutput:
    """The first choice of a chat completion, as the server returned it."""

    content: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@attrs.frozen
class Generation:
    """A schema-bound generation: ``value`` passed the schema; ``raw`` is the text returned."""

    value: Any
    raw: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


def interpret_output(output: ChatOutput, validator: Draft202012Validator) -> Generation:
    """The generation, once the output is complete, parses as JSON and passes the schema.

    :raises TruncatedOutputError: the token limit stopped the output.
    :raises GenerationError: empty content, not JSON (NaN and Infinity included), or nested
        deeper than `MAX_JSON_DEPTH`. An integer of any size stays an exact ``int`` (never a
        float that would still pass ``"type": "integer"``).
    :raises OutputValidationError: the value does not pass the schema.
    """
    if output.finish_reason == "length":
        raise TruncatedOutputError(
            f"output cut off by the token limit after {output.completion_tokens} tokens",
            raw=output.content,
        )
    if not output.content.strip():
        raise GenerationError(
            f"the server returned empty content (finish_reason {output.finish_reason!r})",
            raw=output.content,
        )
    try:
        value = parse_json(output.content)
    except ValueError as error:
        raise GenerationError(f"output is not valid JSON: {error}", raw=output.content) from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise GenerationError(f"output nests deeper than {MAX_JSON_DEPTH}", raw=output.content)
    validate_output(validator, value, output.content)
    return Generation(
        value, output.content, output.finish_reason, output.prompt_tokens, output.completion_tokens
    )
