"""`tv.evaluate` and the eval/calibrate commands' checks, over the in-memory stub backend
(whose reads favour the first position whatever the options say) or with no server at all:
what is refused before anything is sent, what a reads file holds, and a map fitted from it."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import orjson
import pytest

import typevet_async as tv
from typevet_async._apps import cli as _cli

from .stubs import InMemoryStubBackend

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Refund?"),
    "route": tv.Choice(
        {"billing": None, "shipping": None, "technical": None}, instructions="Team?"
    ),
}
ROUTES = ("billing", "shipping", "technical")


def records(count: int) -> list[dict[str, object]]:
    return [
        {"id": f"r{n}", "state": f"ticket {n}",
         "labels": {"refund": n % 2 == 0, "route": ROUTES[n % 3]}}
        for n in range(count)
    ]  # fmt: skip


def write_questions(tmp_path: Path) -> Path:
    path = tmp_path / "questions.json"
    path.write_text(json.dumps({"refund": {"type": "noul", "instructions": "Refund?"}}))
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": 1, "state": "x", "labels": {"refund": "yes"}}', "line 2: .*true or false"),
        ('{"id": 1, "state": "x"}', "line 2: .*labelled record"),
        ('{"id": 1, "state": "x", "labels": {"other": true}}', "line 2: .*not asked"),
        ("{cut", "line 2: not valid JSON"),
    ],
)
def test_eval_refuses_a_bad_line_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    data = tmp_path / "data.jsonl"
    good = '{"id": 0, "state": "x", "labels": {"refund": true}}'
    data.write_text(f"{good}\n{line}\n")
    # An unreachable URL: a command that sent anything would fail with a TransportError.
    questions = write_questions(tmp_path)
    out = tmp_path / "out"
    code = _cli.main(["eval", str(data), "--questions", str(questions), "--out", str(out),
                      "--base-url", "http://127.0.0.1:9"])  # fmt: skip
    assert code == _cli.EXIT_ERROR
    error = capsys.readouterr().err
    assert "TransportError" not in error
    assert len(error.splitlines()) == 1
    assert re.search(message, error), error
    assert not (tmp_path / "out").exists()


def test_calibrate_names_a_folder_that_eval_did_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _cli.main(["calibrate", str(tmp_path), "--out", str(tmp_path / "map.json")])
    assert code == _cli.EXIT_ERROR
    assert "not an eval run's facts" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_evaluate_keeps_reads_with_their_labels_and_fits_a_pinned_map(
    tmp_path: Path,
) -> None:
    backend = InMemoryStubBackend()
    out = tmp_path / "reads.jsonl"
    async with tv.Session(backend) as session:
        evaluation = await tv.evaluate(session, records(90), QUESTIONS, out=out, permutations=3)
    assert evaluation.records == 90
    assert evaluation.failed == 0
    route = evaluation.reads["route"]
    assert route.gold[:3] == [0, 1, 2]
    # Every option was shown first once: the stub's positional preference averages out.
    assert route.probabilities[0] == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert len(route.rotations[0]) == 3
    lines = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == [f"r{n}" for n in range(90)]
    assert lines[0]["labels"] == {"refund": True, "route": "billing"}
    assert len(lines[0]["answers"]["route"]["rotations"]) == 3

    report = evaluation.report(resamples=0)
    entry = report["questions"]["route"]
    assert entry["items"] == 90
    assert entry["metrics"]["accuracy"]["value"] == pytest.approx(1 / 3)  # ties go to billing
    assert entry["order_sensitivity"]["rotations"] == 3
    assert entry["order_sensitivity"]["flip_rate"] == 1.0  # each rotation's first line wins
    # The refund Noul is asked in words (the default), read in its one order: once.
    assert report["facts"]["permutations"] == "1, 3"

    calibration = evaluation.fit(holdout=0.3)
    assert calibration.pins.model == "stub-model"
    assert calibration.pins.backend == "custom"
    assert calibration.questions["route"].reading.rotations == 3
    again = tv.Evaluation.from_reads(out).fit(holdout=0.3)
    assert again.questions == calibration.questions
    assert again.pins == calibration.pins

    async with tv.Session(InMemoryStubBackend()) as session:
        with pytest.raises(tv.CalibrationError, match="reading"):
            await session.judge("t", QUESTIONS, calibration=calibration)
        judgment = await session.judge("t", QUESTIONS, calibration=calibration, permutations=3)
        mapped = await tv.evaluate(
            session, records(30), QUESTIONS, permutations=3, calibration=calibration
        )
    assert judgment.diagnostics["route"].calibration is not None
    mapped_report = mapped.report(resamples=0)
    assert mapped_report["facts"]["calibration"] == calibration.sha256
    for question_id, entry in mapped_report["questions"].items():
        assert entry["raw_metrics"] is not None
        assert entry["calibration"]["map"] == calibration.sha256
        kept = calibration.questions[question_id].transform
        assert entry["calibration"]["transform"] == ("none" if kept is None else kept.kind)

    written = evaluation.write(tmp_path / "report", resamples=0)
    assert written == evaluation.report(resamples=0)
    for name in ("report.json", "report.html", "route-reliability.png", "refund-confidence.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0


@pytest.mark.asyncio
async def test_evaluate_refuses_bad_records_and_repeated_ids() -> None:
    async with tv.Session(InMemoryStubBackend()) as session:
        with pytest.raises(tv.InvalidInputError, match="appears twice"):
            await tv.evaluate(session, records(3) + records(1), QUESTIONS)
        bad = {"id": "x", "state": "s", "labels": {"route": "sales"}}
        with pytest.raises(tv.InvalidInputError, match="one of"):
            await tv.evaluate(session, [bad], QUESTIONS)
        evaluation = await tv.evaluate(session, records(3), QUESTIONS)
        with pytest.raises(tv.InvalidInputError, match="holdout"):
            evaluation.fit(holdout=1.5)


@pytest.mark.asyncio
async def test_resuming_a_reads_file_cut_by_a_kill_or_missing_its_last_line_break(
    tmp_path: Path,
) -> None:
    out = tmp_path / "reads.jsonl"
    async with tv.Session(InMemoryStubBackend()) as session:
        await tv.evaluate(session, records(3), QUESTIONS, out=out)
        out.write_bytes(out.read_bytes().rstrip(b"\n"))  # complete, but no line break
        await tv.evaluate(session, records(4), QUESTIONS, out=out, resume=True)
        out.write_bytes(out.read_bytes()[:-20])  # the last line cut short: judged again
        resumed = await tv.evaluate(session, records(6), QUESTIONS, out=out, resume=True)
        (tmp_path / "reads.jsonl.run.json").unlink()
        with pytest.raises(tv.InvalidInputError, match="cannot be resumed"):
            await tv.evaluate(session, records(6), QUESTIONS, out=out, resume=True)
    ids = [orjson.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [f"r{n}" for n in range(6)]
    assert resumed.records == 6


def eval_folder(tmp_path: Path) -> Path:
    """A folder as eval leaves it: reads.jsonl and its facts, from the stub."""
    folder = tmp_path / "run"

    async def run() -> None:
        async with tv.Session(InMemoryStubBackend()) as session:
            await tv.evaluate(session, records(40), QUESTIONS, out=folder / "reads.jsonl")

    asyncio.run(run())
    return folder


@pytest.mark.parametrize("bad", ["[1, 2]", '{"id": "x"}', '{"id": "x", "labels": 3}', '"text"'])
def test_a_reads_line_of_the_wrong_shape_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    folder = eval_folder(tmp_path)
    reads = folder / "reads.jsonl"
    lines = reads.read_text().splitlines()
    lines.insert(3, bad)
    reads.write_text("\n".join(lines) + "\n")
    with pytest.raises(tv.InvalidInputError, match="line 4 is JSON but not a reads line"):
        tv.Evaluation.from_reads(reads)
    assert _cli.main(["calibrate", str(folder), "--out", str(tmp_path / "map.json")]) == 2
    error = capsys.readouterr().err
    assert "line 4 is JSON but not a reads line" in error
    assert "Traceback" not in error

    async def resume() -> None:
        async with tv.Session(InMemoryStubBackend()) as session:
            await tv.evaluate(session, records(40), QUESTIONS, out=reads, resume=True)

    with pytest.raises(tv.InvalidInputError, match="line 4 is JSON but not a reads line"):
        asyncio.run(resume())


@pytest.mark.parametrize("name", ["reads.jsonl", "reads.jsonl.run.json", "report.json"])
def test_calibrate_refuses_to_write_its_map_over_the_runs_own_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # --out DIR/reads.jsonl exited 0 and replaced the reads with the map.
    folder = eval_folder(tmp_path)
    before = (folder / "reads.jsonl").read_bytes()
    target = folder / "sub" / ".." / name  # another spelling of the same file
    assert _cli.main(["calibrate", str(folder), "--out", str(target)]) == 2
    assert f"is the eval run's own {name}" in capsys.readouterr().err
    assert (folder / "reads.jsonl").read_bytes() == before


def test_figures_have_unique_bounded_plain_names_and_the_report_survives_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "a b" and "a_b" wrote the same PNGs; "usd_$_eur_$" was read as math markup (exit 1 after
    # every record was judged); a 250-character id was "file name too long"; no report.json.
    noul = tv.Noul(instructions="Refund?")
    ids = ["a b", "a_b", "usd_$_eur_$", "q" * 250, "route"]
    questions = {question_id: noul for question_id in ids}
    rows = [
        {"id": f"r{n}", "state": f"ticket {n}", "labels": dict.fromkeys(ids, n % 2 == 0)}
        for n in range(30)
    ]

    async def run() -> tv.Evaluation:
        async with tv.Session(InMemoryStubBackend()) as session:
            return await tv.evaluate(session, rows, questions)

    evaluation = asyncio.run(run())
    evaluation.write(tmp_path / "report", resamples=0)
    pngs = sorted(path.name for path in (tmp_path / "report").glob("*.png"))
    assert len(pngs) == 2 * len(ids)  # none shared
    assert "route-reliability.png" in pngs  # a plain id keeps its own name
    assert max(len(name) for name in pngs) < 100
    assert (tmp_path / "report" / "report.json").exists()

    from typevet_async._apps.evaluation import report as _report

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no renderer")

    monkeypatch.setattr(_report, "confidence_png", broken)
    report = evaluation.write(tmp_path / "again", resamples=0)
    assert len(report["figures_not_drawn"]) == len(ids)
    written = json.loads((tmp_path / "again" / "report.json").read_text())
    assert "RuntimeError: no renderer" in written["figures_not_drawn"][0]
    assert (tmp_path / "again" / "report.html").exists()


def test_eval_names_a_cache_file_that_cannot_be_opened_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": 0, "state": "x", "labels": {"refund": true}}\n')
    cache = tmp_path / "no-such-folder" / "reads.db"
    code = _cli.main(["eval", str(data), "--questions", str(write_questions(tmp_path)),
                      "--out", str(tmp_path / "out"), "--cache", str(cache),
                      "--base-url", "http://127.0.0.1:9"])  # fmt: skip
    assert code == _cli.EXIT_ERROR
    error = capsys.readouterr().err
    assert "ConfigurationError" in error
    assert str(cache) in error
    assert "TransportError" not in error
