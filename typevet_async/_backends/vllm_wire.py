"""vLLM's wire: the request bodies the SDK sends and one strict decoder per reply it reads.

Pure functions, no I/O: `typevet_async._backends.vllm` awaits between them. Each decoder is a
`msgspec.Struct` shape naming only the fields the SDK uses, decoded from the body's bytes in
strict mode (why msgspec, and what strict means here: `typevet_async._backends.wire`).

==========================  ==============================================  ====================
reply                       fields read                                     checked while
                                                                            decoding
==========================  ==============================================  ====================
``POST /v1/chat/            ``choices[0].logprobs.content[0].token`` and    tokens
completions`` (scoring)     ``.top_logprobs[].token`` / ``.logprob``,       ``"token_id:N"``
                            ``usage.prompt_tokens``,                        with N a
                            ``usage.prompt_tokens_details.cached_tokens``   non-negative
                                                                            integer, logprobs
                                                                            numbers, counts
                                                                            non-negative
                                                                            integers, no id
                                                                            but the candidates
                                                                            and the sampled one
``POST /v1/chat/            ``choices[0].message.content``,                 shared with
completions`` (generation)  ``finish_reason``, ``usage``                    llama.cpp:
                                                                            `openai_chat`
``POST /tokenize``          ``tokens``, ``token_strs`` (``messages``        ids non-negative
                            form)                                           integers, strings
``POST /v1/completions``    ``choices[0].logprobs.tokens[0]`` and           as the chat read
(token-prompt scoring)      ``.top_logprobs[0]`` (token -> logprob),
                            ``usage``
``GET /v1/models``          ``data[].id``, ``data[].max_model_len``         strings, positive
                                                                            integers or null
==========================  ==============================================  ====================

The values' rules (repeated ids, finite logprobs at most 0 in a ``*_logprobs`` mode, every
candidate present) are `typevet_async._core.reading.readings`' and are applied right after decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import attrs
import msgspec

from typevet_async._backends import wire
from typevet_async._backends.openai_chat import (
    NO_THINKING,
    PromptUsage,
    chat_messages,
    user_message,
)
from typevet_async._core.generation.records import GenerationRequest
from typevet_async._core.prompts.framing import PROBE_MESSAGE, SECOND_PROBE_MESSAGE
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.reading.readings import TopLogprobs
from typevet_async._errors import InvalidLogprobsError

__all__ = [
    "Scoring",
    "chat_messages",
    "chat_tokens_body",
    "completion_scoring_body",
    "decode_completion_scoring",
    "decode_max_model_len",
    "decode_model_ids",
    "decode_rendered",
    "decode_scoring",
    "decode_tokens",
    "generation_body",
    "render_body",
    "scoring_body",
    "split_render_body",
    "tokenize_body",
]

_TOKEN_ID_PREFIX = "token_id:"


# -- request bodies -------------------------------------------------------------------------


def _continued(answer: str | None) -> dict[str, Any]:
    """With an answer: the template renders it as the start of the assistant's answer."""
    if answer is None:
        return {"add_generation_prompt": True}
    return {"add_generation_prompt": False, "continue_final_message": True}


def scoring_body(
    model: str, messages: Sequence[Message], token_ids: Sequence[int]
) -> dict[str, Any]:
    """One position, exactly the candidates' logprobs, thinking off, no sampling processors."""
    return {
        "model": model,
        "messages": chat_messages(messages),
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": True,
        "logprob_token_ids": list(token_ids),
        "return_tokens_as_token_ids": True,
        "chat_template_kwargs": NO_THINKING,
    }


def generation_body(model: str, request: GenerationRequest) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [user_message(request.prompt, request.images)],
        "structured_outputs": {"json": request.schema},
        "temperature": 0.0,
        "max_tokens": request.max_tokens,
        "chat_template_kwargs": NO_THINKING,
    }


def tokenize_body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "prompt": text, "add_special_tokens": False}


