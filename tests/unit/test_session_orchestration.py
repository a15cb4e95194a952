"""Session orchestration against an in-memory stub backend (named as such).

A real server cannot fail questions on cue, in a chosen time order, or hang forever; this
stub can. Everything that a real server can show is also tested live in tests/live.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import typevet_async as tv
from typevet_async._core.controls import DIGITS
from typevet_async._core.generation import ChatOutput
from typevet_async._core.readings import CandidateRead
from typevet_async._core.scoring import ScoringRequest

pytestmark = pytest.mark.asyncio

IDS = {digit: 1000 + int(digit) for digit in DIGITS}
Behaviour = Callable[[ScoringRequest], Awaitable[None]]


class InMemoryStubBackend:
    """A scoring backend with scripted delays and failures per question id."""

    frames_prompt = True
    accepts_images = False

    def __init__(self, family: tv.TemplateFamily = tv.TemplateFamily.GEMMA3) -> None:
        self.family = family
        self.outputs: dict[str, ChatOutput] = {}
        self.generated: list[str] = []
        self.behaviours: dict[str, Behaviour] = {}
        self.probes = 0
        self.reads: list[str] = []
        self.in_flight = 0
        self.peak = 0
        self.cancelled: list[str] = []

    async def probe(self) -> tv.Probe:
        self.probes += 1
        await anyio.sleep(0.01)
        return tv.Probe(self.family, "rendered", IDS, 262_144, ("stub-model",))

    async def read(
        self, request: ScoringRequest, vocab_size: int, *, max_retries: int | None = None
    ) -> CandidateRead:
        self.reads.append(request.question_id)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            behaviour = self.behaviours.get(request.question_id)
            if behaviour is not None:
                await behaviour(request)
            else:
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(request.question_id)
            raise
        finally:
            self.in_flight -= 1
        logprobs = tuple(-1.0 - index for index in range(len(request.token_ids)))
        return CandidateRead(request.token_ids, logprobs, 4096, 1, 10, 0)

    async def generate(
        self,
        prompt: str,
        schema: Any,
        images: Sequence[tv.Image],
        max_tokens: int,
        *,
        max_retries: int | None = None,
    ) -> ChatOutput:
        self.generated.append(prompt)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            behaviour = self.behaviours.get(prompt)
            if behaviour is not None:
                await behaviour(ScoringRequest(prompt, tv.Noul(instructions="x"), (), "", (), ()))
            else:
                await anyio.sleep(0.01)
        finally:
            self.in_flight -= 1
        return self.outputs.get(prompt, ChatOutput('{"n": 1}', "stop", 5, 3))


def sleeping(seconds: float) -> Behaviour:
    async def behaviour(_: ScoringRequest) -> None:
        await anyio.sleep(seconds)

    return behaviour


def failing_after(seconds: float, error: Exception, *, shielded: bool = False) -> Behaviour:
    async def behaviour(_: ScoringRequest) -> None:
        with anyio.CancelScope(shield=shielded):
            await anyio.sleep(seconds)
        raise error

    return behaviour


def noul(n: int = 0) -> tv.Noul:
    return tv.Noul(instructions=f"Question {n}?")


async def test_answers_come_back_in_request_order_whatever_the_completion_order() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"a": sleeping(0.05), "b": sleeping(0.02), "c": sleeping(0.0)}
    async with tv.Session(backend, max_concurrency=3, prefix_reuse="off") as session:
        judgment = await session.judge("state", {"a": noul(), "b": noul(), "c": noul()})
    assert list(judgment) == ["a", "b", "c"]
    assert judgment.usage == tv.Usage(30, 0, 3)
    expected = 1 / (1 + math.exp(-1.0))  # softmax of (-1, -2): P(false)
    assert judgment["a"].probabilities["false"] == pytest.approx(expected)


async def test_first_error_in_question_order_wins_over_time_order() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {
        # "first" fails later in time but comes first in question order.
        "first": failing_after(0.05, tv.ServerError("late", status=500, body=""), shielded=True),
        "second": failing_after(0.0, tv.ServerError("early", status=503, body="")),
    }
    async with tv.Session(backend, max_concurrency=4, prefix_reuse="off") as session:
        with pytest.raises(tv.ServerError) as caught:
            await session.judge("state", {"first": noul(), "second": noul()})
    assert caught.value.question_id == "first"
    assert caught.value.status == 500


async def test_a_failure_cancels_its_siblings_and_leaves_no_task() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {
        "slow1": sleeping(30.0),
        "slow2": sleeping(30.0),
        "bad": failing_after(0.01, tv.ProtocolError("broken")),
    }
    tasks_before = len(asyncio.all_tasks())
    async with tv.Session(backend, max_concurrency=4, prefix_reuse="off") as session:
        started = time.monotonic()
        with pytest.raises(tv.ProtocolError) as caught:
            await session.judge("s", {"slow1": noul(), "bad": noul(), "slow2": noul()})
        elapsed = time.monotonic() - started
    assert caught.value.question_id == "bad"
    assert elapsed < 1.0
    assert sorted(backend.cancelled) == ["slow1", "slow2"]
    assert len(asyncio.all_tasks()) == tasks_before


async def test_the_cap_is_shared_by_every_judgment_of_the_session() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {f"q{n}": sleeping(0.01) for n in range(10)}
    async with (
        tv.Session(backend, max_concurrency=3, prefix_reuse="off") as session,
        anyio.create_task_group() as group,
    ):
        for _ in range(5):
            group.start_soon(session.judge, "s", {f"q{n}": noul(n) for n in range(10)})
    assert len(backend.reads) == 50
    assert backend.peak == 3
    assert backend.probes == 1


async def test_whole_judgment_timeout_fires_on_time_and_cancels_reads() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"a": sleeping(30.0), "b": sleeping(30.0)}
    tasks_before = len(asyncio.all_tasks())
    async with tv.Session(backend, prefix_reuse="off") as session:
        await session.probe()
        started = time.monotonic()
        with pytest.raises(tv.JudgmentTimeoutError):
            await session.judge("s", {"a": noul(), "b": noul()}, timeout=0.2)
        elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 0.3
    assert set(backend.cancelled) == {"a", "b"}
    assert len(asyncio.all_tasks()) == tasks_before


async def test_caller_cancellation_cancels_reads() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"a": sleeping(30.0)}
    async with tv.Session(backend) as session, anyio.create_task_group() as group:
        group.start_soon(session.judge, "s", {"a": noul()})
        await anyio.sleep(0.1)
        group.cancel_scope.cancel()
    assert backend.cancelled == ["a"]


async def test_unsupported_template_fails_before_any_read() -> None:
    backend = InMemoryStubBackend(tv.TemplateFamily.CHATML)
    async with tv.Session(backend) as session:
        with pytest.raises(tv.UnsupportedTemplateError, match="chatml"):
            await session.judge("s", {"a": noul()})
    assert backend.reads == []


@pytest.mark.parametrize(
    ("state", "questions", "error", "message"),
    [
        ("s", {}, tv.QuestionError, "non-empty mapping"),
        ("s", {"": noul()}, tv.QuestionError, "non-empty strings"),
        ("s", {"q": "Is it?"}, tv.QuestionError, "question 'q': expected a Noul"),
        (object(), {"q": noul()}, tv.InvalidInputError, "JSON value"),
        (
            "s",
            {"ok": noul(), "big": tv.Choice({f"l{n}": None for n in range(12)}, instructions="x")},
            tv.TooManyOptionsError,
            "question 'big': 12 options",
        ),
    ],
)
async def test_bad_input_fails_before_any_read(
    state: Any, questions: Any, error: type[Exception], message: str
) -> None:
    backend = InMemoryStubBackend()
    async with tv.Session(backend) as session:
        with pytest.raises(error, match=message):
            await session.judge(state, questions)
    assert backend.reads == []


async def test_json_state_is_rendered_compactly() -> None:
    backend = InMemoryStubBackend()
    async with tv.Session(backend) as session:
        judgment = await session.judge({"a": [1, 2], "b": "é"}, {"q": noul()})
    assert judgment.diagnostics["q"].prompt.startswith('<start_of_turn>user\n{"a":[1,2],"b":"é"}\n')


async def test_lifecycle() -> None:
    session = tv.Session(InMemoryStubBackend())
    with pytest.raises(tv.SessionStateError, match="unopened"):
        await session.judge("s", {"q": noul()})
    async with session:
        await session.judge("s", {"q": noul()})
    with pytest.raises(tv.SessionStateError, match="closed"):
        await session.judge("s", {"q": noul()})
    with pytest.raises(tv.SessionStateError, match="reopen"):
        await session.open()


async def test_pinned_model_is_checked_at_probe() -> None:
    async with tv.Session(InMemoryStubBackend(), model="other") as session:
        with pytest.raises(tv.ConfigurationError, match="pinned to model 'other'"):
            await session.judge("s", {"q": noul()})


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 5}},
    "required": ["n"],
}


async def test_generate_many_keeps_request_order_and_honours_both_caps() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {f"p{n}": sleeping(0.05 - n * 0.002) for n in range(20)}
    backend.outputs = {f"p{n}": ChatOutput(f'{{"n": {n % 5}}}', "stop") for n in range(20)}
    async with tv.Session(backend, max_concurrency=6) as session:
        results = await session.generate_many(
            [f"p{n}" for n in range(20)], schema=SCHEMA, max_concurrency=3
        )
    assert [r.value for r in results] == [{"n": n % 5} for n in range(20)]  # type: ignore[union-attr]
    assert backend.peak == 3


@pytest.mark.parametrize(
    ("content", "finish", "error", "message"),
    [
        ('{"n": 9}', "stop", tv.OutputValidationError, r"at \$\.n: 9 is greater than"),
        ('{"n": 1', "length", tv.TruncatedOutputError, "cut off by the token limit"),
        ("", "stop", tv.GenerationError, "empty content"),
        ('{"n": NaN}', "stop", tv.GenerationError, "not valid JSON"),
        ('{"n": Infinity}', "stop", tv.GenerationError, "not valid JSON"),
    ],
)
async def test_bad_outputs_raise_typed_errors_with_the_payload(
    content: str, finish: str, error: type[tv.GenerationError], message: str
) -> None:
    backend = InMemoryStubBackend()
    backend.outputs = {"p": ChatOutput(content, finish)}
    async with tv.Session(backend) as session:
        with pytest.raises(error, match=message) as caught:
            await session.generate("p", schema=SCHEMA)
    assert caught.value.raw == content
    if isinstance(caught.value, tv.OutputValidationError):
        assert caught.value.path == "$.n"
        assert caught.value.value == {"n": 9}


async def test_return_exceptions_puts_each_failure_in_its_place() -> None:
    backend = InMemoryStubBackend()
    backend.outputs = {"bad": ChatOutput('{"n": 9}', "stop")}
    async with tv.Session(backend) as session:
        results = await session.generate_many(
            ["ok1", "bad", "ok2"], schema=SCHEMA, return_exceptions=True
        )
    assert isinstance(results[0], tv.Generation)
    assert isinstance(results[1], tv.OutputValidationError)
    assert results[1].question_id == "prompt 1"
    assert isinstance(results[2], tv.Generation)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (dict(prompts=["p"], schema={"type": "nope"}), tv.SchemaError, "meta-schema"),
        (dict(prompts=["p"], schema={"$ref": "http://x/s.json"}), tv.SchemaError, "never fetched"),
        (dict(prompts="p", schema=SCHEMA), tv.InvalidInputError, "not one string"),
        (dict(prompts=[""], schema=SCHEMA), tv.InvalidInputError, "prompt 0"),
        (dict(prompts=["p"], schema=SCHEMA, model="other"), tv.ConfigurationError, "pinned"),
        (dict(prompts=["p"], schema=SCHEMA, max_tokens=0), tv.ConfigurationError, "max_tokens"),
    ],
)
async def test_bad_generation_input_sends_nothing(
    call: dict[str, Any], error: type[Exception], message: str
) -> None:
    backend = InMemoryStubBackend()
    async with tv.Session(backend, model="stub-model") as session:
        with pytest.raises(error, match=message):
            await session.generate_many(**call)
    assert backend.generated == []
    assert backend.probes == 0


async def test_images_are_refused_where_the_backend_takes_none() -> None:
    png = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 16, "image/png")
    backend = InMemoryStubBackend()
    async with tv.Session(backend) as session:
        with pytest.raises(tv.InvalidInputError, match="does not take images"):
            await session.generate("p", schema=SCHEMA, images=[png])
    assert backend.generated == []


async def test_generation_deadline() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"slow": sleeping(30.0)}
    async with tv.Session(backend) as session:
        with pytest.raises(tv.DeadlineExceededError):
            await session.generate("slow", schema=SCHEMA, timeout=0.1)
