"""Evaluation, calibration and option-order debiasing against the real servers: the three
commands from a labelled file to a pinned map applied in production (eval, calibrate, batch
--calibration) over a slice of the shipped set (every fifth ticket: enough for calibrate to fit
and compare every candidate on each question), permutations against independent rotated reads,
and `tv.evaluate` resuming its reads file.

The whole shipped set (300 tickets) through the real instruction model is
``benchmarks/real_answers/bench_real_model.py``'s; the CLI reads it the same way at any size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import typevet_async as tv

from .helpers import TICKET, make_session

pytestmark = [pytest.mark.live]

REPOSITORY = Path(__file__).parent.parent.parent
SHIPPED = REPOSITORY / "examples" / "eval"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Every fifth shipped ticket: 60 records, about 42 to fit a map on and 18 held out (calibrate's
#: default 0.3), over the minimum of 20 to fit.
EVERY = 5
LABELS = {
    "billing": "charges, invoices, refunds",
    "shipping": "deliveries, parcels",
    "technical": "the app not working",
    "account": "logins and passwords",
}


def cli(*args: str, url: str | None) -> subprocess.CompletedProcess[str]:
    server = ["--base-url", url] if url else []  # calibrate reads files only
    return subprocess.run(
        [sys.executable, "-m", "typevet_async._apps.cli", *args, *server],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.timeout(600)  # 180 reads through the real server, then calibrate and apply
def test_eval_calibrate_and_apply_over_a_slice_of_the_shipped_set(
    gemma3_url: str, tmp_path: Path
) -> None:
    report_dir, map_path = tmp_path / "report", tmp_path / "calibration.json"
    data, questions = tmp_path / "tickets.jsonl", SHIPPED / "questions.json"
    shipped = (SHIPPED / "tickets.jsonl").read_text().splitlines()
    data.write_text("\n".join(shipped[::EVERY]) + "\n")
    count = len(shipped[::EVERY])
    evaluated = cli("eval", str(data), "--questions", str(questions), "--out", str(report_dir),
                    "--resamples", "200", "--no-progress", url=gemma3_url)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads((report_dir / "report.json").read_text())
    assert report["facts"]["records"] == count
    assert report["facts"]["failed records"] == 0
    assert report["facts"]["model"] == "gemma-3-270m-q4_k_m.gguf"
    assert set(report["questions"]) == {"refund", "route", "urgency"}
    for question_id, entry in report["questions"].items():
        assert entry["items"] == count
        found = entry["metrics"]
        assert 0 <= found["accuracy"]["low"] <= found["accuracy"]["value"] <= 1
        assert found["nll"]["value"] > 0
        assert 0 <= found["ece_width"]["value"] <= 1
        assert sum(b["count"] for b in found["bins_width"]) == count
        assert sum(label["support"] for label in entry["per_label"].values()) == count
        for kind in ("reliability", "confidence"):
            image = report_dir / f"{question_id}-{kind}.png"
            assert image.read_bytes().startswith(PNG_SIGNATURE)
        assert f"{question_id}-reliability.png" in (report_dir / "report.html").read_text()
    assert len((report_dir / "reads.jsonl").read_text().splitlines()) == count
    assert "route" in evaluated.stdout

    calibrated = cli("calibrate", str(report_dir), "--out", str(map_path), url=None)
    assert calibrated.returncode == 0, calibrated.stderr
    calibration = tv.CalibrationMap.from_json(map_path.read_bytes())
    assert calibration.pins.backend == "llama.cpp"
    assert calibration.pins.template_family == "gemma3"
    # The default layout as read: letters, a Noul in words.
    assert calibration.pins.framing == "typevet/letters/2/noul-words"
    for entry in calibration.questions.values():
        figures = entry.report
        assert figures["fit_items"] + figures["heldout_items"] == count
        # Enough to fit (calibrate's minimum is 20): every candidate was fitted and compared
        # on the held-out records, which are there only when it was.
        assert "heldout_nll_raw" in figures, figures
        if entry.transform is not None:  # kept only where it lowered the held-out NLL
            assert figures["heldout_nll"][figures["kept"]] < figures["heldout_nll_raw"]

    records = tmp_path / "production.jsonl"
    records.write_text(
        "\n".join(json.dumps({"id": n, "state": f"{TICKET} ({n})"}) for n in range(4)) + "\n"
    )
    answers = tmp_path / "answers.jsonl"
    applied = cli("batch", str(records), "--questions", str(questions), "--out", str(answers),
                  "--calibration", str(map_path), "--no-progress", url=gemma3_url)  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    assert len(answers.read_text().splitlines()) == 4

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"refund": {"type": "noul", "instructions": "Money back?"}}))
    refused = cli("judge", TICKET, "--questions", str(other), "--calibration", str(map_path),
                  url=gemma3_url)  # fmt: skip
    assert refused.returncode == 2
    assert "CalibrationError" in refused.stderr
    assert "not the one the calibration map was fitted on" in refused.stderr


def _probabilities(answer: tv.Answer) -> dict[Any, float]:
    return dict(answer.probabilities)


@pytest.mark.asyncio
async def test_permutations_equal_the_mean_of_independent_rotated_reads(
    backend: tuple[str, str],
) -> None:
    exact = {"reproducible": True} if backend[0] == "llama_cpp" else {"max_concurrency": 1}
    items = list(LABELS.items())
    async with make_session(backend, **exact) as session:
        for state in (TICKET, "I cannot log in since I changed my password."):
            question = tv.Choice(LABELS, instructions="Which team should handle it?")
            rotated = await session.judge(state, {"route": question}, permutations=4)
            reads = []
            for offset in range(4):
                shown = dict(items[offset:] + items[:offset])
                alone = tv.Choice(shown, instructions="Which team should handle it?")
                reads.append(
                    _probabilities((await session.judge(state, {"route": alone}))["route"])
                )
            mean = {label: sum(read[label] for read in reads) / 4 for label in LABELS}
            for label in LABELS:
                assert rotated["route"].probabilities[label] == pytest.approx(mean[label], abs=1e-6)
            diagnostics = rotated.diagnostics["route"]
            assert len(diagnostics.rotations) == 4
            assert rotated.usage.reads == 4
            for offset, read in enumerate(diagnostics.rotations):
                in_option_order = tuple(reads[offset][label] for label in LABELS)
                assert read == pytest.approx(in_option_order, abs=1e-6)


@pytest.mark.asyncio
async def test_evaluate_resumes_its_reads_file(gemma3_url: str, tmp_path: Path) -> None:
    lines = (SHIPPED / "tickets.jsonl").read_text().splitlines()[:12]
    records = [orjson.loads(line) for line in lines]
    questions = tv.questions_from_json(json.loads((SHIPPED / "questions.json").read_text()))
    out = tmp_path / "reads.jsonl"
    async with tv.Session.llama_cpp(gemma3_url) as session:
        first = await tv.evaluate(session, records[:5], questions, out=out)
        assert first.records == 5
        with pytest.raises(tv.InvalidInputError, match="not empty"):
            await tv.evaluate(session, records, questions, out=out)
        resumed = await tv.evaluate(session, records, questions, out=out, resume=True)
        with pytest.raises(tv.InvalidInputError, match="other questions"):
            await tv.evaluate(session, records, questions, out=out, resume=True, permutations=2)
    assert resumed.records == 12
    ids = [orjson.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [record["id"] for record in records]  # none judged twice, none lost
    report = resumed.report(resamples=0)
    assert report["questions"]["route"]["items"] == 12
    again = tv.Evaluation.from_reads(out)
    assert again.report(resamples=0)["questions"] == report["questions"]
