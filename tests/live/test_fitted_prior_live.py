"""A prior fitted from unlabelled states on the real llama.cpp server (Gemma 3 270M): fitted
on twelve shipped tickets (their labels unread), it divides a thirteenth's answer exactly as a
hand division of that answer as read (and its prior is the mean of the twelve answers as
read); the same through the command line (fit-prior, then judge --prior), and refused there
for a prompt it was not fitted on.

Reproducible mode (no prompt cache, one read at a time) makes every read of a prompt the
same bit for bit, so the fit, the answers as read and the divided ones are compared exactly.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import typevet_async as tv

pytestmark = [pytest.mark.live]

REPOSITORY = Path(__file__).parent.parent.parent
SHIPPED = REPOSITORY / "examples" / "eval"
#: Twelve states to fit on and a thirteenth judged with the prior, from the shipped set.
RECORDS = [json.loads(line) for line in (SHIPPED / "tickets.jsonl").read_text().splitlines()[:17]]
STATES = [record["state"] for record in RECORDS[:16]]
LATER = RECORDS[16]["state"]


def _questions() -> dict[str, tv.Question]:
    return tv.questions_from_json(json.loads((SHIPPED / "questions.json").read_text()))


def _probabilities(answer: tv.Answer) -> tuple[float, ...]:
    return tuple(answer.probabilities.values())


def _divided(read: tuple[float, ...], prior: tuple[float, ...]) -> tuple[float, ...]:
    weights = [p / q for p, q in zip(read, prior, strict=True)]
    return tuple(w / math.fsum(weights) for w in weights)


def _mean(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
    return tuple(math.fsum(row[i] for row in rows) / len(rows) for i in range(len(rows[0])))


@pytest.mark.asyncio
# 25 judgments of three questions, one read at a time: minutes on a loaded 2-core machine. The
# budget only stops a hang; nothing here is timed.
@pytest.mark.timeout(1800)
async def test_a_prior_fitted_on_twelve_states_divides_a_thirteenth_as_by_hand(
    gemma3_url: str,
) -> None:
    questions = _questions()
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        prior = await session.fit_prior(STATES, questions)
        alone = [await session.judge(state, questions) for state in STATES]
        raw = await session.judge(LATER, questions)
        judged = await session.judge(LATER, questions, prior=prior)
        plan = await session.read_plan(questions)
    assert prior.pins == plan.pins
    assert prior.pins.model == "gemma-3-270m-q4_k_m.gguf"
    divided = 0
    for question_id in questions:
        entry = prior.questions[question_id].prior
        rows = [_probabilities(judgment[question_id]) for judgment in alone]
        if entry.probabilities is None:  # the states did not vary it: left as read
            assert judged[question_id] == raw[question_id], entry.skipped
            continue
        divided += 1
        assert entry.items == len(STATES)
        assert entry.probabilities == pytest.approx(_mean(rows), abs=1e-12)
        read = _probabilities(raw[question_id])
        expected = _divided(read, entry.probabilities)
        assert _probabilities(judged[question_id]) == pytest.approx(expected, abs=1e-12)
        diagnostics = judged.diagnostics[question_id]
        assert diagnostics.raw_probabilities == pytest.approx(read, abs=1e-15)
        assert diagnostics.batch_prior == entry.probabilities
    assert divided >= 2, {q: e.prior.skipped for q, e in prior.questions.items()}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typevet_async._apps.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.asyncio
@pytest.mark.timeout(1800)  # 17 judgments, one read at a time (as above)
async def test_fit_prior_then_judge_with_it_through_the_command_line(
    gemma3_url: str, tmp_path: Path
) -> None:
    records, out = tmp_path / "tickets.jsonl", tmp_path / "prior.json"
    # eval's labelled records: fit-prior reads their states and leaves their labels.
    records.write_text("".join(json.dumps(record) + "\n" for record in RECORDS[:16]))
    server = ["--base-url", gemma3_url, "--reproducible"]
    questions = ["--questions", str(SHIPPED / "questions.json")]
    fitted = _cli(
        "fit-prior", str(records), *questions, "--out", str(out), "--no-progress", *server
    )
    assert fitted.returncode == 0, fitted.stderr
    prior = tv.FittedPrior.from_json(out.read_bytes())
    assert f"prior: {out} ({prior.sha256})" in fitted.stdout
    judged = _cli("judge", LATER, *questions, "--prior", str(out), *server)
    assert judged.returncode == 0, judged.stderr
    answers: dict[str, Any] = json.loads(judged.stdout)["answers"]
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        raw = await session.judge(LATER, _questions())
        plan = await session.read_plan(_questions())
    assert prior.pins == plan.pins
    assert {entry.prior.items for entry in prior.questions.values()} == {len(STATES)}
    for question_id, entry in prior.questions.items():
        read = _probabilities(raw[question_id])
        fitted_p = entry.prior.probabilities
        expected = read if fitted_p is None else _divided(read, fitted_p)
        shown = tuple(answers[question_id]["probabilities"].values())
        assert shown == pytest.approx(expected, abs=1e-12)
    refused = _cli("judge", LATER, *questions, "--prior", str(out), "--controls", "digits", *server)
    assert refused.returncode == 2
    assert "CalibrationError" in refused.stderr
    assert "the prior was fitted for prompt framing 'typevet/letters/2" in refused.stderr
