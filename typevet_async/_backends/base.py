"""The one protocol every backend implements, and the capabilities it declares.

A session never asks which backend it holds: what differs between servers is either inside the
backend (its configuration, its HTTP client, its server's lifecycle, the request bodies) or
declared here as a `Capabilities` record that the judgment and generation pipelines read.
The README's "Writing a backend" section walks through a new one.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from typevet_async._core.generation.records import ChatOutput, GenerationRequest
from typevet_async._core.prompts.questions import Question
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.reading.probe import Probe
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import TypevetError
from typevet_async._options import Unset, boolean, one_of, optional, positive_int

__all__ = [
    "AnswerTokenizing",
    "Backend",
    "BatchJudging",
    "Capabilities",
    "Framing",
    "ReadIdentifying",
    "RemoteJudging",
    "server_of",
]

#: ``"sdk"``: the SDK frames the raw prefix in the served family's own turn markers and the
#: backend scores ``ScoringRequest.prompt`` (llama.cpp ``/completion``); the served template
#: must then be native (its turn markers the model's special tokens). ``"server"``: the
#: server applies its own chat template to ``ScoringRequest.messages`` (vLLM
#: ``/v1/chat/completions``). ``"remote"``: the server
#: judges whole judgments itself (System One, ``POST /v1/systemone``): the backend is also a
#: `RemoteJudging`, and the session calls its ``judge`` instead of planning and reading.
Framing = Literal["sdk", "server", "remote"]


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a backend can do, declared once, read by the pipelines (never by the session)."""

    framing: Framing = attrs.field(validator=one_of(Framing))
    #: The server's kind (``"llama.cpp"``, ``"vllm"``, ``"system-one"``): what a calibration
    #: map is pinned to, since servers normalise logprobs their own way.
    server: str = attrs.field(default="custom", validator=attrs.validators.instance_of(str))
    #: Whether the server keeps a read's prompt in a slot cache that the next read of the same
    #: prefix reuses, so that the session's ``prefix_reuse`` scheduling applies.
    prefix_reuse: bool = attrs.field(validator=boolean)
    #: Most candidate tokens one read can take (vLLM: 128); None for no limit.
    max_candidates: int | None = attrs.field(default=None, validator=optional(positive_int))
    #: Whether schema-bound generation may take images.
    generation_images: bool = attrs.field(validator=boolean)
    #: Whether the backend has schema-bound generation at all (System One has none).
    generation: bool = attrs.field(default=True, validator=boolean)
    #: Most requests the backend takes at once from this client whatever the session's
    #: ``max_concurrency`` (llama.cpp with ``reproducible=True``: 1); None for no limit.
    max_concurrency: int | None = attrs.field(default=None, validator=optional(positive_int))


class Backend(Protocol):
    """What a session needs from a backend.

    A backend owns its configuration, its HTTP client and, where it has one, its server's
    lifecycle. The session calls `open` once before anything else and `aclose` once at the end;
    `probe` once, then any number of concurrent `read` and `generate` calls (the session's
    semaphore bounds them).
    """

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do (constant for its lifetime)."""
        ...

    @property
    def model(self) -> str | None:
        """The model every request is pinned to, if any."""
        ...

    async def open(self) -> None:
        """Open the connection pool (and start the server, for an embedded one).

        :raises SessionStateError: the backend was closed.
        """
        ...

    async def aclose(self) -> None:
        """Close the pool (and stop an embedded server). Safe to call twice."""
        ...

    async def probe(self) -> Probe:
        """Classify the served template, find the controls' token ids and the vocabulary size.

        :raises ConfigurationError: the server does not serve the pinned model.
        :raises BackendError: the server could not be read.
        """
        ...

    async def read(
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        """The candidates' full-vocabulary logprobs at the answer position of ``request``.

        ``max_retries`` `UNSET`: the backend's retry policy.

        :raises BackendError: the read failed, or its logprobs failed validation.
        """
        ...

    async def special_runs(self, runs: Sequence[str]) -> frozenset[str] | None:
        """Which of ``runs`` (marker runs of caller text: `typevet_async._core.prompts.markers`) the
        served tokenizer reads as special tokens; None if the backend cannot tell (every run is
        then neutralised).

        :raises BackendError: the tokenizer could not be asked.
        """
        ...

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        """One schema-bound chat completion, as the server returned it (the pipeline parses
        and validates it).

        :raises BackendError: the request failed.
        """
        ...


@runtime_checkable
class RemoteJudging(Protocol):
    """What a backend whose `Capabilities` say ``framing="remote"`` adds: it sends a whole
    judgment to a server that judges it, and returns the typed answers."""

    async def judge(
        self,
        state: Any,
        questions: Sequence[tuple[str, Question]],
        probe: Probe,
        *,
        max_retries: int | Unset,
    ) -> Judgment:
        """The server's answers to ``questions`` about ``state`` (a string or JSON value, as
        the caller gave it; already checked), in question order.

        :raises BackendError: the request failed, or the server's answers failed validation.
        :raises QuestionError: the server refused the questions (HTTP 422).
        """
        ...


@runtime_checkable
class AnswerTokenizing(Protocol):
    """What a backend adds that can say how the served tokenizer writes an answer where a
    judgment's answer starts: what a question with more options than single-token controls
    needs to bind two-token codes (`typevet_async._core.prompts.codes`). A backend without it keeps
    the single controls' limit."""

    async def answer_tokens(self, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """The tokens of the probe's prompt up to the answer position, and of the same prompt
        followed by each of ``answers``, in order (as `Backend.probe` tokenizes controls).

        :raises BackendError: the tokenizer could not be asked.
        """
        ...


@runtime_checkable
class BatchJudging(Protocol):
    """What a `RemoteJudging` backend adds when its server may judge several states, the same
    questions, in one request (System One's ``POST /v1/systemone/batch``). `judge_many` sends
    its records through it while `batch_limit` is not None, and one by one otherwise."""

    @property
    def batch_limit(self) -> int | None:
        """States one batch request may carry, as the probe learned it; None: the server
        offers no batch (not advertised, or it answered 404/405)."""
        ...

    async def judge_batch(
        self,
        states: Sequence[Any],
        questions: Sequence[tuple[str, Question]],
        probe: Probe,
        *,
        max_retries: int | Unset,
    ) -> list[Judgment | TypevetError | None] | None:
        """Each state's answers or its own error, in order; an item None: a transient failure
        of that state alone (judge it alone, under the retry policy). None for the whole batch:
        the server does not offer batches after all (`batch_limit` is None from now on).

        :raises BackendError: the request failed (after retries), or its reply is malformed.
        :raises QuestionError: the server refused the questions.
        """
        ...


@runtime_checkable
class ReadIdentifying(Protocol):
    """What a backend adds whose reads a session's read cache may keep
    (`typevet_async._session.read_cache`): a text naming everything about the backend that decides a
    read's bytes. Two backends with the same identity, the same probe and the same request must
    be sent the same read; anything that could make them differ belongs in it (its kind, where
    the server is, the served model it is pinned to, every setting of how it reads: llama.cpp's
    first top-K rule, ``on_missing``, reproducible mode; vLLM's logprobs mode). A backend
    without it (System One, OpenAI Decisions: their servers judge whole judgments) is not
    cached."""

    def read_identity(self) -> str | None:
        """The backend's read identity (once open: an embedded server's is its options and
        model file, not its port); None: this backend's reads may not be cached."""
        ...


def server_of(base_url: str | None) -> str | None:
    """``base_url`` without its user and password: which server a read identity names (the
    credentials decide who may read, not what is read; and an identity is text a caller may
    print)."""
    if base_url is None:
        return None
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
