"""The OpenAI-shaped ``/v1/chat/completions`` bodies and the generation reply both servers
share, decoded strictly (`typevet_async._backends.wire`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typevet_async._backends.wire import Count, Reply, decode, decoder_for, protocol_error
from typevet_async._core.generation.records import ChatOutput
from typevet_async._core.prompts.layouts import ImagePart, Message

__all__ = [
    "NO_THINKING",
    "PromptUsage",
    "chat_messages",
    "decode_chat_output",
    "json_schema_response_format",
    "user_message",
]

#: Thinking is always off: at an answer position, and for schema-bound output.
NO_THINKING = {"enable_thinking": False}


class _PromptDetails(Reply):
    cached_tokens: Count | None = None


class PromptUsage(Reply):
    """A scoring reply's ``usage``: the prompt's tokens, and those taken from the prompt cache
    (``prompt_tokens_details`` is null unless the server reports it; vLLM: only with
    ``--enable-prompt-tokens-details``)."""

    prompt_tokens: Count = 0
    prompt_tokens_details: _PromptDetails | None = None

    @staticmethod
    def counts(usage: PromptUsage | None) -> tuple[int, int]:
        """Prompt tokens and cached tokens (0 for what the reply leaves out)."""
        if usage is None:
            return 0, 0
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else None
        return usage.prompt_tokens, cached or 0


def user_message(text: str, images: Sequence[ImagePart] = ()) -> dict[str, Any]:
    """One user message; images come first as ``image_url`` data URIs, then the text."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image.data_uri()}} for image in images
    ]
    parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages; a message's images go before its text as data-URI parts, its
    inline images (a question's own) between the text parts where they stand."""
    out: list[dict[str, Any]] = []
    for message in messages:
        entry: dict[str, Any]
        if message.inline:
            entry = {"content": [_part(piece) for piece in message.segments()]}
        else:
            entry = user_message(message.content, message.images)
        entry["role"] = message.role
        out.append(entry)
    return out


def _part(piece: str | ImagePart) -> dict[str, Any]:
    if isinstance(piece, str):
        return {"type": "text", "text": piece}
    return {"type": "image_url", "image_url": {"url": piece.data_uri()}}


class _Message(Reply):
    content: str | None = None


class _Choice(Reply):
    message: _Message
    finish_reason: str | None = None


class _Usage(Reply):
    prompt_tokens: Count = 0
    completion_tokens: Count = 0


class _ChatCompletion(Reply):
    choices: list[_Choice]
    usage: _Usage | None = None


_CHAT_COMPLETION = decoder_for(_ChatCompletion)
_NO_USAGE = _Usage()


def decode_chat_output(raw: bytes) -> ChatOutput:
    """The first choice of a generation: content (``null``: empty), finish reason, usage.

    :raises ProtocolError: not the shape (no ``choices[0].message``, a count that is not a
        non-negative integer, ``usage`` that is not an object or null, ...).
    """
    what = "/v1/chat/completions"
    reply = decode(_CHAT_COMPLETION, raw, what)
    if not reply.choices:
        raise protocol_error(what, "the reply has no choices", raw)
    choice = reply.choices[0]
    usage = reply.usage or _NO_USAGE
    return ChatOutput(
        choice.message.content or "",
        choice.finish_reason or "",
        usage.prompt_tokens,
        usage.completion_tokens,
    )


def json_schema_response_format(schema: Any) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a JSON Schema (llama.cpp turns it into a grammar)."""
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
