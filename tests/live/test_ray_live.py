"""`tv.RayJudge` on a local Ray cluster (``ray.init(num_cpus=2)``, one for the module) against
the real llama.cpp server (xllamacpp, Gemma 3 270M): the same answers as `judge_many`, bad
records as error rows, and the example script `examples/ray_batch.py` on JSONL and Parquet.

Both sides use ``reproducible=True`` sessions (no prompt cache, one read at a time) and one
actor, so every read is made alone, as `judge_many`'s are: the same prompt read alone gives
bit-identical logprobs on this server, and the probabilities are compared within 1e-6.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.data

import typevet_async as tv
from typevet_async._core.wires.system_one import answer_to_system_one

from .helpers import assert_close_json

#: Ray 2.60 warns whenever a DataContext is built (its dataclass sets its deprecated fields).
pytestmark = [
    pytest.mark.live,
    pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\.data\.context"),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

REFUND = {"refund": tv.Noul(instructions="Is a refund requested?")}
ALL_THREE: dict[str, tv.Question] = {
    **REFUND,
    "route": tv.Choice(
        {"billing": "charges, refunds", "shipping": "parcels", "technical": None},
        instructions="Which team should handle the ticket?",
    ),
    "urgency": tv.Score(["can wait", "this week", "today"], instructions="How urgent is it?"),
}
ISSUES = (
    "I was charged twice for order {n} and want my money back.",
    "parcel {n} has been stuck in transit for three weeks.",
    "the app crashes when I open settings (build {n}).",
    "please send a VAT invoice for order {n}.",
    "the jacket from order {n} is the wrong size, can I return it?",
)


def ticket(n: int) -> str:
    return f"Ticket {n}: {ISSUES[n % len(ISSUES)].format(n=n)}"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local cluster for the module (starting one takes 10 to 20 s here)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


def factory(url: str) -> functools.partial[tv.Session]:
    return functools.partial(tv.Session.llama_cpp, url, reproducible=True)


def through_ray(
    url: str,
    records: list[dict[str, Any]],
    questions: dict[str, tv.Question],
    *,
    batch_size: int,
    blocks: int,
) -> list[dict[str, Any]]:
    """The records through ``map_batches(tv.RayJudge)`` on one actor running two batches at
    once (they share its session), as rows by id."""
    dataset = ray.data.from_items(records, override_num_blocks=blocks)
    judged = dataset.map_batches(
        tv.RayJudge,
        fn_constructor_kwargs={
            "session_factory": factory(url),
            "questions": questions,
            "id_column": "id",
        },
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=2),
        batch_size=batch_size,
        batch_format="pyarrow",
        num_cpus=0.5,
    )
    rows = judged.take_all()
    assert sorted(row["id"] for row in rows) == sorted(record["id"] for record in records)
    return rows


def through_judge_many(
    url: str, records: list[dict[str, Any]], questions: dict[str, tv.Question]
) -> dict[Any, tv.BatchItem]:
    async def judge() -> dict[Any, tv.BatchItem]:
        async with factory(url)() as session:
            pairs = [(record["id"], record["state"]) for record in records]
            return {item.record_id: item async for item in session.judge_many(pairs, questions)}

    return asyncio.run(judge())


def assert_same_answer(cell: dict[str, Any], answer: tv.Answer) -> None:
    """A Ray cell is the System One answer of the `judge_many` answer (within 1e-6)."""
    assert_close_json(cell, answer_to_system_one(answer))


@pytest.mark.timeout(900)  # 400 reads one at a time, plus Ray's start-up: minutes on 2 cores
def test_200_records_through_map_batches_match_judge_many(
    ray_cluster: None, gemma3_url: str
) -> None:
    records = [{"id": n, "state": ticket(n)} for n in range(200)]
    rows = through_ray(gemma3_url, records, REFUND, batch_size=25, blocks=8)
    expected = through_judge_many(gemma3_url, records, REFUND)
    assert len(rows) == 200
    for row in rows:
        item = expected[row["id"]]
        assert item.judgment is not None, item.error
        assert row["error"] is None
        assert row["state"] == ticket(row["id"])  # the input columns are kept
        assert_same_answer(row["refund"], item.judgment["refund"])


def test_a_bad_record_is_its_error_row_and_the_rest_are_answered(
    ray_cluster: None, gemma3_url: str
) -> None:
    states: list[Any] = [
        {"ticket": ticket(0), "customer": "A-1"},
        {"ticket": ticket(1), "customer": "lone \ud800 surrogate"},  # refused: not Unicode
        {"ticket": ticket(2), "customer": "A-3"},
        {"ticket": ticket(3), "spend": math.nan},  # refused: NaN is not JSON
        ticket(4),
        {"ticket": ticket(5), "customer": "A-6"},
    ]
    records = [{"id": f"t{n}", "state": state} for n, state in enumerate(states)]
    # One block, so one column type (Ray pickles the mixed states as Python objects), in
    # batches of 2.
    rows = {
        row["id"]: row
        for row in through_ray(gemma3_url, records, ALL_THREE, batch_size=2, blocks=1)
    }
    expected = through_judge_many(gemma3_url, records, ALL_THREE)
    for bad in ("t1", "t3"):
        assert rows[bad]["error"].startswith("InvalidInputError: ")
        assert all(rows[bad][qid] is None for qid in ALL_THREE)
        assert isinstance(expected[bad].error, tv.InvalidInputError)
        assert rows[bad]["error"] == f"InvalidInputError: {expected[bad].error}"
    for good in ("t0", "t2", "t4", "t5"):
        judgment = expected[good].judgment
        assert judgment is not None
        assert rows[good]["error"] is None
        for qid in ALL_THREE:
            assert_same_answer(rows[good][qid], judgment[qid])


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ray_batch", EXAMPLES / "ray_batch.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_script_judges_jsonl_and_parquet(
    ray_cluster: None, gemma3_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/tickets.jsonl has string states, an object state and a bare state."""
    example = load_example()
    common = ["--questions", str(EXAMPLES / "questions.json"), "--url", gemma3_url]
    common += ["--actors", "1", "--batch-size", "2", "--reproducible"]

    out = tmp_path / "judged.jsonl"
    assert example.main([str(EXAMPLES / "tickets.jsonl"), "--out", str(out), *common]) == 0
    lines = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert set(lines) == {"t1", "t2", "t3", "t4", None}  # the bare state has no id
    assert lines["t4"]["state"] == {
        "subject": "Invoice",
        "body": "Please send me an invoice for order 1234.",
    }
    for line in lines.values():
        assert line["error"] is None
        assert list(line) == ["id", "state", "refund", "route", "urgency", "error"]
        assert line["refund"]["type"] == "noul"
        assert line["route"]["choice"] in ("billing", "shipping", "technical")
        assert list(line["urgency"]["legend"].values()) == ["can wait", "this week", "today"]
    assert "5 rows, 0 failed" in capsys.readouterr().err

    source = tmp_path / "tickets.parquet"
    strings = [{"id": key, "state": lines[key]["state"]} for key in ("t1", "t2", "t3")]
    pq.write_table(pa.Table.from_pylist(strings), source)
    parquet_out = tmp_path / "judged.parquet"
    assert example.main([str(source), "--out", str(parquet_out), *common]) == 0
    table = pq.read_table(parquet_out)
    assert table.column_names == ["id", "state", "refund", "route", "urgency", "error"]
    assert table.column("error").null_count == 3
    for row in table.to_pylist():  # the same answers from both files
        for qid in ("refund", "route", "urgency"):
            assert_close_json(row[qid], lines[row["id"]][qid])
    assert "3/3 rows, 0 failed" in capsys.readouterr().err
