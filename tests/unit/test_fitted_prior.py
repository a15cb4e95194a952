"""A prior fitted from unlabelled states (`Session.fit_prior`): the fit against the mean of the
answers, its pinned artefact read strictly, a later judgment divided by it as by hand, and
every refusal made before anything is sent (over an in-memory stub backend whose answers vary
with the state, as a real model's do)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import orjson
import pytest

import typevet_async as tv
from typevet_async._apps.cli import main
from typevet_async._core.statistics.calibration import (
    CalibrationMap,
    Pins,
    QuestionMap,
    Reading,
    Temperature,
    question_hash,
)
from typevet_async._core.statistics.fitted_prior import QuestionPrior
from typevet_async._session.configuration import read_settings

from .stubs import InMemoryStubBackend, failing_after, state_of

ROUTE = tv.Choice({"billing": None, "shipping": None, "technical": None}, instructions="Team?")
REFUND = tv.Noul(instructions="Refund?")
QUESTIONS: dict[str, tv.Question] = {"route": ROUTE, "refund": REFUND}
#: Sixteen unlabelled states (the floor of a question of up to eight options), and a
#: seventeenth judged with the prior fitted on them.
STATES = [f"ticket-{k}" for k in range(16)]
LATER = "ticket-16"


class StateLeaningStub(InMemoryStubBackend):
    """An in-memory stub backend (not a server) whose answers lean to the first option by an
    amount set by the state's number (``ticket-K``), and to the first position a little: the
    shared stub answers every state the same, and a batch that does not vary has no prior."""

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        read = await super().read(request, probe, max_retries=max_retries)
        k = int(state_of(request).rsplit("-", 1)[1])
        sharpness = 0.3 + (k % 7) / 4
        shown = request.order or tuple(range(len(request.token_ids)))  # option at each position
        logprobs = tuple(
            -1.2 - 0.2 * place - sharpness * option for place, option in enumerate(shown)
        )
        return attrs.evolve(read, logprobs=logprobs)


def _probabilities(answer: tv.Answer) -> tuple[float, ...]:
    return tuple(answer.probabilities.values())


def _mean(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(math.fsum(row[i] for row in rows) / len(rows) for i in range(len(rows[0])))


def _divided(p: tuple[float, ...], prior: tuple[float, ...]) -> tuple[float, ...]:
    weights = [a / b for a, b in zip(p, prior, strict=True)]
    return tuple(w / math.fsum(weights) for w in weights)


async def _fitted(**settings: Any) -> tv.FittedPrior:
    async with tv.Session(StateLeaningStub(), tv.SessionSettings(**settings)) as session:
        return await session.fit_prior(STATES, QUESTIONS)


# -- fitting -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_prior_is_each_questions_mean_answer_over_the_states_pinned_as_read() -> None:
    async with tv.Session(StateLeaningStub()) as session:
        prior = await session.fit_prior(iter(STATES), QUESTIONS)  # any iterable, read once
        answers = [await session.judge(state, QUESTIONS) for state in STATES]
        plan = await session.read_plan(QUESTIONS)
    assert prior.pins == plan.pins  # the calibration map's pins, one owner
    for question_id, question in QUESTIONS.items():
        entry = prior.questions[question_id]
        expected = _mean([_probabilities(judgment[question_id]) for judgment in answers])
        assert entry.prior.probabilities == pytest.approx(expected, abs=1e-12)
        assert (entry.prior.items, entry.prior.skipped) == (len(STATES), None)
        assert entry.question == question_hash(question)
        assert entry.reading == plan.readings[question_id] == Reading()
    assert prior.created.endswith("+00:00")


@pytest.mark.asyncio
async def test_fitting_reads_without_the_sessions_map_prior_or_off_menu_guard() -> None:
    first = await _fitted()
    settings = tv.SessionSettings(prior=first, off_menu_threshold=0.0, raise_off_menu=True)
    async with tv.Session(StateLeaningStub(), settings) as session:
        again = await session.fit_prior(STATES, QUESTIONS)
    assert again.questions == first.questions  # the same uncalibrated reads


@pytest.mark.asyncio
async def test_too_few_states_or_states_that_do_not_vary_fit_no_prior_and_say_why() -> None:
    async with tv.Session(StateLeaningStub()) as session:
        few = await session.fit_prior(STATES[:5], QUESTIONS)
        applied = await session.judge(LATER, QUESTIONS, prior=few)
        raw = await session.judge(LATER, QUESTIONS)
    assert few.questions["route"].prior.probabilities is None
    assert (
        few.questions["route"].prior.skipped == "a batch of 5 answers (fewer than 16 for 3 options)"
    )
    assert applied["route"] == raw["route"]  # left as read
    assert applied.diagnostics["route"].batch_prior is None
    assert applied.diagnostics["route"].batch_prior_skipped == few.questions["route"].prior.skipped
    assert applied.diagnostics["route"].batch_prior_items == 5
    async with tv.Session(InMemoryStubBackend()) as session:  # the same answer to every state
        flat = await session.fit_prior(STATES, QUESTIONS)
    assert "does not vary" in (flat.questions["route"].prior.skipped or "")


@pytest.mark.asyncio
async def test_a_failing_state_fails_the_fit() -> None:
    backend = StateLeaningStub()
    backend.state_behaviours[STATES[3]] = failing_after(
        0.0, tv.ServerError("down", status=500, body="")
    )
    async with tv.Session(backend) as session:
        with pytest.raises(tv.ServerError, match="down"):
            await session.fit_prior(STATES, QUESTIONS)


@pytest.mark.asyncio
async def test_the_prior_pins_the_rotations_it_was_read_under() -> None:
    async with tv.Session(StateLeaningStub(), tv.SessionSettings(noul_controls="letters")) as s:
        prior = await s.fit_prior(STATES, QUESTIONS, permutations=3, label_prior=False)
        assert prior.questions["route"].reading == Reading(3, False)
        assert prior.questions["refund"].reading == Reading(2, False)
        judged = await s.judge(LATER, QUESTIONS, permutations=3, prior=prior)
        raw = await s.judge(LATER, QUESTIONS, permutations=3)
        with pytest.raises(tv.CalibrationError, match="reading") as refused:
            await s.judge(LATER, QUESTIONS, prior=prior)  # read once: not what it was fitted on
    assert refused.value.question_id == "route"
    expected = _divided(_probabilities(raw["route"]), prior.questions["route"].prior.probabilities)
    assert _probabilities(judged["route"]) == pytest.approx(expected, abs=1e-12)


# -- applying it -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_later_answer_is_divided_by_the_prior_as_by_hand() -> None:
    prior = await _fitted()
    async with tv.Session(StateLeaningStub()) as session:
        raw = await session.judge(LATER, QUESTIONS)
        judged = await session.judge(LATER, QUESTIONS, prior=prior)
        streamed = [
            item.judgment
            async for item in session.judge_many([LATER, STATES[0]], QUESTIONS, prior=prior)
        ]
        unset = await session.judge(LATER, QUESTIONS, prior=None)
    async with tv.Session(StateLeaningStub(), tv.SessionSettings(prior=prior)) as session:
        by_setting = await session.judge(LATER, QUESTIONS)
        off = await session.judge(LATER, QUESTIONS, prior=None)
    for question_id in QUESTIONS:
        fitted = prior.questions[question_id].prior.probabilities
        assert fitted is not None
        read = _probabilities(raw[question_id])
        expected = _divided(read, fitted)
        assert _probabilities(judged[question_id]) == pytest.approx(expected, abs=1e-12)
        diagnostics = judged.diagnostics[question_id]
        assert diagnostics.raw_probabilities == pytest.approx(read, abs=1e-15)
        assert diagnostics.batch_prior == fitted
        assert (diagnostics.batch_prior_items, diagnostics.batch_prior_skipped) == (
            len(STATES),
            None,
        )
        assert diagnostics.logprobs == raw.diagnostics[question_id].logprobs
        for other in (streamed[0], by_setting):
            assert other is not None
            assert other[question_id] == judged[question_id]
        assert unset[question_id] == off[question_id] == raw[question_id]
    # The lean to the first option divided out: the thirteenth state's answer moves off it.
    assert judged["route"].probabilities["billing"] < raw["route"].probabilities["billing"]


@pytest.mark.asyncio
async def test_a_prior_fitted_for_something_else_is_refused_naming_the_pin_before_any_read() -> (
    None
):
    prior = await _fitted()
    backend = StateLeaningStub()
    async with tv.Session(backend) as session:
        for pins, named in (
            (attrs.evolve(prior.pins, model="gemma-9b"), "model 'gemma-9b'"),
            (attrs.evolve(prior.pins, template_family="chatml"), "template family 'chatml'"),
            (attrs.evolve(prior.pins, backend="vllm"), "backend 'vllm'"),
            (attrs.evolve(prior.pins, framing="typevet/digits/2"), "prompt framing"),
        ):
            with pytest.raises(tv.CalibrationError, match=named) as refused:
                await session.judge(LATER, QUESTIONS, prior=attrs.evolve(prior, pins=pins))
            assert refused.value.question_id == "route"
            assert "fit a prior for this one" in str(refused.value)
        reworded = tv.Choice(["billing", "shipping", "returns"], instructions="Team?")
        with pytest.raises(tv.CalibrationError, match="not the one the prior") as refused:
            await session.judge(LATER, {"route": reworded}, prior=prior)
        assert str(refused.value).startswith("question 'route': ")
        with pytest.raises(tv.CalibrationError, match="no question 'urgent'") as refused:
            await session.judge(LATER, {"urgent": tv.Noul(instructions="Now?")}, prior=prior)
        assert refused.value.question_id == "urgent"
        stream = session.judge_many(STATES, QUESTIONS, prior=attrs.evolve(prior, pins=pins))
        with pytest.raises(tv.CalibrationError, match="prompt framing"):
            async for _ in stream:
                pass
        subset = await session.judge(LATER, {"refund": REFUND}, prior=prior)  # a subset fits
        assert subset.diagnostics["refund"].batch_prior is not None
    assert backend.reads == ["refund"]  # the refused judgments sent nothing
    async with tv.Session(StateLeaningStub(), tv.SessionSettings(controls="digits")) as session:
        with pytest.raises(tv.CalibrationError, match="prompt framing 'typevet/letters/2"):
            await session.judge(LATER, QUESTIONS, prior=prior)


@pytest.mark.asyncio
async def test_a_prior_with_a_map_or_content_free_calibration_is_refused_naming_both() -> None:
    prior = await _fitted()
    entry = QuestionMap(question_hash(ROUTE), Reading(), Temperature(2.0), "question")
    calibration = CalibrationMap(prior.pins, {"route": entry})
    with pytest.raises(tv.ConfigurationError, match="prior and calibration are both given"):
        tv.SessionSettings(prior=prior, calibration=calibration)
    with pytest.raises(tv.ConfigurationError, match="FittedPrior"):
        tv.SessionSettings(prior="prior.json")  # type: ignore[arg-type]
    backend = StateLeaningStub()
    async with tv.Session(backend, tv.SessionSettings(calibration=calibration)) as session:
        with pytest.raises(tv.ConfigurationError, match="prior and calibration"):
            await session.judge(LATER, {"route": ROUTE}, prior=prior)
        with pytest.raises(tv.ConfigurationError, match="prior and calibration"):
            session.judge_many(STATES, {"route": ROUTE}, prior=prior)
        # The call turns the session's map off: the prior alone applies.
        await session.judge(LATER, {"route": ROUTE}, prior=prior, calibration=None)
    assert backend.reads == ["route"]
    scores = tv.SessionSettings(content_free="all")
    async with tv.Session(StateLeaningStub(), scores) as session:
        with pytest.raises(tv.ConfigurationError, match="content_free='all'") as refused:
            await session.judge(LATER, QUESTIONS, prior=prior)
        assert refused.value.question_id == "route"
        with pytest.raises(tv.ConfigurationError, match="a fitted prior and content_free"):
            await session.fit_prior(STATES, QUESTIONS)


@pytest.mark.asyncio
async def test_a_prior_with_batch_calibration_is_refused_naming_both() -> None:
    prior = await _fitted()
    with pytest.raises(tv.ConfigurationError, match="batch_calibration='on' and a fitted prior"):
        tv.SessionSettings(prior=prior, batch_calibration="on")
    backend = StateLeaningStub()
    async with tv.Session(backend, tv.SessionSettings(batch_calibration="on")) as session:
        with pytest.raises(tv.ConfigurationError, match="and a fitted prior"):
            session.judge_many(STATES, {"route": ROUTE}, prior=prior)
    async with tv.Session(backend, tv.SessionSettings(prior=prior)) as session:
        with pytest.raises(tv.ConfigurationError, match="and a fitted prior"):
            session.judge_many(STATES, {"route": ROUTE}, batch_calibration="on")
    assert backend.reads == []


@pytest.mark.asyncio
async def test_a_server_that_judges_itself_refuses_fitting_and_applying_a_prior_unsent() -> None:
    prior = await _fitted()
    capabilities = attrs.evolve(InMemoryStubBackend().capabilities, framing="remote")
    backend = InMemoryStubBackend(capabilities=capabilities)
    async with tv.Session(backend) as session:
        with pytest.raises(tv.ConfigurationError, match="reads the questions itself"):
            await session.fit_prior(STATES, QUESTIONS)
        with pytest.raises(tv.ConfigurationError, match="fitted priors apply where"):
            await session.judge(LATER, QUESTIONS, prior=prior)
    assert backend.reads == []


# -- the artefact ------------------------------------------------------------------------------


def _artefact() -> tv.FittedPrior:
    pins = Pins("sha256:set", "stub-model", "gemma3", "custom", "typevet/letters/2/noul-words")
    route = QuestionPrior(question_hash(ROUTE), Reading(3), tv.BatchPrior((0.5, 0.3, 0.2), 16))
    skipped = tv.BatchPrior(None, 4, "a batch of 4 answers (fewer than 16 for 3 options)")
    refund = QuestionPrior(question_hash(REFUND), Reading(), skipped)
    return tv.FittedPrior(pins, {"route": route, "refund": refund}, "2026-12-01T00:00:00+00:00")


def test_the_artefact_round_trips_with_its_sha256() -> None:
    prior = _artefact()
    data = prior.to_json()
    body = orjson.loads(data)
    assert (body["format"], body["version"]) == ("typevet_async.prior", 1)
    assert body["sha256"] == prior.sha256
    assert body["questions"]["route"]["probabilities"] == [0.5, 0.3, 0.2]
    again = tv.FittedPrior.from_json(data)
    assert again == prior
    assert again.sha256 == prior.sha256
    assert tv.FittedPrior.from_json(data.decode()) == prior


def _edited(change: Any) -> bytes:
    """The artefact with ``change`` made to its body and its digest made to match again: a
    malformed file that a consistent digest does not excuse."""
    body = orjson.loads(_artefact().to_json())
    change(body)
    return orjson.dumps(body)


def _route(body: dict[str, Any]) -> dict[str, Any]:
    route: dict[str, Any] = body["questions"]["route"]
    return route


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a fitted prior"),
        (_edited(lambda b: b.update(format="typevet_async.calibration")), "not a fitted prior"),
        (_edited(lambda b: b.update(version=2)), "version 2; this SDK reads version 1"),
        (_edited(lambda b: b.update(extra=1)), r"unknown \['extra'\]"),
        (_edited(lambda b: b.pop("created")), r"missing \['created'\]"),
        (_edited(lambda b: b["pins"].pop("framing")), r"pins has fields missing \['framing'\]"),
        (_edited(lambda b: b["pins"].update(model=7)), "pins must be text"),
        (_edited(lambda b: b.update(questions=[])), "questions must be an object"),
        (_edited(lambda b: _route(b).update(probabilities=[0.5, 0.3, 0.3])), "sum to 1"),
        (_edited(lambda b: _route(b).update(probabilities=[1.5, -0.5])), r"in \[0, 1\]"),
        (_edited(lambda b: _route(b).update(probabilities=[1.0])), "2 or more"),
        (_edited(lambda b: _route(b).update(probabilities="0.5,0.5")), "a list"),
        (_edited(lambda b: _route(b).update(items=True)), "items must be a whole number"),
        (_edited(lambda b: _route(b).update(items=15)), "at least 16 answers"),
        (_edited(lambda b: _route(b).update(skipped="why")), "not skipped"),
        (_edited(lambda b: _route(b).update(probabilities=None, skipped=None)), "say why"),
        (_edited(lambda b: _route(b).update(question="route")), "'sha256:' digest"),
        (_edited(lambda b: _route(b)["reading"].update(rotations=0)), "rotations must be"),
        (_edited(lambda b: _route(b).pop("items")), r"missing \['items'\]"),
        (_edited(lambda b: _route(b).update(probabilities=[0.6, 0.2, 0.2])), "sha256"),
    ],
)
def test_a_malformed_or_edited_artefact_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(tv.CalibrationError, match=message):
        tv.FittedPrior.from_json(data)


def test_a_refused_entry_names_its_question() -> None:
    with pytest.raises(tv.CalibrationError) as refused:
        tv.FittedPrior.from_json(_edited(lambda b: _route(b).update(items=-1)))
    assert refused.value.question_id == "route"


def test_a_prior_of_another_option_count_is_refused() -> None:
    prior = _artefact()
    served = prior.pins
    three = QuestionPrior(question_hash(REFUND), Reading(), tv.BatchPrior((0.5, 0.3, 0.2), 9))
    wrong = attrs.evolve(prior, questions={"refund": three})
    with pytest.raises(tv.CalibrationError, match="3 options, the question 2"):
        wrong.check(served, [("refund", REFUND)], {"refund": Reading()})


# -- the command line --------------------------------------------------------------------------


@pytest.fixture
def leaning(monkeypatch: pytest.MonkeyPatch) -> StateLeaningStub:
    """Every session the CLI builds judges on this stub, with the ``--prior`` its flags give
    (read by the setting's own rule)."""
    backend = StateLeaningStub()

    def from_env(
        cls: type[tv.Session], environ: Any = None, *, flags: Any = None, **settings: Any
    ) -> tv.Session:
        given = {"prior": flags["prior"]} if (flags or {}).get("prior") else {}
        prior = read_settings({}, given).get("prior", (None, ""))[0]
        return tv.Session(backend, tv.SessionSettings(prior=prior))

    monkeypatch.setattr(tv.Session, "from_env", classmethod(from_env))
    return backend


CLI_QUESTIONS = ["--choice", "route=Team?:billing,shipping,technical", "--noul", "refund=Refund?"]


def _records(path: Path) -> Path:
    # Records of every shape it takes: eval's (labels unread), batch's, and a bare state.
    lines = [{"id": 0, "state": STATES[0], "labels": {"refund": True}}]
    lines += [{"id": k, "state": state} for k, state in enumerate(STATES[1:-1], start=1)]
    path.write_text("\n".join(map(json.dumps, [*lines, STATES[-1]])) + "\n\n")
    return path


@pytest.mark.asyncio
async def test_fit_prior_writes_the_prior_and_batch_divides_by_it(
    leaning: StateLeaningStub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, out = _records(tmp_path / "states.jsonl"), tmp_path / "prior.json"
    argv = ["fit-prior", str(records), *CLI_QUESTIONS, "--out", str(out), "--no-progress"]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    printed = capsys.readouterr().out
    prior = tv.FittedPrior.from_json(out.read_bytes())
    assert f"prior: {out} ({prior.sha256})" in printed
    assert "route" in printed
    assert "billing=0." in printed
    questions = {"route": ROUTE, "refund": REFUND}
    async with tv.Session(StateLeaningStub()) as session:
        expected = await session.fit_prior(STATES, questions)
        judged = await session.judge(LATER, questions, prior=expected)
    assert prior.questions == expected.questions
    assert prior.pins == expected.pins
    later, answered = jsonl_file(tmp_path / "later.jsonl", LATER), tmp_path / "answers.jsonl"
    argv = ["batch", str(later), *CLI_QUESTIONS, "--out", str(answered), "--no-progress"]
    assert await anyio.to_thread.run_sync(main, [*argv, "--prior", str(out)]) == 0
    [line] = [json.loads(text) for text in answered.read_text().splitlines()]
    assert line["answers"]["route"]["probabilities"] == pytest.approx(
        judged["route"].probabilities, abs=1e-12
    )


def jsonl_file(path: Path, *states: str) -> Path:
    path.write_text("".join(json.dumps(state) + "\n" for state in states))
    return path


def test_fit_prior_refuses_a_bad_line_or_its_own_input_before_any_read(
    leaning: StateLeaningStub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "states.jsonl"
    records.write_text('"a"\n{"id": 2, "state": "b"\n')
    out = tmp_path / "prior.json"
    code = main(["fit-prior", str(records), *CLI_QUESTIONS, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{records} line 2: not valid JSON" in err
    code = main(["fit-prior", str(records), *CLI_QUESTIONS, "--out", str(records)])
    assert code == 2
    assert "is the input" in capsys.readouterr().err
    assert leaning.reads == []
    assert not out.exists()


def test_a_prior_file_that_was_edited_is_one_line_and_exit_2(
    leaning: StateLeaningStub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = tmp_path / "prior.json"
    edited.write_bytes(_edited(lambda b: _route(b).update(probabilities=[0.6, 0.2, 0.2])))
    code = main(["judge", LATER, *CLI_QUESTIONS, "--prior", str(edited)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("typevet-async: ")
    assert "sha256" in err
    assert err.count("\n") == 1
    assert leaning.reads == []


@pytest.mark.asyncio
async def test_an_eval_run_with_a_prior_measures_divided_answers_and_resumes_only_with_it(
    tmp_path: Path,
) -> None:
    prior = await _fitted()
    records = [{"id": k, "state": s, "labels": {"refund": True}} for k, s in enumerate(STATES)]
    out = tmp_path / "reads.jsonl"
    async with tv.Session(StateLeaningStub()) as session:
        evaluation = await tv.evaluate(session, records[:6], QUESTIONS, out=out, prior=prior)
        judged = await session.judge(STATES[0], QUESTIONS, prior=prior)
        first = json.loads(out.read_text().splitlines()[0])["answers"]["route"]
        assert first["probabilities"] == pytest.approx(_probabilities(judged["route"]), abs=1e-12)
        assert first["raw"] == pytest.approx(judged.diagnostics["route"].raw_probabilities)
        with pytest.raises(tv.InvalidInputError, match="calibration or prior"):
            await tv.evaluate(session, records, QUESTIONS, out=out, resume=True)
        resumed = await tv.evaluate(session, records, QUESTIONS, out=out, resume=True, prior=prior)
    assert evaluation.facts()["prior"] == prior.sha256
    assert resumed.records == len(STATES)
