"""The OpenAI-shaped ``/v1/chat/completions`` bodies and responses both servers share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typevet_async._core.generation import ChatOutput
from typevet_async._core.layouts import ImagePart
from typevet_async._errors import ProtocolError

__all__ = ["json_schema_response_format", "parse_chat_output", "user_message"]

#: Thinking is always off: at an answer position, and for schema-bound output.
NO_THINKING = {"enable_thinking": False}


def user_message(text: str, images: Sequence[ImagePart] = ()) -> dict[str, Any]:
    """One user message; images come first as ``image_url`` data URIs, then the text."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": image.data_uri()}} for image in images
    ]
    parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}


def parse_chat_output(payload: Any) -> ChatOutput:
    try:
        choice = payload["choices"][0]
        content = choice["message"].get("content") or ""
        finish_reason = str(choice.get("finish_reason") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ProtocolError("chat completion has no choices[0].message", payload=payload) from None
    if not isinstance(content, str):
        raise ProtocolError("chat completion content is not a string", payload=payload)
    usage = payload.get("usage") or {}
    return ChatOutput(
        content,
        finish_reason,
        int(usage.get("prompt_tokens", 0) or 0),
        int(usage.get("completion_tokens", 0) or 0),
    )


def json_schema_response_format(schema: Any) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a JSON Schema (llama.cpp turns it into a grammar)."""
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
