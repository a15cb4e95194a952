"""The System One wire, client side: the request body the SDK sends to ``POST /v1/systemone``
and one strict decoder per reply it reads.

Pure functions, no I/O: `typevet_async._backends.system_one` awaits between them. The decoders
are `msgspec.Struct` shapes of the official client's models (``typesafe_sdk._schemas.models``),
decoded from the body's bytes in strict mode (`typevet_async._backends.wire`):

==========================  ==============================================  ====================
reply                       fields read                                     checked while
                                                                            decoding
==========================  ==============================================  ====================
``POST /v1/systemone``      ``answers{id: {type, noul | choice |            ``type`` one of
                            score, probabilities}}``,                       noul, choice,
                            ``usage.input_tokens``, ``typevet``             score; numbers
                            (our gateway's extension: usage, diagnostics)   finite, in [0, 1]
                                                                            where they are
                                                                            probabilities;
                                                                            counts integers
``GET /v1/models``          ``models[].name``                               strings
HTTP 422                    ``detail[0].loc``, ``.msg``                     (best effort: the
                                                                            message is kept
                                                                            either way)
==========================  ==============================================  ====================

What the answers must say (exactly the questions asked, each a distribution over its options
that agrees with itself) is `typevet_async._core.systemone.answers_from_system_one`'s rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

import cattrs
import msgspec

from typevet_async._backends import wire
from typevet_async._convert import converter
from typevet_async._core.answers import Diagnostics, Judgment, Usage
from typevet_async._core.questions import Question
from typevet_async._core.systemone import (
    SystemOneAnswer,
    answers_from_system_one,
    request_to_system_one,
)

__all__ = ["decode_judgment", "decode_model_names", "decode_refusal", "judgment_body"]

PATH = "/v1/systemone"


def judgment_body(
    model: str, state: Any, questions: Sequence[tuple[str, Question]]
) -> dict[str, Any]:
    """The System One request for ``questions`` about ``state`` (sent as the caller gave it)."""
    return request_to_system_one(model, state, dict(questions))


# -- POST /v1/systemone ----------------------------------------------------------------------

Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class _Answer(wire.Reply, tag_field="type"):
    pass


class _Noul(_Answer, tag="noul"):
    noul: Probability


class _Choice(_Answer, tag="choice"):
    choice: str
    probabilities: dict[str, Probability]


class _Score(_Answer, tag="score"):
    score: float
    probabilities: dict[str, Probability]


class _Usage(wire.Reply):
    input_tokens: wire.Count


class _Extension(wire.Reply):
    usage: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None


class _Judged(wire.Reply):
    answers: dict[str, _Noul | _Choice | _Score]
    usage: _Usage
    #: Our own gateway's richer record (`typevet_async._core.systemone.EXTENSION`).
    typevet: _Extension | None = None


_JUDGED = wire.decoder_for(_Judged)


def _sent(answer: _Noul | _Choice | _Score) -> SystemOneAnswer:
    if isinstance(answer, _Noul):
        return SystemOneAnswer("noul", {"false": 1.0 - answer.noul, "true": answer.noul})
    if isinstance(answer, _Choice):
        return SystemOneAnswer("choice", answer.probabilities, choice=answer.choice)
    return SystemOneAnswer("score", answer.probabilities, score=answer.score)


def decode_judgment(raw: bytes, questions: Sequence[tuple[str, Question]]) -> Judgment:
    """The typed answers to ``questions`` from a System One response.

    Usage and diagnostics come from our own gateway's extension when it sent one (the
    server-side reads, their prompts and logprobs); from any other server the usage is its
    ``input_tokens`` for one read, and there are no diagnostics (no logprob was seen here).

    :raises ProtocolError: not the System One shape, a non-finite number or a probability
        outside [0, 1], or answers that fail `answers_from_system_one`.
    """
    reply = wire.decode(_JUDGED, raw, PATH)
    for question_id, answer in reply.answers.items():
        if isinstance(answer, _Score) and not math.isfinite(answer.score):
            raise wire.protocol_error(PATH, f"answer {question_id!r}: score is not finite", raw)
    answers = answers_from_system_one(
        questions, {question_id: _sent(answer) for question_id, answer in reply.answers.items()}
    )
    usage, diagnostics = Usage(reply.usage.input_tokens, 0, 1), {}
    extension = reply.typevet
    if extension is not None:
        try:
            if extension.usage is not None:
                usage = converter.structure(extension.usage, Usage)
            if extension.diagnostics is not None:
                diagnostics = converter.structure(extension.diagnostics, dict[str, Diagnostics])
        except (cattrs.BaseValidationError, TypeError, ValueError) as error:
            message = f"the typevet extension is not ours: {type(error).__name__}"
            raise wire.protocol_error(PATH, message, raw) from None
        if not set(diagnostics) <= set(answers):
            raise wire.protocol_error(PATH, "diagnostics of questions not asked", raw)
    return Judgment(answers, usage, diagnostics)


# -- GET /v1/models -------------------------------------------------------------------------


class _Model(wire.Reply):
    name: str


class _Models(wire.Reply):
    models: list[_Model]


_MODELS = wire.decoder_for(_Models)


def decode_model_names(raw: bytes) -> tuple[str, ...]:
    """Every model name the server lists.

    :raises ProtocolError: not ``{"models": [{"name": ...}, ...]}``.
    """
    return tuple(model.name for model in wire.decode(_MODELS, raw, "/v1/models").models)


# -- HTTP 422 -------------------------------------------------------------------------------


class _Problem(wire.Reply):
    loc: list[str | int] = msgspec.field(default_factory=list)
    msg: str = ""


class _Refusal(wire.Reply):
    detail: list[_Problem]


_REFUSAL = wire.decoder_for(_Refusal)


def decode_refusal(body: str) -> tuple[str, str | None]:
    """What a 422 says: ``"loc: msg"`` of its first problem, and the question it names
    (``loc`` ``["body", "questions", id, ...]``); the body's text itself when it is not the
    System One shape (it may be an excerpt cut short)."""
    try:
        detail = _REFUSAL.decode(body.encode()).detail
    except (msgspec.ValidationError, msgspec.DecodeError):
        return body, None
    if not detail:
        return body, None
    first = detail[0]
    loc = first.loc
    question_id = str(loc[2]) if len(loc) > 2 and loc[:2] == ["body", "questions"] else None
    return f"{'.'.join(str(part) for part in loc)}: {first.msg}", question_id