def render_body(model: str, answer: str | None = None) -> dict[str, Any]:
    """The probe message through the served template as a read renders it (thinking off), as
    tokens and token strings; with an ``answer``, continued by the assistant's answer."""
    messages = [user_message(PROBE_MESSAGE)]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return {
        "model": model,
        "messages": messages,
        **_continued(answer),
        "chat_template_kwargs": NO_THINKING,
        "return_token_strs": True,
    }


def chat_tokens_body(model: str, messages: Sequence[Message]) -> dict[str, Any]:
    """The scoring messages through the served template, as a read renders them (thinking
    off, the generation prompt): the prompt a token-prompt read extends by the controls'
    lead. Images are refused before: a token prompt cannot carry them."""
    return {
        "model": model,
        "messages": chat_messages(messages),
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


def completion_scoring_body(
    model: str, prompt_tokens: Sequence[int], token_ids: Sequence[int]
) -> dict[str, Any]:
    """A ``/v1/completions`` read of exactly the candidates' logprobs after a token prompt
    (the rendered chat and the controls' lead), no sampling processors."""
    return {
        "model": model,
        "prompt": list(prompt_tokens),
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": 0,
        "logprob_token_ids": list(token_ids),
        "return_tokens_as_token_ids": True,
    }


def split_render_body(model: str) -> dict[str, Any]:
    """The ``split`` layout's message roles (system, user, user), rendered at the probe."""
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "s"},
            user_message(PROBE_MESSAGE),
            user_message(SECOND_PROBE_MESSAGE),
        ],
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


# -- POST /v1/chat/completions (scoring) ----------------------------------------------------


class _Top(wire.Reply):
    token: str
    logprob: float


class _Position(wire.Reply):
    token: str
    top_logprobs: list[_Top]


class _Logprobs(wire.Reply):
    content: list[_Position]


class _Choice(wire.Reply):
    logprobs: _Logprobs


class _ScoringReply(wire.Reply):
    choices: list[_Choice]
    usage: PromptUsage | None = None


_SCORING = wire.decoder_for(_ScoringReply)


@attrs.frozen
class Scoring:
    """A scoring read's reply: the candidates' entries and what the prompt cost."""

    top: TopLogprobs
    prompt_tokens: int
    cached_tokens: int


def token_id(token: str, what: str, raw: bytes) -> int:
    """The id in ``"token_id:N"`` (``return_tokens_as_token_ids``): N ASCII digits only.

    :raises ProtocolError: any other token text (``int`` alone would take ``" 5"``, ``"+5"``,
        ``"1_0"`` or other scripts' digits).
    """
    digits = token[len(_TOKEN_ID_PREFIX) :]
    if not (token.startswith(_TOKEN_ID_PREFIX) and digits.isascii() and digits.isdigit()):
        raise wire.protocol_error(
            what, f"expected a token as 'token_id:N', got {token[:80]!r}", raw
        )
    return int(digits)


def decode_scoring(raw: bytes, token_ids: Sequence[int]) -> Scoring:
    """The candidates' entries (the sampled token may come along; nothing else may).

    Repeated ids and bad values are `validated_logprobs`' to refuse.

    :raises ProtocolError: the shape is wrong, or a token is not ``"token_id:N"``.
    :raises InvalidLogprobsError: an entry that is neither a candidate nor the sampled token.
    """
    what = "/v1/chat/completions"
    reply = wire.decode(_SCORING, raw, what)
    if not reply.choices or not reply.choices[0].logprobs.content:
        raise wire.protocol_error(what, "the reply has no choices[0].logprobs.content[0]", raw)
    position = reply.choices[0].logprobs.content[0]
    return _kept_scoring(what, raw, position.token, position.top_logprobs, token_ids, reply.usage)


