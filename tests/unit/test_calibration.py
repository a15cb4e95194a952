"""Calibration maps (transforms, fitting, the pinned artefact), option rotations and the label
prior, and how a session applies them (over the in-memory stub backend, whose reads favour
the first position whatever the options say)."""

from __future__ import annotations

import hashlib
import math

import attrs
import numpy as np
import orjson
import pytest

import typevet_async as tv
from typevet_async._core.prompts.rotations import (
    combine_rotations,
    rotation_offsets,
    rotation_order,
)
from typevet_async._core.statistics import fitting
from typevet_async._core.statistics.calibration import (
    CalibrationMap,
    Isotonic,
    Pins,
    Platt,
    QuestionMap,
    Reading,
    Temperature,
    question_hash,
    question_set_hash,
    transform_probabilities,
)
from typevet_async._core.statistics.labels import gold_indices, labelled_record

from .stubs import InMemoryStubBackend

ROUTE = tv.Choice({"billing": None, "shipping": None, "technical": None}, instructions="Team?")
REFUND = tv.Noul(instructions="Refund?")

# -- transforms ------------------------------------------------------------------------------


def test_temperature_two_takes_the_square_root_of_the_probabilities() -> None:
    # softmax(log p / 2) = sqrt(p) / sum sqrt(p): sqrt(.8) = .894427, sqrt(.2) = .447214.
    assert transform_probabilities(Temperature(2.0), [0.8, 0.2]) == pytest.approx(
        [0.894427 / 1.341641, 0.447214 / 1.341641], abs=1e-6
    )
    assert transform_probabilities(Temperature(1.0), [0.7, 0.3]) == pytest.approx([0.7, 0.3])


def test_platt_is_slope_times_log_p_plus_a_bias_per_option() -> None:
    # slope 1, biases (0, ln 2) on (.5, .5): weights .5 and 1 -> (1/3, 2/3).
    assert transform_probabilities(Platt(1.0, (0.0, math.log(2))), [0.5, 0.5]) == pytest.approx(
        [1 / 3, 2 / 3]
    )
    # slope 0 forgets the read: the biases alone, softmax(0, ln 3) = (1/4, 3/4).
    assert transform_probabilities(Platt(0.0, (0.0, math.log(3))), [0.9, 0.1]) == pytest.approx(
        [0.25, 0.75]
    )


def test_isotonic_interpolates_each_option_then_normalises() -> None:
    curves = (((0.0, 0.0), (1.0, 0.5)), ((0.0, 0.2), (0.5, 0.2), (1.0, 1.0)))
    # option 0 at .6 -> .3; option 1 at .4 -> .2 (flat part): normalised (.6, .4).
    assert transform_probabilities(Isotonic(curves), [0.6, 0.4]) == pytest.approx([0.6, 0.4])
    # option 0 at .2 -> .1; option 1 at .8 -> .2 + .8 * .3 / .5 = .68: (.1/.78, .68/.78).
    assert transform_probabilities(Isotonic(curves), [0.2, 0.8]) == pytest.approx(
        [0.1 / 0.78, 0.68 / 0.78]
    )


def test_bad_transform_parameters_are_refused() -> None:
    for degenerate in (0.0, 5e-324, 1e-4, 1e4):
        with pytest.raises(tv.CalibrationError, match=r"between 0\.001 and 1000"):
            Temperature(degenerate)
    with pytest.raises(tv.CalibrationError, match="slope must be at most"):
        Platt(1e300, (0.0, 0.0))
    with pytest.raises(tv.CalibrationError, match="biases must be finite numbers at most"):
        Platt(1.0, (0.0, -1e300))
    with pytest.raises(tv.CalibrationError, match="finite"):
        Platt(float("nan"), (0.0, 0.0))
    with pytest.raises(tv.CalibrationError, match="rise"):
        Isotonic((((0.0, 0.5), (1.0, 0.2)),))


# -- fitting ----------------------------------------------------------------------------------


