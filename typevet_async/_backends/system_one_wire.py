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
                            score, confidence, probabilities}}``,           noul, choice,
                            ``usage.input_tokens``, ``x_typevet``           score; numbers
                            (our gateway's extension: usage, diagnostics,   finite, in [0, 1]
                            each answer's ``entropy_confidence``;
                            ``typevet`` from gateways before issue 33)      where they are
                                                                            probabilities;
                                                                            counts integers
``GET /v1/models``          ``models[].name``                               strings
HTTP 422                    ``detail[0].loc``, ``.msg``                     (best effort: the
                                                                            message is kept
                                                                            either way)
==========================  ==============================================  ====================

What the answers must say (exactly the questions asked, each a distribution over its options
that agrees with itself) is `typevet_async._core.wires.system_one.answers_from_system_one`'s rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias, Union

import attrs
import msgspec

from typevet_async._backends import wire
from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Diagnostics, Judgment, Usage
from typevet_async._core.wires.system_one import (
    ANSWER_FIELDS,
    BATCH_PATH,
    EXAMPLES_FIELD,
    SystemOneAnswer,
    Value,
    answers_from_system_one,
    batch_to_system_one,
    request_to_system_one,
)

__all__ = [
    "BATCH_PATH",
    "ItemError",
    "Listing",
    "Refusal",
    "batch_body",
    "decode_batch",
    "decode_judgment",
    "decode_model_names",
    "decode_models",
    "decode_refusal",
    "item_refusal",
    "judgment_body",
]

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


#: How each declared answer field the backend reads back is decoded (strictly: a probability
#: within [0, 1], a label a string).
_DECODED_AS: Final[Mapping[Value, Any]] = {
    Value.PROBABILITY: Probability,
    Value.NUMBER: float,
    Value.LABEL: str,
    Value.PROBABILITIES: dict[str, Probability],
}


def _answer_struct(kind: str) -> type[_Answer]:
    """The decoder's shape of an answer type: its declared fields marked ``read``
    (`typevet_async._core.wires.system_one.schema`), the tag ``type`` their union's."""
    fields = [
        (field.name, _DECODED_AS[field.value])
        for field in ANSWER_FIELDS[kind]
        if field.read and field.value is not Value.TAG
    ]
    struct = msgspec.defstruct(f"_{kind.title()}", fields, bases=(_Answer,), tag=kind)
    assert issubclass(struct, _Answer)
    return struct


#: Answer type -> its decoder shape, and back.
_ANSWER_STRUCTS: Final = {kind: _answer_struct(kind) for kind in ANSWER_FIELDS}
_KIND_OF: Final = {struct: kind for kind, struct in _ANSWER_STRUCTS.items()}

if TYPE_CHECKING:
    _AnyAnswer: TypeAlias = _Answer
else:
    _AnyAnswer = Union[tuple(_ANSWER_STRUCTS.values())]  # noqa: UP007 (built at run time)


class _Usage(wire.Reply):
    input_tokens: wire.Count


#: A full-vocabulary logprob on the wire: never positive (finiteness is checked by msgspec's
#: JSON, which has no NaN or infinity).
Logprob = Annotated[float, msgspec.Meta(le=0.0)]


class _ExtensionUsage(wire.Reply):
    """`Usage` as our gateway sends it: strict counts (no 1.9, "7" or true read as a count)."""

    prompt_tokens: wire.Count = 0
    cached_tokens: wire.Count = 0
    reads: wire.Count = 0


class _ExtensionDiagnostics(wire.Reply):
    """`Diagnostics` as our gateway sends it, every value within its range."""

    prompt: str
    controls: list[str]
    token_ids: list[wire.TokenId]
    logprobs: list[Logprob]
    off_menu_mass: Probability | None
    top_k: Annotated[int, msgspec.Meta(ge=1)]
    reads: Annotated[int, msgspec.Meta(ge=1)]
    candidates: list[tuple[wire.TokenId, Logprob]] = msgspec.field(default_factory=list)
    policy: Literal["exact", "clamp", "error"] = "exact"
    truncated: bool = False
    off_menu_flagged: bool = False
    attempts: Annotated[int, msgspec.Meta(ge=1)] = 1
    rotations: list[list[Probability]] = msgspec.field(default_factory=list)
    raw_probabilities: list[Probability] | None = None
    calibration: str | None = None
    content_free_prior: list[Probability] | None = None
    content_free_off_menu_mass: Probability | None = None
    batch_prior: list[Probability] | None = None
    batch_prior_items: wire.Count = 0
    batch_prior_skipped: str | None = None


class _ExtensionAnswer(wire.Reply):
    """What our gateway's record adds to an answer: the SDK's entropy confidence (the rest of
    the record is the wire's answer again)."""

    entropy_confidence: Probability | None = None


