"""Batch calibration through `judge_many` against the in-memory stub backend (a stub whose
answers lean as each state says: a real server cannot be told what to answer): the arithmetic
against a hand division of the same session's uncalibrated answers, finite inputs and streams,
ordered and not, error items, the warm-up, the floor and the refusals."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import anyio
import pytest

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig, running
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.statistics.batch_judgments import ALONE, StreamCalibration
from typevet_async._core.statistics.calibration import (
    CalibrationMap,
    Pins,
    QuestionMap,
    Reading,
    Temperature,
    question_hash,
    question_set_hash,
)
from typevet_async._core.wires.system_one import BATCH_PATH

from .stubs import InMemoryStubBackend, failing_after, state_of

ROUTE = tv.Choice(["billing", "bug", "other"], instructions="Route it.")
QUESTIONS = {"route": ROUTE}
#: Twenty-four states' answers (option order), leaning to "billing" whatever the state says:
#: enough for the floor of a three-option question (16) and a stream past its warm-up.
LEANING = [
    (0.7, 0.2, 0.1),
    (0.6, 0.3, 0.1),
    (0.8, 0.1, 0.1),
    (0.5, 0.4, 0.1),
    (0.4, 0.2, 0.4),
    (0.7, 0.1, 0.2),
    (0.6, 0.2, 0.2),
    (0.5, 0.1, 0.4),
    (0.45, 0.45, 0.1),
    (0.9, 0.05, 0.05),
    (0.4, 0.3, 0.3),
    (0.55, 0.35, 0.1),
    (0.65, 0.25, 0.1),
    (0.5, 0.3, 0.2),
    (0.75, 0.15, 0.1),
    (0.6, 0.1, 0.3),
    (0.35, 0.35, 0.3),
    (0.8, 0.15, 0.05),
    (0.55, 0.2, 0.25),
    (0.45, 0.25, 0.3),
    (0.7, 0.25, 0.05),
    (0.85, 0.1, 0.05),
    (0.5, 0.45, 0.05),
    (0.6, 0.35, 0.05),
]
STATES = [f"s{n}" for n in range(len(LEANING))]


class LeaningStubBackend(InMemoryStubBackend):
    """The in-memory stub backend, each state's read giving the options (in the order the
    request presents them) the probabilities `answers` holds for it: the stub answers what the
    test scripts, which a real model cannot be made to."""

    def __init__(self, answers: dict[str, Sequence[float]]) -> None:
        super().__init__()
        self.answers = answers

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        read = await super().read(request, probe, max_retries=max_retries)
        wanted = self.answers[state_of(request)]
        return tv.CandidateRead(read.token_ids, tuple(math.log(p) for p in wanted), 4096, 1, 10)


def leaning(count: int = len(LEANING)) -> LeaningStubBackend:
    return LeaningStubBackend(dict(zip(STATES[:count], LEANING[:count], strict=True)))


def session(backend: InMemoryStubBackend, **settings: Any) -> tv.Session:
    return tv.Session(backend, tv.SessionSettings(**settings))


def probabilities(judgment: Judgment | None, question_id: str = "route") -> tuple[float, ...]:
    assert judgment is not None
    return tuple(judgment[question_id].probabilities.values())


def by_hand(answers: Sequence[Sequence[float]], prior: Sequence[float]) -> list[list[float]]:
    """Each answer divided by ``prior`` option by option, renormalised."""
    divided = []
    for answer in answers:
        weights = [p / q for p, q in zip(answer, prior, strict=True)]
        divided.append([w / sum(weights) for w in weights])
    return divided


def close(
    got: Sequence[Sequence[float]], want: Sequence[Sequence[float]], tolerance: float = 1e-12
) -> bool:
    """Answer by answer, option by option, within ``tolerance``."""
    return len(got) == len(want) and all(
        a == pytest.approx(b, abs=tolerance) for a, b in zip(got, want, strict=True)
    )


def mean(answers: Sequence[Sequence[float]]) -> list[float]:
    return [sum(column) / len(answers) for column in zip(*answers, strict=True)]


async def judged(stream: tv.BatchStream) -> list[tv.BatchItem]:
    return [item async for item in stream]


async def records(states: Sequence[str], pulled: list[str] | None = None) -> AsyncIterator[str]:
    """``states`` as an async stream (no length), noting each one as it is pulled."""
    for state in states:
        if pulled is not None:
            pulled.append(state)
        yield state
        await anyio.lowlevel.checkpoint()


@pytest.mark.asyncio
async def test_a_list_is_divided_whole_by_its_mean_answer_by_hand() -> None:
    backend = leaning()
    async with session(backend, batch_calibration="on") as s:
        raw = await judged(s.judge_many(STATES, QUESTIONS, batch_calibration="off"))
        reads_uncalibrated = len(backend.read_requests)
        calibrated = await judged(s.judge_many(STATES, QUESTIONS))
    assert len(backend.read_requests) == 2 * reads_uncalibrated == 2 * len(STATES)  # no extra
    read = [probabilities(item.judgment) for item in raw]
    assert close(read, LEANING)
    prior = mean(read)
    expected = by_hand(read, prior)
    assert [item.index for item in calibrated] == list(range(len(STATES)))
    for item, want, as_read in zip(calibrated, expected, read, strict=True):
        assert item.judgment is not None
        assert probabilities(item.judgment) == pytest.approx(want, abs=1e-12)
        diagnostics = item.judgment.diagnostics["route"]
        assert diagnostics.raw_probabilities == pytest.approx(as_read, abs=1e-15)
        assert diagnostics.batch_prior == pytest.approx(prior, abs=1e-15)
        assert (diagnostics.batch_prior_items, diagnostics.batch_prior_skipped) == (
            len(STATES),
            None,
        )
    # the lean divided out: "billing" no longer wins every state
    assert {item.judgment["route"].choice for item in calibrated if item.judgment} > {"billing"}
    assert {item.judgment["route"].choice for item in raw if item.judgment} == {"billing"}


@pytest.mark.asyncio
async def test_unordered_a_list_gives_the_same_answers_in_completion_order() -> None:
    backend = leaning()
    delays = {state: 0.002 * (len(STATES) - n) for n, state in enumerate(STATES)}
    backend.state_behaviours = {state: _sleep(delay) for state, delay in delays.items()}
    async with session(backend, batch_calibration="on") as s:
        ordered = await judged(s.judge_many(STATES, QUESTIONS))
        unordered = await judged(s.judge_many(tuple(STATES), QUESTIONS, ordered=False))
    assert sorted(item.index for item in unordered) == list(range(len(STATES)))
    by_index = {item.index: probabilities(item.judgment) for item in unordered}
    for item in ordered:
        assert by_index[item.index] == pytest.approx(probabilities(item.judgment), abs=1e-12)


def _sleep(seconds: float) -> Any:
    async def behaviour() -> None:
        await anyio.sleep(seconds)

    return behaviour


@pytest.mark.asyncio
async def test_an_error_item_passes_through_in_its_place_and_counts_for_nothing() -> None:
    backend = leaning()
    backend.state_behaviours = {"s4": failing_after(0.0, tv.ServerError("x", status=500, body=""))}
    async with session(backend, batch_calibration="on") as s:
        items = await judged(s.judge_many(STATES, QUESTIONS))
    assert [item.index for item in items] == list(range(len(STATES)))
    assert isinstance(items[4].error, tv.ServerError)
    assert items[4].judgment is None
    answered = [LEANING[n] for n in range(len(STATES)) if n != 4]
    expected = by_hand(answered, mean(answered))
    got = [probabilities(item.judgment) for item in items if item.ok]
    assert close(got, expected)
    assert {item.judgment.diagnostics["route"].batch_prior_items for item in items if item.ok} == {
        len(STATES) - 1
    }


@pytest.mark.asyncio
async def test_a_stream_holds_its_warm_up_then_divides_each_answer_by_the_running_prior() -> None:
    backend = leaning()
    pulled: list[str] = []
    seen_when_first_out: list[int] = []
    items = []
    async with session(backend, batch_calibration="on", batch_calibration_window=16) as s:
        async for item in s.judge_many(records(STATES, pulled), QUESTIONS):
            if not items:
                seen_when_first_out.append(len(pulled))
            items.append(item)
    assert seen_when_first_out[0] >= 16  # nothing out before the warm-up filled
    assert [item.index for item in items] == list(range(len(STATES)))
    warm_up = by_hand(LEANING[:16], mean(LEANING[:16]))
    later = [by_hand([LEANING[n]], mean(LEANING[: n + 1]))[0] for n in range(16, len(LEANING))]
    got = [probabilities(item.judgment) for item in items]
    assert close(got, warm_up + later)
    counts = [item.judgment.diagnostics["route"].batch_prior_items for item in items if item.ok]
    assert counts == [16] * 16 + list(range(17, len(STATES) + 1))


@pytest.mark.asyncio
async def test_a_stream_yields_past_its_warm_up_before_it_ends() -> None:
    """Bounded memory: a stream that never ends is divided as it goes."""
    backend = LeaningStubBackend({f"t{n}": LEANING[n % len(LEANING)] for n in range(40)})
    more = anyio.Event()

    async def endless() -> AsyncIterator[str]:
        for n in range(20):
            yield f"t{n}"
        await more.wait()  # the input pauses: items past the warm-up still come out
        for n in range(20, 40):
            yield f"t{n}"

    out = []
    async with session(backend, batch_calibration="on", batch_calibration_window=16) as s:
        async for item in s.judge_many(endless(), QUESTIONS, window=4, max_in_flight=2):
            out.append(item)
            if len(out) == 20:
                more.set()
    assert [item.index for item in out] == list(range(40))
    assert all(item.judgment is not None for item in out)


@pytest.mark.asyncio
async def test_a_stream_that_ends_in_its_warm_up_is_divided_as_the_whole_batch() -> None:
    backend = leaning()
    async with session(backend, batch_calibration="on") as s:  # a warm-up of 32
        items = await judged(s.judge_many(records(STATES), QUESTIONS, ordered=False))
    by_index = {item.index: probabilities(item.judgment) for item in items}
    expected = by_hand(LEANING, mean(LEANING))
    assert close([by_index[n] for n in range(len(STATES))], expected)


@pytest.mark.asyncio
async def test_below_the_floor_the_answers_stand_as_read_and_say_why() -> None:
    backend = leaning(15)
    async with session(backend, batch_calibration="on") as s:
        items = await judged(s.judge_many(STATES[:15], QUESTIONS))
    for item, as_read in zip(items, LEANING, strict=False):
        assert probabilities(item.judgment) == pytest.approx(as_read)
        assert item.judgment is not None
        diagnostics = item.judgment.diagnostics["route"]
        assert diagnostics.batch_prior is None
        assert diagnostics.batch_prior_items == 15
        assert (
            diagnostics.batch_prior_skipped == "a batch of 15 answers (fewer than 16 for 3 options)"
        )


@pytest.mark.asyncio
async def test_a_batch_that_does_not_vary_a_question_leaves_it_as_read() -> None:
    backend = InMemoryStubBackend()  # the same answer whatever the state
    async with session(backend, batch_calibration="on") as s:
        items = await judged(s.judge_many(STATES, {"q": tv.Noul(instructions="Is it?")}))
    for item in items:
        assert item.judgment is not None
        diagnostics = item.judgment.diagnostics["q"]
        assert diagnostics.batch_prior is None
        assert "does not vary" in (diagnostics.batch_prior_skipped or "")


@pytest.mark.asyncio
async def test_rotations_are_combined_before_the_batch_prior_is_divided() -> None:
    backend = leaning()
    async with session(backend, batch_calibration="on", permutations=3) as s:
        raw = await judged(s.judge_many(STATES, QUESTIONS, batch_calibration="off"))
        calibrated = await judged(s.judge_many(STATES, QUESTIONS))
    combined = [probabilities(item.judgment) for item in raw]
    expected = by_hand(combined, mean(combined))
    assert close([probabilities(item.judgment) for item in calibrated], expected)
    assert all(
        len(item.judgment.diagnostics["route"].rotations) == 3
        for item in calibrated
        if item.judgment
    )


@pytest.mark.asyncio
async def test_a_single_judgment_is_a_batch_of_one_left_as_read() -> None:
    backend = leaning()
    async with session(backend, batch_calibration="on") as s:
        judgment = await s.judge("s3", QUESTIONS)
    assert probabilities(judgment) == pytest.approx(LEANING[3])
    diagnostics = judgment.diagnostics["route"]
    assert (diagnostics.batch_prior, diagnostics.batch_prior_items) == (None, 1)
    assert diagnostics.batch_prior_skipped == ALONE
    async with session(leaning()) as s:  # off: nothing said
        off = (await s.judge("s3", QUESTIONS)).diagnostics["route"]
    assert (off.batch_prior_items, off.batch_prior_skipped) == (0, None)


# -- the refusals --------------------------------------------------------------------------


def calibration_map() -> CalibrationMap:
    pins = Pins(
        questions=question_set_hash([("route", ROUTE)]),
        model="stub-model",
        template_family="gemma3",
        backend="llama_cpp",
        framing="typevet/letters/2/noul-words",
    )
    entry = QuestionMap(question_hash(ROUTE), Reading(), Temperature(2.0), "question")
    return CalibrationMap(pins, {"route": entry}, "2026-12-01T00:00:00+00:00")


def test_the_settings_refuse_batch_calibration_with_a_content_free_prior_or_a_map() -> None:
    with pytest.raises(tv.ConfigurationError, match="batch_calibration='on' and content_free"):
        tv.SessionSettings(batch_calibration="on", content_free="scores")
    with pytest.raises(tv.ConfigurationError, match="batch_calibration='on' and a calibration"):
        tv.SessionSettings(batch_calibration=True, calibration=calibration_map())
    with pytest.raises(tv.ConfigurationError, match="batch_calibration must be 'off', 'on'"):
        tv.SessionSettings(batch_calibration="yes")
    with pytest.raises(
        tv.ConfigurationError, match="batch_calibration_window must be an integer >= 16"
    ):
        tv.SessionSettings(batch_calibration_window=15)


@pytest.mark.asyncio
async def test_judge_many_refuses_the_combinations_at_the_call_before_anything_is_sent() -> None:
    backend = leaning()
    async with session(backend, content_free="all") as s:
        with pytest.raises(tv.ConfigurationError, match="content_free='all'"):
            s.judge_many(STATES, QUESTIONS, batch_calibration="on")
    async with session(backend, batch_calibration="on") as s:
        with pytest.raises(tv.ConfigurationError, match="calibration map"):
            s.judge_many(STATES, QUESTIONS, calibration=calibration_map())
        # off for the call: the map is this call's only recalibration
        assert s.judge_many(STATES, QUESTIONS, batch_calibration="off", calibration=None)
    assert (backend.probes, backend.read_requests) == (0, [])


@pytest.mark.asyncio
async def test_a_session_whose_server_judges_refuses_batch_calibration() -> None:
    with pytest.raises(tv.ConfigurationError, match="batch_calibration cannot be set on a System"):
        tv.Session.system_one("http://127.0.0.1:1", batch_calibration="on")
    remote = tv.Capabilities(framing="remote", prefix_reuse=False, generation_images=False)
    backend = InMemoryStubBackend(capabilities=remote)
    async with session(backend, batch_calibration="on") as s:
        with pytest.raises(tv.ConfigurationError, match="its server reads the questions itself"):
            s.judge_many(STATES, QUESTIONS)
    assert backend.read_requests == []


@pytest.mark.usefixtures("no_typevet_variables")
def test_the_variables_and_flags_reach_the_setting() -> None:
    environ = {
        "TYPEVET_BASE_URL": "http://127.0.0.1:1",
        "TYPEVET_BATCH_CALIBRATION": "on",
        "TYPEVET_BATCH_CALIBRATION_WINDOW": "16",
    }
    settings = tv.Session.from_env(environ).settings
    assert (settings.batch_calibration, settings.batch_calibration_window) == ("on", 16)
    with pytest.raises(tv.ConfigurationError, match="TYPEVET_BATCH_CALIBRATION_WINDOW must be"):
        tv.Session.from_env({**environ, "TYPEVET_BATCH_CALIBRATION_WINDOW": "4"})
    with pytest.raises(tv.ConfigurationError, match="applies to llama_cpp, openai_compatible"):
        tv.Session.from_env({**environ, "TYPEVET_BACKEND": "system_one"})


def test_the_stream_calibration_releases_a_warm_up_of_records_errors_included() -> None:
    """The warm-up is records, not answers: a stream of failures holds no more than it."""
    calibration = StreamCalibration([("route", ROUTE)], window=16)
    error = tv.ServerError("x", status=500, body="")
    released = [calibration.take(tv.BatchItem(n, n, error=error)) for n in range(16)]
    assert released[:15] == [[]] * 15
    assert [item.index for item in released[15]] == list(range(16))
    assert calibration.take(tv.BatchItem(16, 16, error=error)) == [
        tv.BatchItem(16, 16, error=error)
    ]
    assert calibration.finish() == []


# -- the gateway's batch route ---------------------------------------------------------------

KEY = "calibrating-key-0123456789"
ROUTE_WIRE = {
    "route": {
        "type": "choice",
        "instructions": "Route it.",
        "criteria": {"billing": None, "bug": None, "other": None},
    }
}


def gateway(backend: InMemoryStubBackend, **settings: Any) -> Any:
    session = tv.Session(backend, tv.SessionSettings(**settings))
    return running(session, GatewayConfig(keys=(KEY,)))


async def post(url: str, path: str, body: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + path, json=body, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


@pytest.mark.asyncio
async def test_the_gateways_batch_route_divides_its_states_answers_and_reports_it() -> None:
    async with gateway(leaning(), batch_calibration="on") as url:
        body = await post(url, BATCH_PATH, {"states": STATES, "questions": ROUTE_WIRE})
        async with aiohttp.ClientSession() as http:
            listing = await (
                await http.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            ).json()
        single = await post(url, "/v1/systemone", {"state": "s3", "questions": ROUTE_WIRE})
    expected = by_hand(LEANING, mean(LEANING))
    got = [
        tuple(result["answers"]["route"]["probabilities"].values()) for result in body["results"]
    ]
    assert close(got, expected)
    for result, as_read in zip(body["results"], LEANING, strict=True):
        diagnostics = result["x_typevet"]["diagnostics"]["route"]
        assert diagnostics["raw_probabilities"] == pytest.approx(as_read)
        assert diagnostics["batch_prior"] == pytest.approx(mean(LEANING))
        assert (diagnostics["batch_prior_items"], diagnostics["batch_prior_skipped"]) == (
            len(STATES),
            None,
        )
    assert listing["x_batch_calibration"] == {
        "mode": "on",
        "min_states": 16,
        "min_states_per_option": 2,
    }
    # a single judgment is a batch of one: as read, and said so
    alone = single["x_typevet"]["diagnostics"]["route"]
    assert tuple(single["answers"]["route"]["probabilities"].values()) == pytest.approx(LEANING[3])
    assert (alone["batch_prior_items"], alone["batch_prior_skipped"]) == (1, ALONE)


@pytest.mark.asyncio
async def test_a_batch_below_the_floor_and_a_gateway_without_the_setting_answer_as_read() -> None:
    async with gateway(leaning(), batch_calibration="on") as url:
        small = await post(url, BATCH_PATH, {"states": STATES[:3], "questions": ROUTE_WIRE})
    for result, as_read in zip(small["results"], LEANING, strict=False):
        assert tuple(result["answers"]["route"]["probabilities"].values()) == pytest.approx(as_read)
        skipped = result["x_typevet"]["diagnostics"]["route"]["batch_prior_skipped"]
        assert skipped == "a batch of 3 answers (fewer than 16 for 3 options)"
    async with gateway(leaning()) as url:
        plain = await post(url, BATCH_PATH, {"states": STATES, "questions": ROUTE_WIRE})
        async with aiohttp.ClientSession() as http:
            listing = await (
                await http.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            ).json()
    got = [
        tuple(result["answers"]["route"]["probabilities"].values()) for result in plain["results"]
    ]
    assert close(got, LEANING, 1e-9)
    assert listing["x_batch_calibration"] == {
        "mode": "off",
        "min_states": 16,
        "min_states_per_option": 2,
    }


@pytest.mark.asyncio
async def test_a_system_one_session_reads_the_divided_answers_and_their_diagnostics() -> None:
    async with (
        gateway(leaning(), batch_calibration="on") as url,
        tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as client,
    ):
        items = [item async for item in client.judge_many(STATES, QUESTIONS)]
    expected = by_hand(LEANING, mean(LEANING))
    # the wire's probabilities are the server's floats, read back exactly
    assert close([probabilities(item.judgment) for item in items], expected, 1e-9)
    for item, as_read in zip(items, LEANING, strict=True):
        assert item.judgment is not None
        diagnostics = item.judgment.diagnostics["route"]
        assert diagnostics.raw_probabilities == pytest.approx(as_read)
        assert diagnostics.batch_prior == pytest.approx(mean(LEANING))
        assert diagnostics.batch_prior_items == len(STATES)
