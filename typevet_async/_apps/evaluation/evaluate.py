"""`evaluate`: judge labelled records through the public `Session` API (``read_plan`` and
``judge_many``: bounded concurrency and memory, typed error items) into an `Evaluation`,
appending every record's reads to a JSONL file as they come so that a long run resumes where
it stopped (`typevet_async._apps.jsonl`).

This module needs the ``eval`` extra (numpy, scipy, matplotlib, jinja2); importing the SDK
does not import it.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import orjson

import typevet_async as tv
from typevet_async._apps.evaluation.evaluation import Evaluation, QuestionReads, read_lines
from typevet_async._apps.jsonl import (
    Resumable,
    dumps,
    error_fields,
    open_to_continue,
    refuse_overwrite,
)
from typevet_async._core.prompts.questions import check_questions
from typevet_async._core.statistics.content_free import divide_prior
from typevet_async._core.statistics.labels import gold_indices, labelled_record
from typevet_async._core.wires.jsonvalues import record_key
from typevet_async._core.wires.system_one import question_to_system_one

__all__ = ["evaluate", "run_facts"]


async def evaluate(
    session: tv.Session,
    records: Iterable[Any] | AsyncIterable[Any],
    questions: Mapping[str, tv.Question],
    *,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    permutations: int | Mapping[str, int] | tv.Unset = tv.UNSET,
    label_prior: bool | tv.Unset = tv.UNSET,
    calibration: tv.CalibrationMap | tv.Unset | None = tv.UNSET,
    prior: tv.FittedPrior | tv.Unset | None = tv.UNSET,
    max_in_flight: int | tv.Unset = tv.UNSET,
    on_progress: Callable[[tv.Progress], None] | None = None,
) -> Evaluation:
    """Judge labelled records and gather each question's reads with its gold option.

    :param records: ``{"id": ..., "state": ..., "labels": {question id: gold}}`` mappings (a
        Noul's gold is true/false, a Choice's a label, a Score's its 0-based level); ids
        unique.
    :param out: a JSONL file each record's reads are appended to as they come (flushed).
    :param resume: continue ``out``: its records are loaded, not judged again (a last line
        cut short is judged again); it must have been made with the same questions, model,
        backend, template family, permutations, calibration and prior.
    :param permutations: as `Session.judge` (``label_prior``, ``calibration`` and ``prior``
        too: with a prior, the answers measured are divided by it, the raw ones kept).
    :raises InvalidInputError: a bad record or label (the records before it are judged and,
        with ``out``, kept), or an ``out`` that cannot be resumed.
    :raises CalibrationError: ``calibration`` (or ``prior``) was not fitted for this
        session's reads.
    """
    checked = check_questions(questions)
    plan = await session.read_plan(
        questions,
        permutations=permutations,
        label_prior=label_prior,
        calibration=calibration,
        prior=prior,
    )
    evaluation = Evaluation(
        checked,
        plan.pins,
        plan.readings,
        plan.calibration,
        {question_id: QuestionReads() for question_id, _ in checked},
        prior=plan.prior,
    )
    path = None if out is None else Path(out)
    done: set[str] = set()
    resumable = Resumable() if path is None else _prepare(evaluation, path, resume, done)
    pending = _Pending(checked, done)
    stream = session.judge_many(
        pending.records(records),
        questions,
        max_in_flight=max_in_flight,
        on_progress=on_progress,
        permutations=plan.permutations,
        label_prior=plan.label_prior,
        calibration=plan.calibration,
        prior=plan.prior,
    )
    sink = None if path is None else open_to_continue(path, resumable)
    with sink if sink is not None else contextlib.nullcontext():
        async with contextlib.aclosing(stream):
            async for item in stream:
                if item.judgment is not None:
                    evaluation.usage += item.judgment.usage
                line = _line(item, *pending.labels_of.pop(item.index))
                evaluation.add_line(line)
                _write(sink, line)
    return evaluation


def _write(sink: io.FileIO | None, line: Mapping[str, Any]) -> None:
    if sink is not None:
        sink.write(dumps(line) + b"\n")


def _prepare(evaluation: Evaluation, path: Path, resume: bool, done: set[str]) -> Resumable:
    """Check that ``path`` may be written (or resumed: made with the same questions, model,
    backend, template family, permutations and calibration, its ``.run.json`` says), load what
    it holds when resuming, and write the run's facts next to it.

    :raises InvalidInputError: it cannot be written or resumed, naming why.
    """
    facts_path = path.with_name(path.name + ".run.json")
    facts = run_facts(evaluation)
    if resume and facts_path.exists():
        try:
            found = orjson.loads(facts_path.read_bytes())
        except orjson.JSONDecodeError as error:
            raise tv.InvalidInputError(
                f"{facts_path} is not an eval run's facts ({error}): {path} cannot be resumed; "
                "evaluate into a new file"
            ) from None
        if found != orjson.loads(orjson.dumps(facts)):
            raise tv.InvalidInputError(
                f"{path} was made with other questions, model, backend, template family, "
                f"permutations, calibration or prior ({facts_path}); evaluate into a new file"
            )
    elif resume and path.exists() and path.stat().st_size:
        raise tv.InvalidInputError(
            f"{path} has no {facts_path.name} saying what it was made with: it cannot be "
            "resumed; evaluate into a new file"
        )
    refuse_overwrite(path, resume=resume, named=str(path), how_to_resume="pass resume=True")
    resumable = read_lines(evaluation, path, done) if resume else Resumable()
    path.parent.mkdir(parents=True, exist_ok=True)
    facts_path.write_bytes(orjson.dumps(facts, option=orjson.OPT_INDENT_2))
    return resumable


@attrs.define
class _Pending:
    """The records still to judge: each checked (its labels, its id not seen before) as it is
    pulled, those a resumed file has skipped, the labels of each one sent kept by its index."""

    checked: tuple[tuple[str, tv.Question], ...]
    done: set[str]
    seen: set[str] = attrs.Factory(set)
    labels_of: dict[int, tuple[Any, Mapping[str, Any]]] = attrs.Factory(dict)

    async def records(self, records: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
        pulled = 0
        async for data in _each(records):
            record_id, state, labels = labelled_record(data)
            gold_indices(labels, self.checked)  # a bad label is refused before it is sent
            key = record_key(record_id)
            if key in self.seen:
                raise tv.InvalidInputError(f"the record id {record_id!r} appears twice")
            self.seen.add(key)
            if key in self.done:
                continue
            self.labels_of[pulled] = (record_id, labels)
            pulled += 1
            yield record_id, state


async def _each(records: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(records, AsyncIterable):
        async for record in records:
            yield record
    else:
        for record in records:
            yield record


def _line(item: tv.BatchItem, record_id: Any, labels: Mapping[str, Any]) -> dict[str, Any]:
    if item.judgment is None:
        assert item.error is not None
        return {"id": record_id, "labels": labels, "error": error_fields(item.error)}
    return {"id": record_id, "labels": labels, "answers": _answer_reads(item.judgment)}


def _answer_reads(judgment: tv.Judgment) -> dict[str, dict[str, Any]]:
    reads: dict[str, dict[str, Any]] = {}
    for question_id, answer in judgment.answers.items():
        diagnostics = judgment.diagnostics.get(question_id)
        raw = diagnostics.raw_probabilities if diagnostics is not None else None
        prior = diagnostics.content_free_prior if diagnostics is not None else None
        if raw is not None and prior is not None:  # a map is fitted after the prior's division
            raw = divide_prior(raw, prior)
        reads[question_id] = {
            "probabilities": list(answer.probabilities.values()),
            "raw": None if raw is None else list(raw),
            "rotations": [] if diagnostics is None else [list(r) for r in diagnostics.rotations],
        }
    return reads


def run_facts(evaluation: Evaluation) -> dict[str, Any]:
    """What a reads file was made with: a resumed run must match it."""
    return {
        "format": "typevet_async.eval-run",
        "version": 1,
        "pins": attrs.asdict(evaluation.pins),
        "readings": {qid: attrs.asdict(reading) for qid, reading in evaluation.readings.items()},
        "calibration": None if evaluation.calibration is None else evaluation.calibration.sha256,
        "questions": {qid: question_to_system_one(q) for qid, q in evaluation.questions},
        # Only when there is one: a run made before priors existed resumes as it did.
        **({} if evaluation.prior is None else {"prior": evaluation.prior.sha256}),
    }
