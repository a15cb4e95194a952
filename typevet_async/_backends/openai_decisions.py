"""A server of OpenAI's Decisions API (``POST /v1/decisions``): the server judges; the session
asks. Ours (``typevet-async serve``) or any other of the same wire.

Like `typevet_async._backends.system_one`, its `Capabilities` say ``framing="remote"``: each
judgment is one request with the state and every question (named by their ids), and the
answers (a list in question order) are checked and rebuilt by the SDK's own rules
(`typevet_async._core.wires.decisions.answers_from_decisions`). What differs from System One:

- a question the server refuses (an answer of type ``refusal``; our gateway refuses where its
  off-menu guard flags the answer) raises `RefusalError`, which names the refused questions
  and carries the typed answers to the others;
- a Noul with criteria is refused before anything is sent (a predicate has instructions
  only); images and generation are refused unsent, as on System One;
- no diagnostics: the wire carries no logprobs.

The probe reads ``GET /v1/models``, in OpenAI's shape (``data[].id``) or System One's
(``models[].name``, as our gateway lists), to check the pinned model or pick the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final, NoReturn

import msgspec

from typevet_async._backends import wire
from typevet_async._backends.remote import RemoteConfig, RemoteJudge, remote_capabilities
from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Judgment, Usage
from typevet_async._core.reading.probe import Probe
from typevet_async._core.wires.decisions import (
    DecisionsAnswer,
    answers_from_decisions,
    request_to_decisions,
)
from typevet_async._errors import (
    InvalidInputError,
    QuestionError,
    RefusalError,
    ServerError,
)
from typevet_async._options import Unset

__all__ = ["AsyncOpenAIDecisions", "OpenAIDecisionsConfig", "decode_decisions"]

PATH: Final = "/v1/decisions"

Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class _Predicate(wire.Reply, tag="predicate", tag_field="type"):
    probability: Probability
    name: str | None = None


class _Value(wire.Reply):
    value: str | bool
    probability: Probability


class _Choice(wire.Reply, tag="choice", tag_field="type"):
    choice: str | bool
    confidence: Probability
    probabilities: list[_Value]
    name: str | None = None


class _Level(wire.Reply):
    label: str
    value: int
    probability: Probability


class _Score(wire.Reply, tag="score", tag_field="type"):
    score: float
    confidence: Probability
    probabilities: list[_Level]
    name: str | None = None


class _Refusal(wire.Reply, tag="refusal", tag_field="type"):
    name: str | None = None


class _InputDetails(wire.Reply):
    cached_tokens: wire.Count = 0


class _Usage(wire.Reply):
    input_tokens: wire.Count
    input_tokens_details: _InputDetails | None = None


class _Decision(wire.Reply):
    answers: list[_Predicate | _Choice | _Score | _Refusal]
    usage: _Usage


class _Model(wire.Reply):
    id: str


class _Named(wire.Reply):
    name: str


class _Models(wire.Reply):
    data: list[_Model] | None = None
    models: list[_Named] | None = None


_DECISION = wire.decoder_for(_Decision)
_MODELS = wire.decoder_for(_Models)


def _answer(sent: _Predicate | _Choice | _Score | _Refusal) -> DecisionsAnswer:
    if isinstance(sent, _Predicate):
        return DecisionsAnswer("predicate", sent.name, probability=sent.probability)
    if isinstance(sent, _Choice):
        pairs = tuple((item.value, item.probability) for item in sent.probabilities)
        return DecisionsAnswer(
            "choice", sent.name, probabilities=pairs, choice=sent.choice, confidence=sent.confidence
        )
    if isinstance(sent, _Score):
        pairs = tuple((item.label, item.probability) for item in sent.probabilities)
        first = sent.probabilities[0].value if sent.probabilities else 0
        return DecisionsAnswer(
            "score",
            sent.name,
            probabilities=pairs,
            score=sent.score,
            confidence=sent.confidence,
            first_level=first,
        )
    return DecisionsAnswer("refusal", sent.name)


def decode_decisions(raw: bytes, questions: Sequence[tuple[str, Question]]) -> Judgment:
    """The typed answers to ``questions`` from a Decisions response.

    :raises ProtocolError: not the Decisions shape, or answers that fail the check.
    :raises RefusalError: the server refused some questions (the others' answers with it).
    """
    reply = wire.decode(_DECISION, raw, PATH)
    answers, refused = answers_from_decisions(questions, [_answer(a) for a in reply.answers])
    details = reply.usage.input_tokens_details
    usage = Usage(reply.usage.input_tokens, details.cached_tokens if details else 0, 1)
    if refused:
        raise RefusalError(
            f"the Decisions server refused to answer {', '.join(map(repr, refused))}",
            refused=refused,
            answers=Judgment(answers, usage),
        )
    return Judgment(answers, usage)


class OpenAIDecisionsConfig(RemoteConfig):
    """A Decisions backend's settings; checked when built.

    :param base_url: the server's root (``/v1/decisions`` and ``/v1/models`` are under it).
    :param model: the model every request names; None: the first the server lists.
    """


class AsyncOpenAIDecisions(RemoteJudge):
    """Judgment client for ``POST /v1/decisions``."""

    wire_name = "Decisions"
    _capabilities = remote_capabilities("openai-decisions")

    async def probe(self) -> Probe:
        """The models the server lists; the pinned one must be among them.

        :raises ConfigurationError: the pinned model is not listed, or none is.
        """
        listed = wire.decode(_MODELS, await self.http.get("/v1/models"), "/v1/models")
        names = tuple(m.id for m in listed.data or ()) + tuple(m.name for m in listed.models or ())
        return self.listed_models(names)

    async def judge(
        self,
        state: Any,
        questions: Sequence[tuple[str, Question]],
        probe: Probe,
        *,
        max_retries: int | Unset,
    ) -> Judgment:
        """One ``POST /v1/decisions`` for the whole judgment, retried like any read (it is
        idempotent); the answers checked and typed.

        :raises QuestionError: a Noul with criteria, or a question with examples (nothing sent).
        :raises InvalidInputError: the server refused the request (HTTP 400 or 422).
        :raises RefusalError: the server refused some questions.
        """
        body = request_to_decisions(self.request_model(probe), state, questions)
        try:
            raw = await self.http.post(PATH, body, max_retries=max_retries)
        except ServerError as error:
            if error.status in (400, 422):
                _refused(error, questions)
            raise
        return decode_decisions(raw, questions)


class _ErrorBody(wire.Reply):
    message: str = ""
    param: str | None = None


class _Error(wire.Reply):
    error: _ErrorBody


_ERROR: Final = wire.decoder_for(_Error)


def _refused(error: ServerError, questions: Sequence[tuple[str, Question]]) -> NoReturn:
    """A 400 or 422 whose ``param`` names a question (``questions[N]...``) as the
    `QuestionError` it is (the same for every record: a batch stops once); any other as this
    record's `InvalidInputError`."""
    try:
        said = _ERROR.decode(error.body.encode()).error
        message, param = said.message or error.body[:500], said.param or ""
    except (msgspec.ValidationError, msgspec.DecodeError):
        message, param = error.body[:500], ""
    text = f"the Decisions server refused the request (HTTP {error.status}): {message}"
    index = _question_index(param)
    if index is not None and index < len(questions):
        refused = QuestionError(text)
        refused.question_id = questions[index][0]
        raise refused from None
    raise InvalidInputError(text) from None


def _question_index(param: str) -> int | None:
    """The question a ``param`` names: ``questions[N]`` (OpenAI's spelling, and our gateway's
    for every refusal since issue 43), or ``questions.N`` (our gateway's for a refusal while
    judging before it, so a batch against such a gateway still stops once)."""
    if param.startswith("questions["):
        index = param.removeprefix("questions[").partition("]")[0]
    elif param.startswith("questions."):
        index = param.removeprefix("questions.").partition(".")[0].partition("[")[0]
    else:
        return None
    return int(index) if index.isascii() and index.isdecimal() else None