class _Extension(wire.Reply):
    usage: _ExtensionUsage | None = None
    diagnostics: dict[str, _ExtensionDiagnostics] | None = None
    answers: dict[str, _ExtensionAnswer] | None = None


def _diagnostics(sent: _ExtensionDiagnostics) -> Diagnostics:
    if not len(sent.controls) == len(sent.token_ids) == len(sent.logprobs):
        raise ValueError("controls, token ids and logprobs differ in length")
    return Diagnostics(
        sent.prompt,
        tuple(sent.controls),
        tuple(sent.token_ids),
        tuple(sent.logprobs),
        sent.off_menu_mass,
        sent.top_k,
        sent.reads,
        candidates=tuple((token, logprob) for token, logprob in sent.candidates),
        policy=sent.policy,
        truncated=sent.truncated,
        off_menu_flagged=sent.off_menu_flagged,
        attempts=sent.attempts,
        rotations=tuple(tuple(r) for r in sent.rotations),
        raw_probabilities=None if sent.raw_probabilities is None else tuple(sent.raw_probabilities),
        calibration=sent.calibration,
        content_free_prior=None
        if sent.content_free_prior is None
        else tuple(sent.content_free_prior),
        content_free_off_menu_mass=sent.content_free_off_menu_mass,
        batch_prior=None if sent.batch_prior is None else tuple(sent.batch_prior),
        batch_prior_items=sent.batch_prior_items,
        batch_prior_skipped=sent.batch_prior_skipped,
    )


class _Judged(wire.Reply):
    answers: dict[str, _AnyAnswer]
    usage: _Usage
    #: Our own gateway's richer record (`typevet_async._core.wires.system_one.EXTENSION`).
    x_typevet: _Extension | None = None
    #: The same, as gateways before issue 33 named it (read when ``x_typevet`` is absent).
    typevet: _Extension | None = None


_JUDGED = wire.decoder_for(_Judged)


def _sent(answer: _AnyAnswer) -> SystemOneAnswer:
    kind = _KIND_OF[type(answer)]
    if kind == "noul":
        noul: float = getattr(answer, "noul")  # noqa: B009 (a field built from the schema)
        return SystemOneAnswer("noul", {"false": 1.0 - noul, "true": noul})
    probabilities: Mapping[str, float] = getattr(answer, "probabilities")  # noqa: B009
    return SystemOneAnswer(
        kind,
        probabilities,
        choice=getattr(answer, "choice", None),
        score=getattr(answer, "score", None),
        confidence=getattr(answer, "confidence", None),
    )


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
        score = getattr(answer, "score", None)
        if score is not None and not math.isfinite(score):
            raise wire.protocol_error(PATH, f"answer {question_id!r}: score is not finite", raw)
    answers = answers_from_system_one(
        questions, {question_id: _sent(answer) for question_id, answer in reply.answers.items()}
    )
    usage, diagnostics = Usage(reply.usage.input_tokens, 0, 1), {}
    # decoded strictly with the rest (its ranges are checked); an older gateway's ``typevet``
    extension = reply.x_typevet if reply.x_typevet is not None else reply.typevet
    if extension is not None:
        if extension.usage is not None:
            sent = extension.usage
            usage = Usage(sent.prompt_tokens, sent.cached_tokens, sent.reads)
        try:
            diagnostics = {
                question_id: _diagnostics(sent)
                for question_id, sent in (extension.diagnostics or {}).items()
            }
        except ValueError as error:
            raise wire.protocol_error(PATH, f"the x_typevet extension: {error}", raw) from None
        if not set(diagnostics) <= set(answers):
            raise wire.protocol_error(PATH, "diagnostics of questions not asked", raw)
        recorded = extension.answers or {}
        if not set(recorded) <= set(answers):
            raise wire.protocol_error(PATH, "x_typevet answers to questions not asked", raw)
        for question_id, record in recorded.items():
            if record.entropy_confidence is not None:  # the server's own, as it sent it
                answers[question_id] = attrs.evolve(
                    answers[question_id], entropy_confidence=record.entropy_confidence
                )
    return Judgment(answers, usage, diagnostics)


# -- GET /v1/models -------------------------------------------------------------------------


class _Model(wire.Reply):
    name: str


class _BatchRoute(wire.Reply):
    path: str
    max_states: Annotated[int, msgspec.Meta(ge=1)]


class _ExamplesField(wire.Reply):
    field: str
    max_examples: Annotated[int, msgspec.Meta(ge=1)]


class _Models(wire.Reply):
    models: list[_Model]
    #: The batch route, when the server offers it (`typevet_async._core.wires.system_one.batch`).
    x_systemone_batch: _BatchRoute | None = None
    #: The question field a server reads examples from, when it does (`EXAMPLES_ADVERTISEMENT`).
    x_question_examples: _ExamplesField | None = None


_MODELS = wire.decoder_for(_Models)


