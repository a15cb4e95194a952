"""A System One server (``POST /v1/systemone``): the server judges; the session asks.

Ours (``typevet-async serve``), vLLM's for its decision models, the hosted API: any server of
the common wire. Unlike llama.cpp and vLLM, which the SDK reads one question at a time at the
answer position, a System One server takes a whole judgment (the state and every question) in
one request and answers with probabilities. So this backend's `Capabilities` say
``framing="remote"``: the session calls `AsyncSystemOne.judge`, never ``read``, and the answers
are rebuilt from the server's probabilities by the SDK's own rules
(`typevet_async._core.wires.system_one.answers_from_system_one`), after checking them; each answer's
``confidence`` is the server's, as it sent it.

What differs from a logprob backend, by design:

- no template, control tokens or vocabulary are probed: ``GET /v1/models`` only, to check the
  pinned model (or pick the first listed);
- diagnostics are only those our own gateway sends in its ``x_typevet`` extension (prompts,
  logprobs, off-menu mass of the server-side reads; ``typevet`` from gateways before issue
  33); another server shows no logprobs;
- no schema-bound generation, no images (yet): both are refused before anything is sent;
- an HTTP 422 that names the questions is a `QuestionError` and a 501 (the server does not
  judge with this model: vLLM's answer for a Gemma) an `UnsupportedTemplateError`: both would
  be the same for every record of a batch, which fails once. Any other 422 (a state the
  server refused, a prompt past the model's context) is that record's `InvalidInputError`: a
  batch goes on past it, as it does on a direct session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NoReturn

import attrs

from typevet_async._backends.http import Attempts
from typevet_async._backends.remote import RemoteConfig, RemoteJudge, remote_capabilities
from typevet_async._backends.retrying import is_transient
from typevet_async._backends.system_one_wire import (
    BATCH_PATH,
    PATH,
    ItemError,
    Refusal,
    batch_body,
    decode_batch,
    decode_judgment,
    decode_models,
    decode_refusal,
    item_refusal,
    judgment_body,
)
from typevet_async._core.prompts.framing import TemplateFamily
from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.reading.probe import Probe
from typevet_async._core.wires.system_one import UnsupportedQuestionError
from typevet_async._errors import (
    InvalidInputError,
    QuestionError,
    RequestTimeoutError,
    ServerError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async._options import Unset, positive_int

__all__ = [
    "DEFAULT_MAX_BATCH_STATES",
    "SESSION_SETTINGS_REFUSED",
    "AsyncSystemOne",
    "SystemOneConfig",
]

#: Session settings a System One session refuses: the server frames and reads the questions
#: itself, so they could not apply (a server of ours divides its batch route's answers by its
#: own ``batch_calibration``).
SESSION_SETTINGS_REFUSED: Final = frozenset(
    {
        "layout",
        "prefix_reuse",
        "off_menu_threshold",
        "batch_calibration",
        "batch_calibration_window",
    }
)


#: The most states one batch request carries, whatever the server advertises: the
#: advertisement is the server's (or a proxy's) word, and ``judge_many`` keeps a record in
#: flight per state it may send, so an advertised 300,000 once made a 3-record batch start
#: 300,000 workers (16-18 s, 1 GB). 64 is our gateway's default cap.
DEFAULT_MAX_BATCH_STATES: Final = 64


@attrs.frozen(kw_only=True)
class SystemOneConfig(RemoteConfig):
    """A System One backend's settings; checked when built.

    :param base_url: the server's root (``/v1/systemone`` and ``/v1/models`` are under it).
    :param model: the model every request names; None: the first the server lists.
    :param max_batch_states: the most states one ``POST /v1/systemone/batch`` carries: the
        server's advertised ``max_states``, but never more than this.
    """

    max_batch_states: int = attrs.field(default=DEFAULT_MAX_BATCH_STATES, validator=positive_int)


class AsyncSystemOne(RemoteJudge):
    """Judgment client for ``POST /v1/systemone``."""

    wire_name = "System One"
    _capabilities = remote_capabilities("system-one")

    config: SystemOneConfig

    def __init__(self, config: SystemOneConfig) -> None:
        super().__init__(config)
        #: States per batch request, as the server advertises it (None: no batch route).
        self._batch_limit: int | None = None
        #: Examples a question may carry, as the server advertises it (None: it reads none).
        self._max_examples: int | None = None

    async def probe(self) -> Probe:
        """The models the server lists; the pinned one must be among them.

        :raises ConfigurationError: the pinned model is not listed, or none is.
        """
        listing = decode_models(await self.http.get("/v1/models"))
        # Taken up to our own cap, never as advertised (DEFAULT_MAX_BATCH_STATES says why).
        cap, advertised = self.config.max_batch_states, listing.max_states
        self._batch_limit = None if advertised is None else min(advertised, cap)
        self._max_examples = listing.max_examples
        return self.listed_models(listing.names)

    def _refuse_unread_examples(self, questions: Sequence[tuple[str, Question]]) -> None:
        """Examples go only to a server that advertises reading them (any other ignores the
        ``x_examples`` field and would answer without them), at most as many as it takes.

        :raises UnsupportedQuestionError: a question with examples the server would not
            read (nothing is sent).
        """
        for question_id, question in questions:
            count, most = len(question.examples), self._max_examples
            if not count or (most is not None and count <= most):
                continue
            error = UnsupportedQuestionError(
                f"question {question_id!r} has {count} examples and the System One server "
                + (
                    "does not say it reads them (no x_question_examples in GET /v1/models): "
                    "it would answer without them; ask it without examples"
                    if most is None
                    else f"reads at most {most} a question"
                )
                + "; nothing was sent"
            )
            error.question_id = question_id
            raise error

    async def judge(
        self,
        state: Any,
        questions: Sequence[tuple[str, Question]],
        probe: Probe,
        *,
        max_retries: int | Unset,
    ) -> Judgment:
        """One ``POST /v1/systemone`` for the whole judgment, retried like any read (it is
        idempotent); the answers checked and typed."""
        self._refuse_unread_examples(questions)
        model = self.request_model(probe)
        attempts = Attempts()
        try:
            raw = await self.http.post(
                PATH,
                judgment_body(model, state, questions),
                max_retries=max_retries,
                attempts=attempts,
            )
        except ServerError as error:
            if error.status in (422, 501):
                _refused(error, model)
            raise
        return decode_judgment(raw, questions)

    @property
    def batch_limit(self) -> int | None:
        """States one ``POST /v1/systemone/batch`` carries: the server's advertised
        ``max_states``, at most the config's ``max_batch_states`` (None: not offered)."""
        return self._batch_limit

    async def judge_batch(
        self,
        states: Sequence[Any],
        questions: Sequence[tuple[str, Question]],
        probe: Probe,
        *,
        max_retries: int | Unset,
    ) -> list[Judgment | TypevetError | None] | None:
        """One ``POST /v1/systemone/batch`` for ``states``, retried like any request; each
        result typed as `judge` types a reply, each item error as `judge` would raise it.

        A 404 or 405 means the route is not offered (an older server): None, and no batch is
        sent again. A 413 or a 422 not about the questions (a body or a count the server will
        not take whole): every state is judged alone. So is every state of a batch that
        outlived ``request_timeout``: it is not sent again whole (it would run as long again),
        each state goes alone under the retry policy.
        """
        self._refuse_unread_examples(questions)
        model = self.request_model(probe)
        try:
            raw = await self.http.post(
                BATCH_PATH,
                batch_body(model, states, questions),
                max_retries=max_retries,
                retry_timeouts=False,
            )
        except RequestTimeoutError:
            return [None] * len(states)
        except ServerError as error:
            if error.status in (404, 405):
                self._batch_limit = None
                return None
            if error.status == 413 or (
                error.status == 422 and not decode_refusal(error.body).of_questions
            ):
                return [None] * len(states)
            if error.status in (422, 501):
                _refused(error, model)
            raise
        return [
            _item_failure(result, model) if isinstance(result, ItemError) else result
            for result in decode_batch(raw, questions, len(states))
        ]


