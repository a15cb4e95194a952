"""An OpenAI-compatible chat server's wire: the request bodies the SDK sends and one strict
decoder per reply it reads (why msgspec, and what strict means: `typevet_async._backends.wire`).

==========================  ==============================================  ====================
reply                       fields read                                     checked while
                                                                            decoding
==========================  ==============================================  ====================
``POST {base_url}/chat/     ``choices[0].logprobs.content[0].top_logprobs   strings, numbers,
completions`` (scoring)     [].token`` / ``.logprob`` / ``.bytes`` (0-255)  byte values, ids
                            / ``.id`` (llama.cpp; vLLM: ``token_id:N``),    non-negative
                            ``usage``                                       integers; no
                                                                            ``logprobs``:
                                                                            None
``POST {base_url}/chat/     ``choices[0].message.content``,                 shared:
completions`` (generation)  ``finish_reason``, ``usage``                    `openai_chat`
``GET {base_url}/models``   ``data[].id``, ``data[].max_model_len``         strings, positive
                                                                            integers or null
``POST /tokenize``          ``tokens`` (llama.cpp's and vLLM's, at the      non-negative
                            server's root)                                  integers
==========================  ==============================================  ====================
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Annotated, Any

import attrs
import msgspec

from typevet_async._backends import wire
from typevet_async._backends.openai_chat import (
    NO_THINKING,
    PromptUsage,
    chat_messages,
    json_schema_response_format,
    user_message,
)
from typevet_async._core.generation.records import GenerationRequest
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.reading.chat_reads import ChatEntry

__all__ = [
    "ChatScoring",
    "decode_context",
    "decode_model_ids",
    "decode_scoring",
    "decode_tokens",
    "generation_body",
    "scoring_body",
    "tokenize_body",
]


def scoring_body(
    model: str, messages: Sequence[Message], top_logprobs: int, *, thinking_switch: bool
) -> dict[str, Any]:
    """One token, greedy, with the top ``top_logprobs`` entries at its position (thinking off
    where the server takes the switch)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": chat_messages(messages),
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": top_logprobs,
    }
    if thinking_switch:
        body["chat_template_kwargs"] = NO_THINKING
    return body


def generation_body(
    model: str, request: GenerationRequest, *, thinking_switch: bool
) -> dict[str, Any]:
    """Schema-bound chat completion through OpenAI's ``response_format``."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [user_message(request.prompt, request.images)],
        "response_format": json_schema_response_format(request.schema),
        "temperature": 0.0,
        "max_tokens": request.max_tokens,
    }
    if thinking_switch:
        body["chat_template_kwargs"] = NO_THINKING
    return body


def tokenize_body(model: str, text: str) -> dict[str, Any]:
    """``text`` without special tokens, in llama.cpp's fields and vLLM's at once (each server
    ignores the other's)."""
    return {
        "model": model,
        "content": text,
        "add_special": False,
        "prompt": text,
        "add_special_tokens": False,
    }


# -- POST /chat/completions (scoring) -------------------------------------------------------

_Byte = Annotated[int, msgspec.Meta(ge=0, le=255)]


class _Top(wire.Reply):
    token: str
    logprob: float
    bytes: list[_Byte] | None = None
    id: wire.TokenId | None = None


class _Position(wire.Reply):
    top_logprobs: list[_Top] | None = None


class _Logprobs(wire.Reply):
    content: list[_Position] | None = None


class _Choice(wire.Reply):
    logprobs: _Logprobs | None = None


class _ScoringReply(wire.Reply):
    choices: list[_Choice]
    usage: PromptUsage | None = None


_SCORING = wire.decoder_for(_ScoringReply)


@attrs.frozen
class ChatScoring:
    """A scoring read's entries (None: the reply carries no logprobs) and what the prompt
    cost."""

    entries: tuple[ChatEntry, ...] | None
    prompt_tokens: int
    cached_tokens: int


_TOKEN_ID_PREFIX = "token_id:"


def _entry(entry: _Top) -> ChatEntry:
    """The entry's text (its bytes decoded where they are whole UTF-8: a server's ``token``
    may mangle a partial character; else its ``token``) and its id: llama.cpp's ``id``, or
    vLLM's ``"token_id:N"`` token under ``return_tokens_as_token_ids`` (then its text is only
    what its bytes say)."""
    token, token_id = entry.token, entry.id
    digits = token[len(_TOKEN_ID_PREFIX) :]
    prefixed = token.startswith(_TOKEN_ID_PREFIX)
    if token_id is None and prefixed and digits.isascii() and digits.isdigit():
        token, token_id = "", int(digits)
    if entry.bytes is not None:
        with contextlib.suppress(UnicodeDecodeError):
            token = bytes(entry.bytes).decode("utf-8")
    return ChatEntry(token, entry.logprob, token_id)


def decode_scoring(raw: bytes) -> ChatScoring:
    """The first position's ``top_logprobs`` entries.

    :raises ProtocolError: not the shape (no ``choices``, a logprob that is not a number, a
        byte outside 0-255, an id that is not a non-negative integer, ...).
    """
    what = "/chat/completions"
    reply = wire.decode(_SCORING, raw, what)
    if not reply.choices:
        raise wire.protocol_error(what, "the reply has no choices", raw)
    logprobs = reply.choices[0].logprobs
    top = None
    if logprobs is not None and logprobs.content:
        top = logprobs.content[0].top_logprobs
    entries = None if not top else tuple([_entry(entry) for entry in top])
    return ChatScoring(entries, *PromptUsage.counts(reply.usage))


# -- GET /models, POST /tokenize ------------------------------------------------------------


class _Model(wire.Reply):
    id: str
    max_model_len: Annotated[int, msgspec.Meta(gt=0)] | None = None


class _Models(wire.Reply):
    data: list[_Model]


_MODELS = wire.decoder_for(_Models)


def decode_model_ids(raw: bytes) -> tuple[str, ...]:
    """Every served model id. :raises ProtocolError: no ``data[].id`` strings."""
    return tuple(model.id for model in wire.decode(_MODELS, raw, "/models").data)


def decode_context(raw: bytes, model: str) -> int | None:
    """``max_model_len`` of ``model``'s entry (vLLM says it), None where the server does not."""
    models = wire.decode(_MODELS, raw, "/models").data
    return next((entry.max_model_len for entry in models if entry.id == model), None)


class _Tokens(wire.Reply):
    tokens: list[wire.TokenId]


_TOKENS = wire.decoder_for(_Tokens)


def decode_tokens(raw: bytes) -> list[int]:
    """:raises ProtocolError: no ``tokens`` list of non-negative integers."""
    return wire.decode(_TOKENS, raw, "/tokenize").tokens