@attrs.frozen
class Listing:
    """What ``GET /v1/models`` says: the models, and the extensions the server offers."""

    names: tuple[str, ...]
    #: States one batch request takes (None: no batch route, or one at another path).
    max_states: int | None = None
    #: Examples one question may carry (None: the server does not read `EXAMPLES_FIELD`).
    max_examples: int | None = None


def decode_models(raw: bytes) -> Listing:
    """Every model name the server lists, how many states its batch route takes and how many
    examples a question may carry.

    :raises ProtocolError: not ``{"models": [{"name": ...}, ...]}``, or an advertisement
        without its fields (a path and a positive ``max_states``; a field and a positive
        ``max_examples``).
    """
    reply = wire.decode(_MODELS, raw, "/v1/models")
    batch, examples = reply.x_systemone_batch, reply.x_question_examples
    return Listing(
        tuple(model.name for model in reply.models),
        batch.max_states if batch is not None and batch.path == BATCH_PATH else None,
        examples.max_examples
        if examples is not None and examples.field == EXAMPLES_FIELD
        else None,
    )


def decode_model_names(raw: bytes) -> tuple[str, ...]:
    """Every model name the server lists.

    :raises ProtocolError: not ``{"models": [{"name": ...}, ...]}``.
    """
    return decode_models(raw).names


# -- POST /v1/systemone/batch ---------------------------------------------------------------


def batch_body(
    model: str, states: Sequence[Any], questions: Sequence[tuple[str, Question]]
) -> dict[str, Any]:
    """The batch request asking ``questions`` about each of ``states``."""
    return batch_to_system_one(model, states, dict(questions))


@attrs.frozen
class ItemError:
    """A batch result that is an error: the one ``/v1/systemone`` would have answered."""

    status: int
    error_type: str
    message: str
    loc: tuple[str | int, ...] = ()


class _ItemErrorBody(wire.Reply):
    error_type: str
    message: str
    status: Annotated[int, msgspec.Meta(ge=400, le=599)]
    loc: list[str | int] = msgspec.field(default_factory=list)


class _Item(wire.Reply):
    error: _ItemErrorBody | None = None


class _Batch(wire.Reply):
    results: list[msgspec.Raw]


_BATCH = wire.decoder_for(_Batch)
_ITEM = wire.decoder_for(_Item)


def decode_batch(
    raw: bytes, questions: Sequence[tuple[str, Question]], count: int
) -> list[Judgment | ItemError]:
    """Each state's typed answers (as `decode_judgment` reads a single reply) or its error,
    in request order.

    :raises ProtocolError: not ``{"results": [...]}`` with ``count`` results, or a result
        that is neither an error nor a valid System One reply.
    """
    results = wire.decode(_BATCH, raw, BATCH_PATH).results
    if len(results) != count:
        raise wire.protocol_error(BATCH_PATH, f"{len(results)} results for {count} states", raw)
    decoded: list[Judgment | ItemError] = []
    for result in results:
        item = bytes(result)
        error = wire.decode(_ITEM, item, BATCH_PATH).error
        if error is None:
            decoded.append(decode_judgment(item, questions))
        else:
            decoded.append(
                ItemError(error.status, error.error_type, error.message, tuple(error.loc))
            )
    return decoded


# -- HTTP 422 -------------------------------------------------------------------------------


class _Problem(wire.Reply):
    loc: list[str | int] = msgspec.field(default_factory=list)
    msg: str = ""


class _Refusal(wire.Reply):
    detail: list[_Problem]


_REFUSAL = wire.decoder_for(_Refusal)


@attrs.frozen
class Refusal:
    """What a 422 says."""

    #: ``"loc: msg"`` of its first problem; the body's text itself when it is not the System
    #: One shape (it may be an excerpt cut short).
    message: str
    #: The problem is in the questions (``loc`` under ``["body", "questions"]``), the same for
    #: every record asked them; otherwise it is this record's (its state, its assets, or the
    #: model server's refusal of the prompt built from them).
    of_questions: bool = False
    #: The question its ``loc`` names (``["body", "questions", id, ...]``).
    question_id: str | None = None


def decode_refusal(body: str) -> Refusal:
    """What a 422 says: its first problem, and whether it names the questions."""
    try:
        detail = _REFUSAL.decode(body.encode()).detail
    except (msgspec.ValidationError, msgspec.DecodeError):
        return Refusal(body)
    if not detail:
        return Refusal(body)
    return _refusal(detail[0].loc, detail[0].msg)


def item_refusal(item: ItemError) -> Refusal:
    """What a batch item's 422 says, as `decode_refusal` reads a whole reply's."""
    return _refusal(list(item.loc), item.message)


def _refusal(loc: Sequence[str | int], msg: str) -> Refusal:
    of_questions = list(loc[:2]) == ["body", "questions"]
    question_id = str(loc[2]) if of_questions and len(loc) > 2 else None
    return Refusal(f"{'.'.join(str(part) for part in loc)}: {msg}", of_questions, question_id)
