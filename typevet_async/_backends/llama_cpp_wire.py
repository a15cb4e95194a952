"""llama.cpp's wire: the request bodies the SDK sends and one strict decoder per reply it reads.

Pure functions, no I/O: `typevet_async._backends.llama_cpp` awaits between them. Each decoder
is a `msgspec.Struct` shape naming only the fields the SDK uses, decoded from the body's bytes
in strict mode (why msgspec, and what strict means here: `typevet_async._backends.wire`).

=====================  ============================================  ==========================
reply                  fields read                                   checked while decoding
=====================  ============================================  ==========================
``POST /completion``   ``completion_probabilities[0].top_logprobs``  ids non-negative integers,
                       ``[].id`` / ``.logprob``,                     logprobs numbers, counts
                       ``generation_settings.n_probs``,              non-negative integers, one
                       ``tokens_evaluated``, ``timings.cache_n``     position, ``n_probs`` echo
``POST /tokenize``     ``tokens`` (ids, or ``{"id"}`` pieces), or    ids non-negative integers;
                       ``tokens[].id`` / ``.piece``                  a piece a string or bytes
``POST /apply-         ``prompt``                                    a string
template``
``GET /v1/models``     ``data[].id``, ``data[].aliases``,            strings; ``n_vocab`` a
                       ``data[0].meta.n_vocab``                      positive integer
``GET /props``         ``modalities.vision``, ``media_marker``,      an object and a boolean, a
                       ``total_slots``, ``chat_template``,           string or null, positive
                       ``bos_token``,                                integers
                       ``default_generation_settings.n_ctx``
``POST /v1/chat/       ``choices[0].message.content``,               shared with vLLM:
completions``          ``finish_reason``, ``usage``                  `openai_chat`
=====================  ============================================  ==========================

The values' rules (entries asked for, ids below the vocabulary, repeated ids, finite logprobs
at most 0) are `typevet_async._core.reading.readings`' and are applied right after decoding.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated, Any

import attrs
import msgspec

from typevet_async._backends.openai_chat import (
    NO_THINKING,
    json_schema_response_format,
    user_message,
)
from typevet_async._backends.wire import (
    Count,
    Reply,
    TokenId,
    decode,
    decoder_for,
    protocol_error,
)
from typevet_async._core.generation.records import GenerationRequest
from typevet_async._core.prompts.framing import ANSWER_PROBE, PROBE_MESSAGE, SECOND_PROBE_MESSAGE
from typevet_async._core.prompts.layouts import ImagePart, Message
from typevet_async._core.prompts.markers import Piece
from typevet_async._core.reading.readings import TopLogprobs

__all__ = [
    "Completion",
    "Props",
    "completion_body",
    "decode_completion",
    "decode_models",
    "decode_pieces",
    "decode_props",
    "decode_rendered",
    "decode_tokens",
    "generation_body",
    "history_probe_body",
    "probe_template_body",
    "split_probe_body",
    "template_body",
    "tokenize_body",
]


# -- request bodies -------------------------------------------------------------------------


def completion_body(
    prompt: str,
    top_k: int,
    *,
    cache_prompt: bool,
    images: Sequence[ImagePart] = (),
    lead: Sequence[int] = (),
) -> dict[str, Any]:
    """A one-position read: no tokens generated, the top-K full-vocabulary logprobs returned.

    With images the prompt becomes ``{"prompt_string", "multimodal_data"}``; the prefix holds
    one media marker per image, in order. A ``lead`` (token ids) ends the prompt after its
    text: llama.cpp takes a prompt of text and token ids mixed.
    """
    body_prompt: Any = [prompt, *lead] if lead else prompt
    if images:
        if lead:  # `request_for` refuses these first: the lead would be silently dropped
            raise ValueError("a multimodal prompt is a string: it cannot end in lead tokens")
        body_prompt = {
            "prompt_string": prompt,
            "multimodal_data": [base64.b64encode(image.data).decode("ascii") for image in images],
        }
    return {
        "prompt": body_prompt,
        "n_predict": 0,
        "n_probs": top_k,
        "post_sampling_probs": False,
        "cache_prompt": cache_prompt,
        "return_tokens": False,
        "response_fields": list(COMPLETION_FIELDS),
    }


def template_body(messages: Sequence[Message]) -> dict[str, Any]:
    """Render messages through the served template, thinking off, ending at the answer."""
    return {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


def split_probe_body() -> dict[str, Any]:
    """The ``split`` layout's message roles (system, user, user), rendered at the probe."""
    return {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": PROBE_MESSAGE},
            {"role": "user", "content": SECOND_PROBE_MESSAGE},
        ],
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