def _kept_scoring(
    what: str,
    raw: bytes,
    sampled_token: str,
    entries: Sequence[_Top],
    token_ids: Sequence[int],
    usage: PromptUsage | None,
) -> Scoring:
    sampled = token_id(sampled_token, what, raw)
    wanted = set(token_ids)
    kept: list[tuple[int, float]] = []
    unexpected: list[int] = []
    for entry in entries:
        tid = token_id(entry.token, what, raw)
        if tid in wanted:
            kept.append((tid, entry.logprob))
        elif tid != sampled:
            unexpected.append(tid)
    if unexpected:
        raise InvalidLogprobsError(f"unexpected token ids {unexpected} in a logprob_token_ids read")
    return Scoring(TopLogprobs.from_pairs(tuple(kept), len(token_ids)), *PromptUsage.counts(usage))


# -- POST /v1/completions (token-prompt scoring) ----------------------------------------------


class _CompletionLogprobs(wire.Reply):
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class _CompletionChoice(wire.Reply):
    logprobs: _CompletionLogprobs


class _CompletionReply(wire.Reply):
    choices: list[_CompletionChoice]
    usage: PromptUsage | None = None


_COMPLETION = wire.decoder_for(_CompletionReply)


def decode_completion_scoring(raw: bytes, token_ids: Sequence[int]) -> Scoring:
    """`decode_scoring` for a ``/v1/completions`` read (its position is a token -> logprob
    object)."""
    what = "/v1/completions"
    reply = wire.decode(_COMPLETION, raw, what)
    if not reply.choices:
        raise wire.protocol_error(what, "the reply has no choices[0]", raw)
    logprobs = reply.choices[0].logprobs
    if not logprobs.tokens or not logprobs.top_logprobs:
        raise wire.protocol_error(what, "the reply has no logprobs at the first position", raw)
    entries = [_Top(token=token, logprob=lp) for token, lp in logprobs.top_logprobs[0].items()]
    return _kept_scoring(what, raw, logprobs.tokens[0], entries, token_ids, reply.usage)


# -- POST /tokenize -------------------------------------------------------------------------


class _Tokens(wire.Reply):
    tokens: list[wire.TokenId]


class _TokenStrs(wire.Reply):
    #: null unless ``return_token_strs`` was asked for.
    token_strs: list[str] | None = None


_TOKENS = wire.decoder_for(_Tokens)
_TOKEN_STRS = wire.decoder_for(_TokenStrs)


def decode_tokens(raw: bytes) -> list[int]:
    """:raises ProtocolError: no ``tokens``, or one that is not a non-negative integer."""
    return wire.decode(_TOKENS, raw, "/tokenize").tokens


def decode_rendered(raw: bytes) -> str:
    """The rendered template: the ``token_strs`` of a ``messages`` tokenization, joined.

    :raises ProtocolError: no ``token_strs`` list of strings.
    """
    pieces = wire.decode(_TOKEN_STRS, raw, "/tokenize").token_strs
    if pieces is None:
        raise wire.protocol_error("/tokenize", "the reply has no token_strs", raw)
    return "".join(pieces)


# -- GET /v1/models -------------------------------------------------------------------------


class _Model(wire.Reply):
    id: str
    max_model_len: Annotated[int, msgspec.Meta(gt=0)] | None = None


class _Models(wire.Reply):
    data: list[_Model]


_MODELS = wire.decoder_for(_Models)


def decode_model_ids(raw: bytes) -> tuple[str, ...]:
    """Every served model id. :raises ProtocolError: no ``data[].id`` strings."""
    return tuple(model.id for model in wire.decode(_MODELS, raw, "/v1/models").data)


def decode_max_model_len(raw: bytes, model: str | None) -> int | None:
    """The tokens one request for ``model`` may hold, prompt and output (``max_model_len`` of
    its ``data[]`` entry); None if the server does not say.

    :raises ProtocolError: no ``data[].id`` strings, or a ``max_model_len`` that is not a
        positive integer.
    """
    models = wire.decode(_MODELS, raw, "/v1/models").data
    return next((entry.max_model_len for entry in models if entry.id == model), None)
