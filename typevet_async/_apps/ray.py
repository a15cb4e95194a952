"""Batches on Ray Data: `RayJudge`, an async callable class for ``Dataset.map_batches``.

    ds = ray.data.read_json("tickets.jsonl")
    judged = ds.map_batches(
        tv.RayJudge,
        fn_constructor_kwargs={
            "session_factory": functools.partial(tv.Session.llama_cpp, url, max_concurrency=8),
            "questions": questions,
        },
        # 2 actors, each with its own session; 4 batches at once on one actor share its cap
        compute=ray.data.ActorPoolStrategy(size=2, max_concurrent_calls_per_actor=4),
        batch_size=32,
        batch_format="pyarrow",
        num_cpus=0.25,          # an actor waits on the server: it needs little CPU
    )

How Ray runs it (Ray Data 2.60, ``ray/data/_internal/planner/plan_udf_map_op.py``): an async
``__call__`` makes every actor start one event loop of its own, in a thread, and run every
batch on it, whichever of the actor's ``max_concurrent_calls_per_actor`` threads hands the
batch in (and within one task up to four batches at once). So one `RayJudge` instance per
actor, one loop:

- **one session per actor**, built by ``session_factory`` (a picklable zero-argument callable
  returning an unopened `Session`) and opened lazily by the first batch, on the actor's loop;
  a failed opening is raised from that batch, and the next batch tries again;
- **one concurrency cap per actor**: every batch is a ``session.judge_many`` of that session,
  so the batches running at once share its ``max_concurrency`` (the session's one semaphore);
  ``max_in_flight`` caps the records one batch judges at once (None: the session's cap);
- **one bad record never fails a Ray task**: a record's error is its row's ``error`` cell,
  ``"ErrorType: message"``. What would fail every record the same way (the batch's opening
  probe: an unreachable server, a wrong model pin; an unsupported template; a closed session;
  a missing state column) is raised, and the task fails as Ray reports a UDF's error, instead
  of writing an error row per record.

**Columns.** Every input column is kept, in order, and row order is preserved. Each question
id adds one column of the System One answer shape (`answer_to_system_one`), as an Arrow
struct whose type is fixed by the question, not inferred from the rows (so every batch,
whatever failed in it, has the same schema):

- Noul: ``struct<type: string, noul: double>``;
- Choice: ``struct<type: string, choice: string, confidence: double,
  probabilities: struct<label: double, ...>>`` (labels in option order);
- Score: ``struct<type: string, score: double, confidence: double,
  legend: struct<"0": string, ...>, probabilities: struct<"0": double, ...>>``.

A cell's ``as_py()`` (``to_pylist()``, a pandas row, a Ray ``take()``) is the System One answer
dict itself; a failed row's cells are null. Then an ``error`` column: null, or the error's type
name and message. The output is always a ``pyarrow.Table`` (Ray accepts one whatever the
``batch_format``); a batch in another format is first made into one as Ray itself makes a
returned batch into a block (`BlockAccessor.batch_to_block`).

**States** are read with ``to_pylist()``: a string column gives strings, a struct column dicts
(Arrow unifies the keys of a column: a key some rows lack is there as null in those rows), a
column Arrow could not type (Ray pickles its Python objects) the objects themselves. A null
cell is a missing value, not the JSON state ``null``: its row gets an `InvalidInputError` and
is not judged.

The session is closed when Ray shuts the actor down gracefully (Ray Data deletes the instance:
``__del__``), or by ``await judge.aclose()`` where you call an instance yourself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import typevet_async as tv
from typevet_async._apps.presenting import error_text
from typevet_async._core.prompts.questions import check_questions
from typevet_async._core.wires.system_one import Value, answer_to_system_one, wire_fields

try:
    import numpy as np
    import pyarrow as pa
    from ray.data.block import BlockAccessor, BlockType
except ImportError as missing:  # pragma: no cover - the ray extra is installed in CI
    raise ImportError(
        f"tv.RayJudge needs Ray Data ({missing.name} is missing): pip install 'typevet_async[ray]'"
    ) from missing

__all__ = ["ERROR_COLUMN", "RayJudge", "answer_type"]

#: The column that holds each row's error, or null.
ERROR_COLUMN: Final = "error"

#: Seconds ``__del__`` waits for the session to close on the actor's loop.
_CLOSE_TIMEOUT: Final = 10.0

logger = logging.getLogger(__name__)


def answer_type(question: tv.Question) -> Any:
    """The Arrow struct type of ``question``'s answers in the System One shape: its answer
    type's declared wire fields in order (`typevet_async._core.wires.system_one.schema`), a Choice's
    and a Score's probabilities and legend a struct over the question's own options."""
    kind = (
        "noul"
        if isinstance(question, tv.Noul)
        else "choice"
        if isinstance(question, tv.Choice)
        else "score"
    )
    keys = (
        [option.label for option in question.options()]
        if isinstance(question, tv.Choice)
        else [str(level) for level in range(len(question.options()))]
    )
    scalars = {
        Value.TAG: pa.string(),
        Value.LABEL: pa.string(),
        Value.PROBABILITY: pa.float64(),
        Value.NUMBER: pa.float64(),
        Value.PROBABILITIES: pa.struct([(key, pa.float64()) for key in keys]),
        Value.LEGEND: pa.struct([(key, pa.string()) for key in keys]),
    }
    return pa.struct([(field.name, scalars[field.value]) for field in wire_fields(kind)])


def _plain(value: Any) -> Any:
    """A value with numpy's arrays and scalars made Python lists and scalars (what a column
    Ray typed as a tensor, or pickled, may hold)."""
    if isinstance(value, np.ndarray):
        return [_plain(member) for member in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: _plain(member) for key, member in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(member) for member in value]
    return value


def _as_table(batch: Any) -> Any:
    """The batch as a ``pyarrow.Table``, made the way Ray makes a returned batch a block."""
    if isinstance(batch, pa.Table):
        return batch
    block = BlockAccessor.batch_to_block(batch, block_type=BlockType.ARROW)
    if not isinstance(block, pa.Table):  # Ray fell back to a pandas block
        block = BlockAccessor.for_block(block).to_arrow()
    return block


def _column_values(table: Any, name: str, what: str) -> list[Any]:
    if name not in table.column_names:
        raise ValueError(
            f"tv.RayJudge: the batch has no {what} column {name!r} (columns: {table.column_names})"
        )
    column = table.column(name)
    values: list[Any] = column.to_pylist()
    if isinstance(column.type, pa.ExtensionType):  # a tensor or pickled objects
        values = [_plain(value) for value in values]
    return values


class RayJudge:
    """An async callable class for ``ray.data.Dataset.map_batches``: judges each row's state
    with every question and adds the answers and an ``error`` column (module docstring).

    Give its arguments as ``fn_constructor_kwargs``; Ray builds one instance per actor.

    :param session_factory: a picklable zero-argument callable returning an unopened `Session`,
        e.g. ``functools.partial(tv.Session.llama_cpp, url, max_concurrency=8)``. Called once
        per actor, on its event loop; the session's ``max_concurrency`` is the actor's cap.
    :param questions: question id -> `Noul`, `Choice` or `Score` (they pickle); each id is
        an output column, so none may be ``"error"`` or an input column's name.
    :param state_column: the column holding each record's state.
    :param id_column: a column naming each record, if any: the warning logged for a batch
        with failed rows names the first one by it (every input column is kept in the output
        anyway). It must be in every batch.
    :param max_in_flight: records one batch judges at once (None: the session's
        ``max_concurrency``); the reads of every batch still share the session's cap.
    :raises QuestionError: a question that is not one (checked when the actor starts).
    :raises ValueError: a question id that is ``"error"``, or a state or id column named like
        a question.
    """

    def __init__(
        self,
        session_factory: Callable[[], tv.Session],
        questions: Mapping[str, tv.Question],
        *,
        state_column: str = "state",
        id_column: str | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        if not callable(session_factory):
            raise TypeError(
                "session_factory must be a zero-argument callable returning a tv.Session, "
                f"got {type(session_factory).__name__}"
            )
        self._questions = dict(check_questions(questions))
        columns = {ERROR_COLUMN, state_column} | ({id_column} if id_column else set())
        clashes = columns & set(self._questions)
        if clashes:
            raise ValueError(
                f"tv.RayJudge: question ids become output columns; {sorted(clashes)} is the "
                "error column, the state column or the id column"
            )
        self._types = {qid: answer_type(question) for qid, question in self._questions.items()}
        self._factory = session_factory
        self._state_column = state_column
        self._id_column = id_column
        self._max_in_flight: int | tv.Unset = tv.UNSET if max_in_flight is None else max_in_flight
        self._session: tv.Session | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return (
            f"RayJudge(questions={list(self._questions)}, state_column={self._state_column!r}, "
            f"session={self._session!r})"
        )

    async def _open(self) -> tv.Session:
        """The actor's session, built and opened by the first batch (the others wait)."""
        if self._session is not None:
            return self._session
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._session is None:
                session = self._factory()
                if not isinstance(session, tv.Session):
                    raise TypeError(
                        f"session_factory must return a tv.Session, got {type(session).__name__}"
                    )
                await session.open()
                self._session, self._loop = session, asyncio.get_running_loop()
        return self._session

    async def __call__(self, batch: Any) -> Any:
        """Judge one batch: the input table with one column per question and ``error``."""
        table = _as_table(batch)
        taken = set(self._types) | {ERROR_COLUMN}
        clashes = sorted(taken & set(table.column_names))
        if clashes:
            raise ValueError(
                f"tv.RayJudge: the batch already has the output column(s) {clashes}: rename "
                "them, or the question ids"
            )
        states = _column_values(table, self._state_column, "state")
        ids = None if self._id_column is None else _column_values(table, self._id_column, "id")
        cells: dict[str, list[dict[str, Any] | None]] = {
            qid: [None] * len(states) for qid in self._types
        }
        errors: list[str | None] = [None] * len(states)
        records: list[tuple[int, Any]] = []
        for row, state in enumerate(states):
            if state is None:
                errors[row] = error_text(
                    tv.InvalidInputError(
                        f"the {self._state_column!r} cell is null (a missing value): not judged"
                    )
                )
            else:
                records.append((row, state))
        if records:
            session = await self._open()
            stream = session.judge_many(
                records, self._questions, ordered=False, max_in_flight=self._max_in_flight
            )
            async with contextlib.aclosing(stream):
                async for item in stream:
                    row = item.record_id
                    if item.judgment is None:
                        assert item.error is not None
                        errors[row] = error_text(item.error)
                        continue
                    for qid, answer in item.judgment.answers.items():
                        cells[qid][row] = answer_to_system_one(answer)
        self._log_failures(errors, ids)
        for qid, kind in self._types.items():
            table = table.append_column(pa.field(qid, kind), pa.array(cells[qid], type=kind))
        return table.append_column(
            pa.field(ERROR_COLUMN, pa.string()), pa.array(errors, type=pa.string())
        )

    def _log_failures(self, errors: list[str | None], ids: list[Any] | None) -> None:
        failed = [row for row, error in enumerate(errors) if error is not None]
        if not failed:
            return
        first = failed[0]
        name = f"row {first} of the batch" if ids is None else f"record {ids[first]!r}"
        logger.warning(
            "tv.RayJudge: %d of %d rows failed (see the %r column); the first, %s: %s",
            len(failed),
            len(errors),
            ERROR_COLUMN,
            name,
            errors[first],
        )

    async def aclose(self) -> None:
        """Close the session, if one was opened (on the loop that opened it)."""
        session, self._session, self._loop = self._session, None, None
        if session is not None:
            await session.aclose()

    def __del__(self) -> None:
        """Close the session on the actor's loop (Ray Data deletes the instance when it shuts
        the actor down gracefully)."""
        session, loop = getattr(self, "_session", None), getattr(self, "_loop", None)
        if session is None or loop is None or loop.is_closed():
            return
        self._session = self._loop = None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        with contextlib.suppress(Exception):
            if not loop.is_running():
                return
            closing = asyncio.run_coroutine_threadsafe(session.aclose(), loop)
            if running is not loop:  # collected on the loop's own thread: cannot wait there
                closing.result(timeout=_CLOSE_TIMEOUT)