def history_probe_body() -> dict[str, Any]:
    """A conversation of two user turns and the assistant's answer between them, rendered as
    a judgment's is (`typevet_async._core.prompts.framing.learn_turns`)."""
    return {
        "messages": [
            {"role": "user", "content": PROBE_MESSAGE},
            {"role": "assistant", "content": ANSWER_PROBE},
            {"role": "user", "content": SECOND_PROBE_MESSAGE},
        ],
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


def probe_template_body(message: str = PROBE_MESSAGE) -> dict[str, Any]:
    """One user message, rendered as a judgment's is: generation prompt, thinking off."""
    return {
        "messages": [{"role": "user", "content": message}],
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


def tokenize_body(
    text: str, *, parse_special: bool = True, with_pieces: bool = False
) -> dict[str, Any]:
    """``parse_special`` False: special-token text is read as plain text (how the SDK tells
    special marker runs from ordinary ones); ``with_pieces``: each token with its text."""
    body: dict[str, Any] = {"content": text, "add_special": False, "parse_special": parse_special}
    if with_pieces:
        body["with_pieces"] = True
    return body


def generation_body(request: GenerationRequest) -> dict[str, Any]:
    """Schema-bound chat completion: llama.cpp compiles the schema into a grammar."""
    return {
        "messages": [user_message(request.prompt)],
        "response_format": json_schema_response_format(request.schema),
        "temperature": 0.0,
        "max_tokens": request.max_tokens,
        "chat_template_kwargs": NO_THINKING,
    }


# -- POST /completion -----------------------------------------------------------------------


class _Entry(Reply):
    id: TokenId
    logprob: float


class _Position(Reply):
    top_logprobs: list[_Entry]


class _Settings(Reply):
    n_probs: Count | None = None


class _Timings(Reply):
    cache_n: Count = 0


class _Completion(Reply):
    completion_probabilities: list[_Position]
    generation_settings: _Settings = msgspec.field(default_factory=_Settings)
    tokens_evaluated: Count = 0
    timings: _Timings = msgspec.field(default_factory=_Timings)
    # With `response_fields`, llama.cpp moves a nested field to the top under its slashed path.
    n_probs_unnested: Count | None = msgspec.field(default=None, name="generation_settings/n_probs")
    cache_n_unnested: Count | None = msgspec.field(default=None, name="timings/cache_n")


#: The top-level fields a scoring read uses; llama.cpp then leaves out the rest (the prompt,
#: the generated text, settings). A server that ignores the request sends them all, and the
#: decoder reads either shape.
COMPLETION_FIELDS = (
    "completion_probabilities",
    "tokens_evaluated",
    "timings/cache_n",
    "generation_settings/n_probs",
)


_COMPLETION = decoder_for(_Completion)


@attrs.frozen
class Completion:
    """A scoring read's reply: the first position's top logprobs and what the prompt cost."""

    top: TopLogprobs
    prompt_tokens: int
    cached_tokens: int


def decode_completion(raw: bytes, requested: int) -> Completion:
    """The top logprobs at the first position, prompt tokens and cached prompt tokens.

    :raises ProtocolError: not the shape, no position, or ``generation_settings.n_probs``
        echoed another K than ``requested``.
    """
    what = "/completion"
    reply = decode(_COMPLETION, raw, what)
    for echoed in (reply.generation_settings.n_probs, reply.n_probs_unnested):
        if echoed is not None and echoed != requested:
            raise protocol_error(
                what, f"asked for n_probs {requested}, server echoed {echoed}", raw
            )
    if not reply.completion_probabilities:
        raise protocol_error(what, "the reply has no completion_probabilities[0]", raw)
    top = reply.completion_probabilities[0].top_logprobs
    # One pass builds the logprobs by id; the pairs are rebuilt only for a read that fails.
    logprobs = {entry.id: entry.logprob for entry in top}
    cached = reply.timings.cache_n if reply.cache_n_unnested is None else reply.cache_n_unnested
    return Completion(
        TopLogprobs(logprobs, len(top), requested, lambda: [(e.id, e.logprob) for e in top]),
        reply.tokens_evaluated,
        cached,
    )


# -- POST /tokenize -------------------------------------------------------------------------


class _Piece(Reply):
    id: TokenId


class _Tokens(Reply):
    #: Token ids; with ``with_pieces`` each is ``{"id": ..., "piece": ...}``.
    tokens: list[TokenId | _Piece]


_TOKENS = decoder_for(_Tokens)

Byte = Annotated[int, msgspec.Meta(ge=0, le=255)]


class _TextPiece(Reply):
    id: TokenId
    #: The token's text; its bytes where they are not valid UTF-8 on their own.
    piece: str | list[Byte]


class _Pieces(Reply):
    tokens: list[_TextPiece]


_PIECES = decoder_for(_Pieces)


def decode_tokens(raw: bytes) -> list[int]:
    """:raises ProtocolError: no ``tokens``, or one that is not a non-negative integer."""
    reply = decode(_TOKENS, raw, "/tokenize")
    return [token if isinstance(token, int) else token.id for token in reply.tokens]


def decode_pieces(raw: bytes) -> list[Piece]:
    """Each token's id and the bytes of its text (a ``with_pieces`` reply).

    :raises ProtocolError: no ``tokens``, or one without a non-negative ``id`` and a ``piece``
        that is a string or a list of bytes."""
    reply = decode(_PIECES, raw, "/tokenize")
    return [
        (token.id, token.piece.encode() if isinstance(token.piece, str) else bytes(token.piece))
        for token in reply.tokens
    ]


# -- POST /apply-template -------------------------------------------------------------------


class _Rendered(Reply):
    prompt: str


_RENDERED = decoder_for(_Rendered)


def decode_rendered(raw: bytes) -> str:
    """:raises ProtocolError: no ``prompt`` string."""
    return decode(_RENDERED, raw, "/apply-template").prompt


# -- GET /v1/models -------------------------------------------------------------------------


class _Meta(Reply):
    n_vocab: Annotated[int, msgspec.Meta(gt=0)]


class _Model(Reply):
    id: str = ""
    aliases: list[str] = msgspec.field(default_factory=list)
    meta: _Meta | None = None


class _Models(Reply):
    data: list[_Model]


_MODELS = decoder_for(_Models)


def decode_models(raw: bytes) -> tuple[int, tuple[str, ...]]:
    """The vocabulary size (``data[0].meta.n_vocab``) and every id and alias served.

    :raises ProtocolError: no model, no ``n_vocab`` on the first, or a field of another type.
    """
    what = "/v1/models"
    reply = decode(_MODELS, raw, what)
    if not reply.data or reply.data[0].meta is None:
        raise protocol_error(what, "the reply has no data[0].meta.n_vocab", raw)
    names = [name for model in reply.data for name in (model.id, *model.aliases) if name]
    return reply.data[0].meta.n_vocab, tuple(names)


# -- GET /props -----------------------------------------------------------------------------


class _Modalities(Reply):
    vision: bool = False


class _SlotSettings(Reply):
    n_ctx: Annotated[int, msgspec.Meta(gt=0)] | None = None


class _Props(Reply):
    modalities: _Modalities = msgspec.field(default_factory=_Modalities)
    default_generation_settings: _SlotSettings = msgspec.field(default_factory=_SlotSettings)
    media_marker: str | None = None
    total_slots: Annotated[int, msgspec.Meta(gt=0)] | None = None
    chat_template: str = ""
    bos_token: str | None = None


_PROPS = decoder_for(_Props)


@attrs.frozen
class Props:
    """What ``/props`` declares: vision, the media marker (None if none), the slots."""

    vision: bool
    media_marker: str | None
    #: Reads the server runs at once (``total_slots``); None if it does not say.
    slots: int | None
    #: The served chat template's source ("" if it does not say) and the BOS token's text.
    chat_template: str = ""
    bos_token: str | None = None
    #: The tokens one request may hold: a slot's context (``default_generation_settings.n_ctx``,
    #: the server's ``n_ctx`` over its slots); None if it does not say.
    context_tokens: int | None = None


def decode_props(raw: bytes) -> Props:
    """:raises ProtocolError: ``modalities`` not an object, ``vision`` not a boolean,
    ``media_marker`` neither a string nor null, ``total_slots`` or a slot's ``n_ctx`` not a
    positive integer, or ``chat_template`` or ``bos_token`` not a string."""
    reply = decode(_PROPS, raw, "/props")
    return Props(
        reply.modalities.vision,
        reply.media_marker or None,
        reply.total_slots,
        reply.chat_template,
        reply.bos_token or None,
        reply.default_generation_settings.n_ctx,
    )