def _refused(error: ServerError, model: str) -> NoReturn:
    """A 422 or 501 reply as `_refusal_error` says."""
    raise _refusal_error(error.status, decode_refusal(error.body), model) from None


def _refusal_error(status: int, refusal: Refusal, model: str) -> TypevetError:
    """A 422 naming the questions as the `QuestionError` it is (the same for every record: a
    batch stops once), any other 422 as this record's `InvalidInputError` (its state, or the
    model server's refusal of the prompt built from it: the batch goes on), a 501 as an
    `UnsupportedTemplateError`."""
    if status == 422 and refusal.of_questions:
        refused = QuestionError(f"the System One server refused the questions: {refusal.message}")
        refused.question_id = refusal.question_id
        return refused
    if status == 422:
        return InvalidInputError(
            f"the System One server refused this record (HTTP 422): {refusal.message}"
        )
    return UnsupportedTemplateError(
        f"the System One server does not judge with model {model!r} (HTTP 501: {refusal.message})",
        family=TemplateFamily.REMOTE.value,
        rendered="",
    )


def _item_failure(item: ItemError, model: str) -> TypevetError | None:
    """A batch item's error as `judge` would have raised it for that state alone; None for a
    transient one (judged alone, under the retry policy)."""
    failure = ServerError(
        f"the System One server failed this record (HTTP {item.status}): {item.message}",
        status=item.status,
        body=item.message,
    )
    if is_transient(failure):
        return None
    if item.status in (422, 501):
        return _refusal_error(item.status, item_refusal(item), model)
    return failure
