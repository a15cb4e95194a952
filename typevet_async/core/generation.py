"""Schema-bound generation results, and turning a server's output into one (or a typed error)."""

from __future__ import annotations

from typing import Any

import attrs
from jsonschema import Draft202012Validator

from typevet_async.core.schemas import validate_output
from typevet_async.errors import GenerationError, TruncatedOutputError

__all__ = ["ChatOutput", "Generation", "build_generation", "check_output"]


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


def check_output(output: ChatOutput) -> None:
    """Refuse empty and cut-off output before it is parsed.

    :raises GenerationError: empty content.
    :raises TruncatedOutputError: the token limit stopped the output.
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


def build_generation(output: ChatOutput, value: Any, validator: Draft202012Validator) -> Generation:
    """:raises OutputValidationError: ``value`` does not pass the schema."""
    validate_output(validator, value, output.content)
    return Generation(
        value, output.content, output.finish_reason, output.prompt_tokens, output.completion_tokens
    )