def _synthetic(temperature: float, n: int, options: int, seed: int) -> fitting.Labelled:
    """Reads p = softmax(z) whose gold is drawn from softmax(z / temperature): the map that
    calibrates them is that temperature."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.5, size=(n, options))
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    truth = np.exp(logits / temperature)
    truth /= truth.sum(axis=1, keepdims=True)
    gold = np.array([rng.choice(options, p=row) for row in truth])
    return fitting.Labelled(p, gold)


@pytest.mark.parametrize("temperature", [0.5, 2.0, 3.0])
def test_temperature_fitting_recovers_a_known_temperature(temperature: float) -> None:
    data = _synthetic(temperature, 20_000, 4, seed=1)
    fitted = fitting.fit_temperature(data)
    assert fitted.temperature == pytest.approx(temperature, rel=0.05)


def test_a_map_is_kept_only_when_it_lowers_the_heldout_nll() -> None:
    overconfident = _synthetic(3.0, 4_000, 3, seed=2)
    fit, heldout = (
        overconfident.subset(np.arange(4_000) < 3_000),
        overconfident.subset(np.arange(4_000) >= 3_000),
    )
    best, report = fitting.choose_transform(fit, heldout)
    assert best is not None
    assert best.heldout_nll < report["heldout_nll_raw"]
    assert report["kept"] == best.name
    assert set(report["heldout_nll"]) == {"temperature", "platt", "isotonic"}
    # Calibrated already: the best candidate's held-out NLL is compared with the raw one's.
    calibrated = _synthetic(1.0, 400, 3, seed=3)
    tiny_fit = calibrated.subset(np.arange(400) < 30)
    best, report = fitting.choose_transform(tiny_fit, calibrated.subset(np.arange(400) >= 30))
    if best is None:
        assert report["kept"] == "none"
    else:
        assert best.heldout_nll < report["heldout_nll_raw"]


def test_too_few_items_fit_no_map() -> None:
    data = _synthetic(2.0, 10, 2, seed=4)
    best, report = fitting.choose_transform(data, data)
    assert best is None
    assert "too few" in report["why"]


def test_the_heldout_split_is_a_stable_hash_of_the_id() -> None:
    keys = [f'"r{index}"' for index in range(10_000)]
    first = [fitting.is_heldout(key, 0.3) for key in keys]
    assert first == [fitting.is_heldout(key, 0.3) for key in keys]
    assert 0.28 < sum(first) / len(first) < 0.32
    assert first != [fitting.is_heldout(key, 0.3, seed=1) for key in keys]


# -- the artefact and its pins ------------------------------------------------------------------


def _map(question: tv.Question = ROUTE, **pins: str) -> CalibrationMap:
    given = {
        "questions": question_set_hash([("route", question)]),
        "model": "stub-model",
        "template_family": "gemma3",
        "backend": "custom",
        # The default framing: letters, a Noul in words.
        "framing": "typevet/letters/2/noul-words",
        **pins,
    }
    entry = QuestionMap(question_hash(question), Reading(), Temperature(2.0), "question")
    return CalibrationMap(Pins(**given), {"route": entry}, "2026-12-01T00:00:00+00:00")


def test_the_artefact_round_trips_with_its_sha256() -> None:
    calibration = _map()
    data = calibration.to_json()
    body = orjson.loads(data)
    assert body["format"] == "typevet_async.calibration"
    assert body["version"] == 1
    assert body["sha256"] == calibration.sha256
    assert CalibrationMap.from_json(data) == calibration


def test_a_degenerate_map_with_a_consistent_digest_is_refused() -> None:
    # A temperature of 5e-324 passed from_json, and answers came back NaN with confidence 1.0.
    body = orjson.loads(_map().to_json())
    body["questions"]["route"]["transform"]["temperature"] = 5e-324
    del body["sha256"]
    digest = "sha256:" + hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    with pytest.raises(tv.CalibrationError, match="degenerate"):
        CalibrationMap.from_json(orjson.dumps({**body, "sha256": digest}))


@pytest.mark.parametrize(
    ("reading", "message"),
    [
        ({"rotations": "3", "label_prior": False}, "rotations must be a whole number"),
        ({"rotations": 0, "label_prior": False}, "rotations must be a whole number"),
        ({"rotations": True, "label_prior": False}, "rotations must be a whole number"),
        ({"rotations": 3, "label_prior": "yes"}, "label_prior must be true or false"),
    ],
)
def test_a_map_whose_reading_is_not_one_is_refused(
    reading: dict[str, object], message: str
) -> None:
    # Taken as it was before, and refused only at a judgment as a map for another reading.
    body = orjson.loads(_map().to_json())
    body["questions"]["route"]["reading"] = reading
    del body["sha256"]
    digest = "sha256:" + hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    with pytest.raises(tv.CalibrationError, match=message):
        CalibrationMap.from_json(orjson.dumps({**body, "sha256": digest}))


def test_a_transform_never_returns_a_non_finite_answer() -> None:
    # Past the validators (built around them), the result is still checked.
    sharp = object.__new__(Temperature)
    object.__setattr__(sharp, "temperature", 5e-324)
    with pytest.raises(tv.CalibrationError, match="not a distribution"):
        transform_probabilities(sharp, [0.5, 0.3, 0.2])


def test_an_edited_or_foreign_artefact_is_refused() -> None:
    body = orjson.loads(_map().to_json())
    body["questions"]["route"]["transform"]["temperature"] = 1.5
    with pytest.raises(tv.CalibrationError, match="changed after it was fitted"):
        CalibrationMap.from_json(orjson.dumps(body))
    with pytest.raises(tv.CalibrationError, match="version"):
        CalibrationMap.from_json(orjson.dumps({**body, "version": 2}))
    with pytest.raises(tv.CalibrationError, match="not a calibration map"):
        CalibrationMap.from_json(b'{"format": "other"}')
    with pytest.raises(tv.CalibrationError, match="not JSON"):
        CalibrationMap.from_json(b"{")


def _check(calibration: CalibrationMap, **given: object) -> None:
    pins = {
        "model": "stub-model",
        "template_family": "gemma3",
        "backend": "custom",
        "framing": "typevet/letters/2/noul-words",
    }
    questions = given.pop("questions", [("route", ROUTE)])
    readings = given.pop("readings", {"route": Reading()})
    served = Pins(questions="", **{**pins, **given})  # type: ignore[arg-type]
    calibration.check(served, questions, readings)  # type: ignore[arg-type]


def test_a_map_is_refused_for_another_model_template_or_backend() -> None:
    calibration = _map()
    _check(calibration)  # fits
    for pin, value in (
        ("model", "other-model"),
        ("template_family", "gemma4"),
        ("backend", "vllm"),
        ("framing", "typevet/digits/2"),
        ("framing", "fused"),
    ):
        with pytest.raises(tv.CalibrationError, match="fitted for"):
            _check(calibration, **{pin: value})


def test_a_map_from_before_the_framing_was_pinned_is_refused() -> None:
    body = orjson.loads(_map().to_json())
    del body["pins"]["framing"]  # what an earlier SDK wrote: its default prompt differed
    body.pop("sha256")
    old = CalibrationMap.from_json(CalibrationMap(
        Pins(**body["pins"]), _map().questions, body["created"]).to_json())  # fmt: skip
    assert old.pins.framing == ""
    with pytest.raises(tv.CalibrationError, match="before the SDK pinned the prompt's framing"):
        _check(old)


def test_a_map_is_refused_for_another_question_set() -> None:
    calibration = _map()
    reordered = tv.Choice(
        {"shipping": None, "billing": None, "technical": None}, instructions="Team?"
    )
    with pytest.raises(tv.CalibrationError, match="not the one") as refused:
        _check(calibration, questions=[("route", reordered)])
    assert refused.value.question_id == "route"
    with pytest.raises(tv.CalibrationError, match="has no question 'refund'"):
        _check(calibration, questions=[("refund", REFUND)], readings={"refund": Reading()})
    with pytest.raises(tv.CalibrationError, match="reading"):
        _check(calibration, readings={"route": Reading(3, False)})


# -- rotations and the label prior -----------------------------------------------------------------


def test_rotations_are_spread_evenly_and_shown_in_rotated_order() -> None:
    assert rotation_offsets(4, 4) == (0, 1, 2, 3)
    assert rotation_offsets(4, 2) == (0, 2)
    assert rotation_offsets(2, 5) == (0, 1)
    assert rotation_order(3, 1) == (1, 2, 0)


def test_the_label_prior_of_a_purely_positional_read_is_divided_out() -> None:
    # Position d is worth prior(d) whatever it shows; the option's own worth is q.
    prior, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    reads, orders = [], []
    for offset in range(3):
        order = rotation_order(3, offset)
        by_position = prior * q[list(order)]
        by_position /= by_position.sum()
        in_option_order = np.zeros(3)
        in_option_order[list(order)] = by_position
        reads.append(tuple(in_option_order))
        orders.append(order)
    assert combine_rotations(reads, orders, label_prior=True) == pytest.approx(tuple(q))
    mean = np.mean(reads, axis=0)
    assert combine_rotations(reads, orders) == pytest.approx(tuple(mean))
    with pytest.raises(tv.QuestionError, match="all 3 rotations"):
        combine_rotations(reads[:2], orders[:2], label_prior=True)


# -- labels -----------------------------------------------------------------------------------


def test_gold_labels_are_read_by_question_type() -> None:
    score = tv.Score(["low", "high"], instructions="How much?")
    questions = [("refund", REFUND), ("route", ROUTE), ("urgency", score)]
    labels = {"refund": True, "route": "technical", "urgency": 0}
    assert gold_indices(labels, questions) == {"refund": 1, "route": 2, "urgency": 0}
    assert gold_indices({"route": "billing"}, questions) == {"route": 0}
    for bad, match in (
        ({"refund": "yes"}, "true or false"),
        ({"route": "sales"}, "one of"),
        ({"urgency": 2}, "from 0 to 1"),
        ({"urgency": True}, "from 0 to 1"),
        ({"other": 1}, "not asked"),
    ):
        with pytest.raises(tv.InvalidInputError, match=match):
            gold_indices(bad, questions)
    with pytest.raises(tv.InvalidInputError, match="labelled record"):
        labelled_record({"id": 1, "state": "x"})


# -- a session applying them -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_permutations_read_every_rotation_and_average_a_positional_bias_away() -> None:
    backend = InMemoryStubBackend()
    async with tv.Session(backend) as session:
        plain = await session.judge("ticket", {"route": ROUTE})
        rotated = await session.judge("ticket", {"route": ROUTE}, permutations=3)
    # The stub's reads favour the first line: unrotated, billing wins.
    assert plain["route"].choice == "billing"
    # Each option is shown first once: the average is uniform.
    assert list(rotated["route"].probabilities.values()) == pytest.approx([1 / 3] * 3)
    rotations = rotated.diagnostics["route"].rotations
    assert len(rotations) == 3
    assert rotations[0] == pytest.approx(tuple(plain["route"].probabilities.values()))
    assert rotated.usage.reads == 3
    assert rotated.diagnostics["route"].reads == 3
    # The rotated prompts show the options in rotated order, the controls in place.
    first_lines = [
        r.prompt.split("\n\nTeam?\n")[1].split("\n")[0] for r in backend.read_requests[1:]
    ]  # type: ignore[union-attr]
    assert first_lines == ["0. billing", "0. shipping", "0. technical"]


@pytest.mark.asyncio
async def test_permutations_by_question_and_the_label_prior() -> None:
    backend = InMemoryStubBackend()
    # A lettered Noul: a Noul in words (the default) is read in its one order.
    settings = tv.SessionSettings(permutations={"route": 3}, noul_controls="letters")
    async with tv.Session(backend, settings) as session:
        judgment = await session.judge("ticket", {"route": ROUTE, "refund": REFUND})
        assert backend.reads == ["route", "route", "route", "refund"]
        assert judgment.diagnostics["refund"].rotations == ()
        debiased = await session.judge(
            "ticket", {"route": ROUTE, "refund": REFUND}, permutations=3, label_prior=True
        )
        assert list(debiased["route"].probabilities.values()) == pytest.approx([1 / 3] * 3)
        assert debiased["refund"].noul == pytest.approx(0.5)
        before = len(backend.reads)
        with pytest.raises(tv.QuestionError, match="all 3 rotations") as refused:
            await session.judge("ticket", {"route": ROUTE}, permutations=2, label_prior=True)
        assert refused.value.question_id == "route"
        with pytest.raises(tv.QuestionError, match="does not ask"):
            await session.judge("ticket", {"route": ROUTE}, permutations={"other": 2})
        assert len(backend.reads) == before  # refused unsent
    with pytest.raises(tv.ConfigurationError, match="permutations"):
        tv.SessionSettings(permutations=0)


@pytest.mark.asyncio
async def test_a_calibration_map_is_applied_and_the_raw_probabilities_kept() -> None:
    backend = InMemoryStubBackend()
    calibration = _map()
    async with tv.Session(backend) as session:
        raw = await session.judge("ticket", {"route": ROUTE})
        calibrated = await session.judge("ticket", {"route": ROUTE}, calibration=calibration)
    raw_p = tuple(raw["route"].probabilities.values())
    diagnostics = calibrated.diagnostics["route"]
    assert diagnostics.raw_probabilities == pytest.approx(raw_p)
    assert tuple(calibrated["route"].probabilities.values()) == pytest.approx(
        transform_probabilities(Temperature(2.0), raw_p)
    )
    assert diagnostics.calibration == f"temperature {calibration.sha256}"
    assert diagnostics.logprobs == raw.diagnostics["route"].logprobs


@pytest.mark.asyncio
async def test_a_map_for_another_model_or_question_is_refused_before_any_read() -> None:
    backend = InMemoryStubBackend()
    async with tv.Session(backend) as session:
        with pytest.raises(tv.CalibrationError, match="model"):
            await session.judge("ticket", {"route": ROUTE}, calibration=_map(model="gemma-9b"))
        digits = _map(framing="typevet/digits/2")
        with pytest.raises(tv.CalibrationError, match="prompt framing 'typevet/digits/2'"):
            await session.judge("ticket", {"route": ROUTE}, calibration=digits)
        with pytest.raises(tv.CalibrationError, match="no question 'refund'"):
            await session.judge("t", {"refund": REFUND}, calibration=_map())
        stream = session.judge_many(["a", "b"], {"route": ROUTE}, calibration=_map(backend="vllm"))
        with pytest.raises(tv.CalibrationError, match="backend"):
            async for _ in stream:
                pass
    assert backend.reads == []
    with pytest.raises(tv.ConfigurationError, match="CalibrationMap"):
        tv.SessionSettings(calibration="map.json")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_remote_judging_backend_refuses_permutations_and_maps_unsent() -> None:
    capabilities = attrs.evolve(InMemoryStubBackend().capabilities, framing="remote")
    backend = InMemoryStubBackend(capabilities=capabilities)
    async with tv.Session(backend) as session:
        with pytest.raises(tv.ConfigurationError, match="reads the questions itself"):
            await session.judge("t", {"route": ROUTE}, permutations=3)
    assert backend.reads == []


def test_a_type_pooled_temperature_is_a_candidate_for_each_question_of_the_type() -> None:
    first, second = _synthetic(2.0, 300, 3, seed=5), _synthetic(2.0, 300, 3, seed=6)
    two_options = _synthetic(2.0, 300, 2, seed=7)
    fits = {"a": first, "b": second, "c": two_options}
    kinds = {"a": "Choice", "b": "Choice", "c": "Choice"}
    pooled = fitting.pooled_by_type(fits, kinds)
    assert pooled["c"] is None  # no other question of its type with as many options
    assert pooled["a"] is not None
    assert len(pooled["a"]) == 600
    best, report = fitting.choose_transform(first, second, pooled["a"])
    assert "temperature (type)" in report["heldout_nll"]
    assert best is not None
