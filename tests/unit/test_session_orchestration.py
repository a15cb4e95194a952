"""Session orchestration against the in-memory stub backend (`stubs.InMemoryStubBackend`).

A real server cannot fail questions on cue, in a chosen time order, or hang forever; this
stub can. Everything that a real server can show is also tested live in tests/live.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import anyio
import pytest

import typevet_async as tv

from .stubs import (
    InMemoryStubBackend,
    assert_takes_about,
    failing_after,
    noul,
    sleeping,
    stopwatch,
)

pytestmark = pytest.mark.asyncio

PNG = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 24, "image/png")  # 32 bytes


def session(backend: InMemoryStubBackend, **settings: Any) -> tv.Session:
    return tv.Session(backend, tv.SessionSettings(**settings))


async def test_answers_come_back_in_request_order_whatever_the_completion_order() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"a": sleeping(0.05), "b": sleeping(0.02), "c": sleeping(0.0)}
    async with session(backend, max_concurrency=3, prefix_reuse="off") as s:
        judgment = await s.judge("state", {"a": noul(), "b": noul(), "c": noul()})
    assert list(judgment) == ["a", "b", "c"]
    assert judgment.usage == tv.Usage(30, 0, 3)
    expected = 1 / (1 + math.exp(-1.0))  # softmax of (-1, -2): P(false)
    answer = judgment["a"]
    assert isinstance(answer, tv.NoulAnswer)
    assert answer.probabilities["false"] == pytest.approx(expected)


async def test_first_error_in_question_order_wins_over_time_order() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {
        # "first" fails later in time but comes first in question order.
        "first": failing_after(0.05, tv.ServerError("late", status=500, body=""), shielded=True),
        "second": failing_after(0.0, tv.ServerError("early", status=503, body="")),
    }
    async with session(backend, max_concurrency=4, prefix_reuse="off") as s:
        with pytest.raises(tv.ServerError) as caught:
            await s.judge("state", {"first": noul(), "second": noul()})
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
    async with session(backend, max_concurrency=4, prefix_reuse="off") as s:
        with stopwatch() as watch, pytest.raises(tv.ProtocolError) as caught:
            await s.judge("s", {"slow1": noul(), "bad": noul(), "slow2": noul()})
    assert caught.value.question_id == "bad"
    assert watch.elapsed < 10.0  # far below the siblings' 30 s: they were cancelled
    assert sorted(backend.cancelled) == ["slow1", "slow2"]
    assert len(asyncio.all_tasks()) == tasks_before


async def test_the_cap_is_shared_by_every_judgment_of_the_session() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {f"q{n}": sleeping(0.01) for n in range(10)}
    async with (
        session(backend, max_concurrency=3, prefix_reuse="off") as s,
        anyio.create_task_group() as group,
    ):
        for _ in range(5):
            group.start_soon(s.judge, "s", {f"q{n}": noul(n) for n in range(10)})
    assert len(backend.reads) == 50
    assert backend.peak == 3
    assert backend.probes == 1


async def test_the_backends_max_concurrency_bounds_the_session() -> None:
    capabilities = tv.Capabilities(
        framing="sdk", prefix_reuse=True, generation_images=False, max_concurrency=1
    )
    backend = InMemoryStubBackend(capabilities=capabilities)
    backend.behaviours = {f"q{n}": sleeping(0.01) for n in range(6)}

    async def generate(s: tv.Session) -> None:
        await s.generate_many(["p1", "p2", "p3"], schema=SCHEMA)

    async with (
        session(backend, max_concurrency=4, prefix_reuse="off") as s,
        anyio.create_task_group() as group,
    ):
        for _ in range(3):
            group.start_soon(s.judge, "s", {f"q{n}": noul(n) for n in range(6)})
        group.start_soon(generate, s)
    assert len(backend.reads) == 18
    assert len(backend.generated) == 3
    assert backend.peak == 1


async def test_judge_timeout_is_a_deadline_and_cancels_the_reads() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"a": sleeping(30.0), "b": sleeping(30.0)}
    tasks_before = len(asyncio.all_tasks())
    async with session(backend, prefix_reuse="off") as s:
        await s.probe()
        with stopwatch() as watch, pytest.raises(tv.DeadlineExceededError, match="judgment"):
            await s.judge("s", {"a": noul(), "b": noul()}, timeout=0.2)
    assert_takes_about(watch.elapsed, 0.2)
    assert set(backend.cancelled) == {"a", "b"}
    assert len(asyncio.all_tasks()) == tasks_before


async def test_caller_cancellation_cancels_reads() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"a": sleeping(30.0)}
    async with session(backend) as s, anyio.create_task_group() as group:
        group.start_soon(s.judge, "s", {"a": noul()})
        await anyio.sleep(0.1)
        group.cancel_scope.cancel()
    assert backend.cancelled == ["a"]


async def test_unsupported_template_fails_before_any_read() -> None:
    backend = InMemoryStubBackend(tv.TemplateFamily.DEGRADED)
    async with session(backend) as s:
        with pytest.raises(tv.UnsupportedTemplateError, match="degraded"):
            await s.judge("s", {"a": noul()})
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
    async with session(backend) as s:
        with pytest.raises(error, match=message):
            await s.judge(state, questions)
    assert backend.reads == []


async def test_a_question_over_the_backends_candidate_limit_fails_before_any_read() -> None:
    capabilities = tv.Capabilities(
        framing="server", prefix_reuse=False, generation_images=True, max_candidates=2
    )
    backend = InMemoryStubBackend(capabilities=capabilities)
    three = tv.Choice({"a": None, "b": None, "c": None}, instructions="x")
    async with session(backend) as s:
        with pytest.raises(tv.TooManyOptionsError, match=r"question 'big'.*at most 2"):
            await s.judge("s", {"ok": noul(), "big": three})
    assert backend.reads == []


async def test_json_state_is_rendered_compactly() -> None:
    backend = InMemoryStubBackend()
    async with session(backend) as s:
        judgment = await s.judge({"a": [1, 2], "b": "é"}, {"q": noul()})
    assert judgment.diagnostics["q"].prompt.startswith('<start_of_turn>user\n{"a":[1,2],"b":"é"}\n')


async def test_lifecycle() -> None:
    backend = InMemoryStubBackend()
    s = tv.Session(backend)
    assert s.settings == tv.SessionSettings()
    assert s.backend is backend
    with pytest.raises(tv.SessionStateError, match="unopened"):
        await s.judge("s", {"q": noul()})
    async with s:
        await s.open()  # a second open is a no-op
        await s.judge("s", {"q": noul()})
    await s.aclose()  # a second close too
    assert (backend.opened, backend.closed) == (1, 1)
    with pytest.raises(tv.SessionStateError, match="closed"):
        await s.judge("s", {"q": noul()})
    with pytest.raises(tv.SessionStateError, match="reopen"):
        await s.open()


async def test_a_call_for_another_model_than_the_pinned_one_sends_nothing() -> None:
    backend = InMemoryStubBackend(model="stub-model")
    async with session(backend) as s:
        with pytest.raises(tv.ConfigurationError, match="pinned to model 'stub-model'"):
            await s.judge("s", {"q": noul()}, model="other")
        judgment = await s.judge("s", {"q": noul()}, model="stub-model")
    assert list(judgment) == ["q"]
    assert backend.reads == ["q"]


async def test_per_call_overrides_are_unset_by_default_and_none_turns_the_guard_off() -> None:
    # The stub's logprobs (-1, -2) leave an off-menu mass of 1 - e^-1 - e^-2 = 0.497.
    backend = InMemoryStubBackend()
    async with session(backend, off_menu_threshold=0.1, raise_off_menu=True) as s:
        with pytest.raises(tv.OffMenuError) as caught:
            await s.judge("s", {"q": noul()})  # UNSET: the session's threshold and raise
        flagged = await s.judge("s", {"q": noul()}, raise_off_menu=False)
        off = await s.judge("s", {"q": noul()}, off_menu_threshold=None)
        await s.judge("s", {"q": noul()}, off_menu_threshold=None, max_retries=0)
    assert caught.value.threshold == 0.1
    assert caught.value.question_id == "q"
    assert flagged.diagnostics["q"].off_menu_flagged
    assert not off.diagnostics["q"].off_menu_flagged
    assert backend.retries_seen == [tv.UNSET, tv.UNSET, tv.UNSET, 0]


async def test_judge_many_takes_judges_read_options_and_model_pin() -> None:
    # The same guard as above, overridden for a whole batch at the call.
    backend = InMemoryStubBackend()
    async with session(backend, off_menu_threshold=0.1, raise_off_menu=True) as s:
        raised = [item async for item in s.judge_many(["a"], {"q": noul()})]
        flagged = [
            item async for item in s.judge_many(["a", "b"], {"q": noul()}, raise_off_menu=False)
        ]
        off = [item async for item in s.judge_many(["a"], {"q": noul()}, off_menu_threshold=None)]
        with pytest.raises(tv.InvalidInputError, match="model"):
            s.judge_many(["a"], {"q": noul()}, model="another-model")
    assert isinstance(raised[0].error, tv.OffMenuError)
    assert [item.judgment is not None for item in flagged] == [True, True]
    assert all(item.judgment.diagnostics["q"].off_menu_flagged for item in flagged if item.judgment)
    assert off[0].judgment is not None
    assert not off[0].judgment.diagnostics["q"].off_menu_flagged


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"off_menu_threshold": 2}, "off_menu_threshold"),
        ({"raise_off_menu": "yes"}, "raise_off_menu"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
    ],
)
async def test_bad_per_call_settings_of_judge_send_nothing(
    override: dict[str, Any], message: str
) -> None:
    backend = InMemoryStubBackend()
    async with session(backend) as s:
        with pytest.raises(tv.ConfigurationError, match=message):
            await s.judge("s", {"q": noul()}, **override)
    assert backend.reads == []
    assert backend.probes == 0


async def test_judge_applies_the_image_caps_before_any_request() -> None:
    backend = InMemoryStubBackend(vision=True)
    async with session(backend, max_images=1) as s:
        with pytest.raises(tv.InvalidInputError, match="at most 1"):
            await s.judge("s", {"q": noul()}, images=[PNG, PNG])
    async with session(backend, max_image_bytes=16) as s:
        with pytest.raises(tv.InvalidInputError, match="16-byte cap"):
            await s.judge("s", {"q": noul()}, images=PNG)
    assert backend.reads == []
    assert backend.probes == 0
    async with session(backend, max_images=1, max_image_bytes=32) as s:  # within both caps
        await s.judge("s", {"q": noul()}, images=PNG)
    assert backend.read_requests[0].messages[0].images == (PNG,)


async def test_images_for_a_server_without_vision_are_refused_before_any_read() -> None:
    backend = InMemoryStubBackend(vision=False)
    async with session(backend) as s:
        with pytest.raises(tv.InvalidInputError, match="does not declare vision"):
            await s.judge("s", {"q": noul()}, images=PNG)
    assert backend.reads == []


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 5}},
    "required": ["n"],
}


async def test_generate_many_keeps_request_order_and_honours_both_caps() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {f"p{n}": sleeping(0.05 - n * 0.002) for n in range(20)}
    backend.outputs = {f"p{n}": tv.ChatOutput(f'{{"n": {n % 5}}}', "stop") for n in range(20)}
    async with session(backend, max_concurrency=6) as s:
        results = await s.generate_many(
            [f"p{n}" for n in range(20)], schema=SCHEMA, max_in_flight=3
        )
    assert [r.value for r in results] == [{"n": n % 5} for n in range(20)]
    assert backend.peak == 3


async def test_generation_takes_the_sessions_max_tokens_unless_the_call_gives_one() -> None:
    backend = InMemoryStubBackend()
    async with session(backend, max_tokens=77) as s:
        await s.generate("p", schema=SCHEMA)
        await s.generate("p", schema=SCHEMA, max_tokens=5, max_retries=1)
    assert [r.max_tokens for r in backend.generation_requests] == [77, 5]
    assert backend.retries_seen == [tv.UNSET, 1]


@pytest.mark.parametrize(
    ("content", "finish", "error", "message"),
    [
        ('{"n": 9}', "stop", tv.OutputValidationError, r"at \$\.n: 9 is greater than"),
        ('{"n": 1', "length", tv.TruncatedOutputError, "cut off by the token limit"),
        ("", "stop", tv.GenerationError, "empty content"),
        ('{"n": NaN}', "stop", tv.GenerationError, "not valid JSON"),
        ('{"n": Infinity}', "stop", tv.GenerationError, "not valid JSON"),
        ("[" * 200 + "]" * 200, "stop", tv.GenerationError, "nests deeper than 128"),
    ],
)
async def test_bad_outputs_raise_typed_errors_with_the_payload(
    content: str, finish: str, error: type[tv.GenerationError], message: str
) -> None:
    backend = InMemoryStubBackend()
    backend.outputs = {"p": tv.ChatOutput(content, finish)}
    async with session(backend) as s:
        with pytest.raises(error, match=message) as caught:
            await s.generate("p", schema=SCHEMA)
    assert type(caught.value) is error
    assert caught.value.raw == content
    assert caught.value.prompt_index == 0
    if isinstance(caught.value, tv.OutputValidationError):
        assert caught.value.path == "$.n"
        assert caught.value.value == {"n": 9}


async def test_return_exceptions_puts_each_failure_in_its_place() -> None:
    backend = InMemoryStubBackend()
    backend.outputs = {"bad": tv.ChatOutput('{"n": 9}', "stop")}
    async with session(backend) as s:
        results = await s.generate_many(
            ["ok1", "bad", "ok2"], schema=SCHEMA, return_exceptions=True
        )
    assert isinstance(results[0], tv.Generation)
    assert isinstance(results[2], tv.Generation)
    error = results[1]
    assert isinstance(error, tv.OutputValidationError)
    assert error.prompt_index == 1
    assert error.question_id is None
    assert str(error).startswith("prompt 1: ")


async def test_generation_errors_carry_the_prompt_index_and_are_not_backend_errors() -> None:
    backend = InMemoryStubBackend()
    backend.outputs = {"p2": tv.ChatOutput("", "stop")}
    async with session(backend) as s:
        with pytest.raises(tv.GenerationError) as caught:
            await s.generate_many(["p0", "p1", "p2"], schema=SCHEMA)
    assert caught.value.prompt_index == 2
    assert caught.value.question_id is None
    assert str(caught.value).startswith("prompt 2: ")
    assert not isinstance(caught.value, tv.BackendError)
    assert not issubclass(tv.GenerationError, tv.BackendError)


async def test_a_backend_error_of_one_prompt_carries_its_index() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"p1": failing_after(0.0, tv.ServerError("down", status=503, body=""))}
    async with session(backend) as s:
        with pytest.raises(tv.ServerError) as caught:
            await s.generate_many(["p0", "p1"], schema=SCHEMA)
    assert caught.value.prompt_index == 1
    assert caught.value.question_id is None


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (dict(prompts=["p"], schema={"type": "nope"}), tv.SchemaError, "meta-schema"),
        (dict(prompts=["p"], schema={"$ref": "http://x/s.json"}), tv.SchemaError, "never fetched"),
        # issue 13: a reference cycle or a dangling $ref, before any request (before the fix a
        # RecursionError or jsonschema's _WrappedReferencingError, after sending).
        (dict(prompts=["p"], schema={"$ref": "#"}), tv.SchemaError, "refers to itself"),
        (
            dict(prompts=["p"], schema={"allOf": [{"$ref": "#"}]}),
            tv.SchemaError,
            "refers to itself",
        ),
        (
            dict(
                prompts=["p"],
                schema={
                    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "$ref": "#/$defs/a",
                },
            ),
            tv.SchemaError,
            "refers to itself",
        ),
        (
            dict(prompts=["p"], schema={"$ref": "#/$defs/nope"}),
            tv.SchemaError,
            "points to nothing",
        ),
        (dict(prompts="p", schema=SCHEMA), tv.InvalidInputError, "not one string"),
        (dict(prompts=[], schema=SCHEMA), tv.InvalidInputError, "prompts is empty"),
        (dict(prompts=[""], schema=SCHEMA), tv.InvalidInputError, "prompt 0"),
        (dict(prompts=["p"], schema=SCHEMA, model="other"), tv.ConfigurationError, "pinned"),
        (dict(prompts=["p"], schema=SCHEMA, max_tokens=0), tv.ConfigurationError, "max_tokens"),
        (
            dict(prompts=["p"], schema=SCHEMA, max_in_flight=0),
            tv.ConfigurationError,
            "max_in_flight",
        ),
        (
            dict(prompts=["p"], schema=SCHEMA, max_retries=-1),
            tv.ConfigurationError,
            "max_retries",
        ),
        (dict(prompts=["p"], schema=SCHEMA, timeout=0), tv.ConfigurationError, "timeout"),
    ],
)
async def test_bad_generation_input_sends_nothing(
    call: dict[str, Any], error: type[Exception], message: str
) -> None:
    backend = InMemoryStubBackend(model="stub-model")
    async with session(backend) as s:
        with pytest.raises(error, match=message):
            await s.generate_many(**call)
    assert backend.generated == []
    assert backend.probes == 0


GENERATION_WITH_IMAGES = tv.Capabilities(
    framing="server", prefix_reuse=False, generation_images=True
)


async def test_generation_applies_the_image_caps_before_any_request() -> None:
    backend = InMemoryStubBackend(capabilities=GENERATION_WITH_IMAGES)
    async with session(backend, max_images=1) as s:
        with pytest.raises(tv.InvalidInputError, match="at most 1"):
            await s.generate_many(["p"], schema=SCHEMA, images=[PNG, PNG])
    async with session(backend, max_image_bytes=16) as s:
        with pytest.raises(tv.InvalidInputError, match="16-byte cap"):
            await s.generate_many(["p"], schema=SCHEMA, images=PNG)
    assert backend.generated == []
    assert backend.probes == 0
    async with session(backend, max_images=1, max_image_bytes=32) as s:  # within both caps
        await s.generate_many(["p"], schema=SCHEMA, images=PNG)
    assert backend.generation_requests[0].images == (PNG,)


async def test_images_are_refused_where_the_backends_generation_takes_none() -> None:
    backend = InMemoryStubBackend()
    assert not backend.capabilities.generation_images
    async with session(backend) as s:
        with pytest.raises(tv.InvalidInputError, match="does not take images"):
            await s.generate("p", schema=SCHEMA, images=[PNG])
    assert backend.generated == []
    assert backend.probes == 0


async def test_generate_timeout_is_a_deadline_and_cancels_the_generation() -> None:
    backend = InMemoryStubBackend()
    backend.behaviours = {"slow": sleeping(30.0)}
    async with session(backend) as s:
        await s.probe()
        with stopwatch() as watch, pytest.raises(tv.DeadlineExceededError, match="generations"):
            await s.generate("slow", schema=SCHEMA, timeout=0.2)
    assert_takes_about(watch.elapsed, 0.2)
    assert backend.cancelled == ["slow"]


async def test_a_one_question_judgment_reads_in_the_callers_own_task() -> None:
    backend = InMemoryStubBackend()
    seen: list[asyncio.Task[Any] | None] = []

    async def record_task() -> None:
        seen.append(asyncio.current_task())

    backend.behaviours = {"only": record_task}
    async with session(backend, prefix_reuse="off") as s:
        await s.judge("state", {"only": noul()})
        assert seen == [asyncio.current_task()]  # no task group, no extra task
        backend.behaviours = {"a": record_task, "b": record_task}
        await s.judge("state", {"a": noul(), "b": noul()}, timeout=5)
    assert len(seen) == 3
    assert asyncio.current_task() not in seen[1:]  # two questions: one task each


async def test_each_question_is_bound_once_however_many_judgments_ask_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import typevet_async._session.planning as planning

    bound: list[tv.Question] = []
    original = planning.bind_question

    def counting(question: tv.Question, *args: Any) -> Any:
        bound.append(question)
        return original(question, *args)

    monkeypatch.setattr(planning, "bind_question", counting)
    refund, route = noul(1), tv.Choice(["a", "b", "c"], instructions="Route?")
    async with session(InMemoryStubBackend(), prefix_reuse="off") as s:
        for n in range(5):
            judgment = await s.judge(f"state {n}", {"refund": refund, "route": route})
            assert f"user\nstate {n}\n\nRoute?" in judgment.diagnostics["route"].prompt
    assert bound == [refund, route]  # the controls and field block were built once each


async def test_a_generated_integer_beyond_64_bits_comes_back_exact() -> None:
    backend = InMemoryStubBackend()
    backend.outputs = {"p": tv.ChatOutput('{"n": 12345678901234567890123}', "stop", 5, 3)}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    async with session(backend) as s:
        generation = await s.generate("p", schema=schema)
    assert generation.value == {"n": 12345678901234567890123}
    assert type(generation.value["n"]) is int


@pytest.mark.parametrize("layout", ["fused", "split"])
async def test_the_jev_layouts_refuse_options_that_read_the_same_there(layout: str) -> None:
    """Jev shows a described option by its description alone: two options with the same
    description (after folding) cannot be told apart there, though their labels differ."""
    backend = InMemoryStubBackend()
    same = tv.Choice({"refund": "Money\nback", "return": "Money back"}, instructions="Route?")
    async with session(backend, layout=layout) as s:
        with pytest.raises(tv.QuestionError, match="'refund' and 'return' render identically"):
            await s.judge("state", {"route": same})
        with pytest.raises(tv.QuestionError) as caught:
            s.judge_many(["state"], {"route": same})
    assert caught.value.question_id == "route"
    assert backend.probes == 0
    async with session(backend) as s:  # the default layout shows the labels: accepted
        await s.judge("state", {"route": same})
