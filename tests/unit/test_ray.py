"""`tv.RayJudge` without a Ray cluster: the lazy import, the answer columns' Arrow types, the
constructor's checks, and batches called directly, as Ray calls them, against the SIMULATED
llama.cpp server of `benchmarks.client_cost.replay_server` (real recorded llama.cpp bodies, a fixed
service time and a fixed number of slots, in a child process). The simulation is used where a
real server cannot do the job: it counts the reads it holds at once and the probes it answers.
The same class on a real Ray cluster and the real server: ``tests/live/test_ray_live.py``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import typevet_async as tv
from benchmarks.client_cost.replay_server import RECORDED_SETTINGS, ReplayServerProcess
from typevet_async._apps.ray import ERROR_COLUMN, RayJudge, answer_type
from typevet_async._core.reading.answers import build_answer
from typevet_async._core.wires.system_one import answer_to_system_one

#: Ray 2.60 warns whenever a DataContext is built (its dataclass sets its deprecated fields).
RAY_DATA_CONTEXT_WARNING = r"ignore::DeprecationWarning:ray\.data\.context"

pytestmark = pytest.mark.filterwarnings(RAY_DATA_CONTEXT_WARNING)

T = TypeVar("T")

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "route": tv.Choice(
        {"billing": "Money matters", "shipping": None, "technical": None},
        instructions="Which team?",
    ),
    "urgency": tv.Score(["can wait", "this week", "today"], instructions="How urgent?"),
}


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )


# -- the lazy name ---------------------------------------------------------------------------


def test_importing_the_sdk_does_not_import_ray() -> None:
    done = run_python(
        "import sys, typevet_async; print('ray' in sys.modules, 'pyarrow' in sys.modules)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_naming_rayjudge_without_ray_says_how_to_install() -> None:
    done = run_python(
        "import sys; sys.modules['ray'] = None\n"
        "import typevet_async as tv\n"
        "try:\n    tv.RayJudge\nexcept ImportError as error:\n    print(error)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'typevet_async[ray]'" in done.stdout


def test_rayjudge_is_public_lazily_and_outside_all() -> None:
    assert tv.RayJudge is RayJudge
    assert "RayJudge" not in tv.__all__
    assert "RayJudge" not in vars(tv)  # not cached: the public-surface test still holds
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = tv.Nothing


# -- the columns' types ----------------------------------------------------------------------


@pytest.mark.parametrize("question_id", list(QUESTIONS))
def test_a_cell_is_the_system_one_answer_itself(question_id: str) -> None:
    question = QUESTIONS[question_id]
    count = len(question.options())
    probabilities = [(n + 1) / (count * (count + 1) / 2) for n in range(count)]
    expected = answer_to_system_one(build_answer(question, probabilities))
    column = pa.array([expected, None], type=answer_type(question))
    first, second = column.to_pylist()
    assert first == expected
    assert list(first) == list(expected)  # the same keys in the same order
    assert second is None


def test_struct_types_follow_the_questions() -> None:
    assert answer_type(QUESTIONS["refund"]) == pa.struct(
        [("type", pa.string()), ("noul", pa.float64())]
    )
    route = answer_type(QUESTIONS["route"])
    assert route.field("probabilities").type.names == ["billing", "shipping", "technical"]
    urgency = answer_type(QUESTIONS["urgency"])
    assert urgency.field("legend").type.names == ["0", "1", "2"]
    assert urgency.names == [
        "type",
        "score",
        "confidence",
        "legend",
        "probabilities",
    ]


# -- the constructor --------------------------------------------------------------------------


def factory_for(url: str, **settings: Any) -> functools.partial[tv.Session]:
    """A session factory for the simulation, whose recorded bodies fit digit controls."""
    return functools.partial(tv.Session.llama_cpp, url, **RECORDED_SETTINGS, **settings)


def test_its_arguments_pickle_as_ray_ships_them() -> None:
    kwargs: dict[str, Any] = {
        "session_factory": factory_for("http://127.0.0.1:9", max_concurrency=3),
        "questions": QUESTIONS,
    }
    again = pickle.loads(pickle.dumps(kwargs))
    assert again["questions"] == QUESTIONS
    session = again["session_factory"]()
    assert isinstance(session, tv.Session)
    assert session.settings.max_concurrency == 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"questions": {"error": tv.Noul(instructions="?")}}, ValueError),
        ({"questions": {"state": tv.Noul(instructions="?")}}, ValueError),
        ({"questions": {"id": tv.Noul(instructions="?")}, "id_column": "id"}, ValueError),
        ({"questions": {"q": "not a question"}}, tv.QuestionError),
        ({"questions": {}}, tv.QuestionError),
        ({"questions": QUESTIONS, "session_factory": "http://x"}, TypeError),
    ],
)
def test_the_constructor_refuses(kwargs: dict[str, Any], error: type[Exception]) -> None:
    arguments: dict[str, Any] = {"session_factory": factory_for("http://127.0.0.1:9"), **kwargs}
    with pytest.raises(error):
        RayJudge(**arguments)


# -- batches, called as Ray calls them, against the simulation ----------------------------------


@pytest.fixture(scope="module")
def simulated() -> Iterator[ReplayServerProcess]:
    """The simulated llama.cpp server: 8 slots of 0.05 s, real recorded bodies."""
    with ReplayServerProcess(service_time=0.05, slots=8) as server:
        yield server


class ActorLoop:
    """An event loop in a thread of its own, fed from other threads: how a Ray actor runs an
    async UDF (``run_coroutine_threadsafe`` onto one loop, whichever thread hands the batch
    in)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def actor_loop() -> Iterator[ActorLoop]:
    loop = ActorLoop()
    yield loop
    loop.close()


@pytest.fixture
def make_judge(actor_loop: ActorLoop) -> Iterator[Callable[..., RayJudge]]:
    """Builds `RayJudge`s and closes their sessions on the actor loop, pass or fail."""
    made: list[RayJudge] = []

    def make(*args: Any, **kwargs: Any) -> RayJudge:
        made.append(RayJudge(*args, **kwargs))
        return made[-1]

    yield make
    for judge in made:
        actor_loop.run(judge.aclose())


def table(first: int, count: int) -> pa.Table:
    numbers = list(range(first, first + count))
    return pa.table({"id": numbers, "state": [f"ticket {n}: I was charged twice" for n in numbers]})


def test_batches_at_once_share_one_session_and_its_cap(
    simulated: ReplayServerProcess,
    actor_loop: ActorLoop,
    make_judge: Callable[..., RayJudge],
) -> None:
    judge = make_judge(factory_for(simulated.url, max_concurrency=3), QUESTIONS, id_column="id")
    simulated.reset()

    async def three_batches() -> list[pa.Table]:
        return list(await asyncio.gather(*(judge(table(12 * n, 12)) for n in range(3))))

    outputs = actor_loop.run(three_batches())
    stats = simulated.stats()
    assert stats["requests"]["/props"] == 1  # one session, probed once
    assert stats["simulation"]["served"] == 3 * 12 * 3  # 3 batches of 12 records, 3 questions
    assert stats["simulation"]["peak_slots_held"] == 3  # the session's cap, shared
    for n, output in enumerate(outputs):
        assert output.column_names == ["id", "state", "refund", "route", "urgency", ERROR_COLUMN]
        assert output.column("id").to_pylist() == list(range(12 * n, 12 * n + 12))  # row order
        assert output.column(ERROR_COLUMN).null_count == 12
        for cell in output.column("route").to_pylist():
            assert cell["type"] == "choice"
            assert math.isclose(sum(cell["probabilities"].values()), 1.0)


def test_a_bad_record_is_its_error_row_and_the_rest_are_answered(
    simulated: ReplayServerProcess,
    actor_loop: ActorLoop,
    make_judge: Callable[..., RayJudge],
) -> None:
    judge = make_judge(factory_for(simulated.url), QUESTIONS)
    states = np.array(
        ["a lone \ud800 surrogate", {"text": "fine", "n": 1}, {"n": math.nan}, None, "fine too"],
        dtype=object,
    )
    output = actor_loop.run(judge({"state": states}))  # Ray's default (numpy) batch format
    errors = output.column(ERROR_COLUMN).to_pylist()
    assert [error.split(":")[0] if error else None for error in errors] == [
        "InvalidInputError",
        None,
        "InvalidInputError",
        "InvalidInputError",
        None,
    ]
    assert "surrogate" in errors[0]
    assert "nan" in errors[2]
    assert "null" in errors[3]
    refund = output.column("refund").to_pylist()
    assert [cell is None for cell in refund] == [True, False, True, True, False]
    assert refund[1]["type"] == "noul"
    assert 0.0 <= refund[1]["noul"] <= 1.0


def test_a_batch_of_failures_keeps_the_schema(
    simulated: ReplayServerProcess,
    actor_loop: ActorLoop,
    make_judge: Callable[..., RayJudge],
) -> None:
    judge = make_judge(factory_for(simulated.url), QUESTIONS)
    good = actor_loop.run(judge(pa.table({"state": ["fine"]})))
    bad = actor_loop.run(judge(pa.table({"state": pa.array([None], type=pa.string())})))
    assert bad.schema == good.schema
    assert bad.column("urgency").null_count == 1


def test_a_pandas_batch_gives_the_same_columns(
    simulated: ReplayServerProcess,
    actor_loop: ActorLoop,
    make_judge: Callable[..., RayJudge],
) -> None:
    judge = make_judge(factory_for(simulated.url), QUESTIONS, state_column="text")
    frame = pd.DataFrame({"text": ["one", "two"], "score": [1.5, 2.5]})
    output = actor_loop.run(judge(frame))
    assert output.column_names == ["text", "score", "refund", "route", "urgency", ERROR_COLUMN]
    assert output.column("score").to_pylist() == [1.5, 2.5]
    assert output.column(ERROR_COLUMN).null_count == 2


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (pa.table({"text": ["x"]}), "no state column 'state'"),
        (pa.table({"state": ["x"], "route": ["taken"]}), "already has the output column"),
        (pa.table({"state": ["x"], "error": ["taken"]}), "already has the output column"),
    ],
)
def test_a_batch_that_cannot_be_judged_fails_the_task(
    simulated: ReplayServerProcess,
    actor_loop: ActorLoop,
    make_judge: Callable[..., RayJudge],
    batch: pa.Table,
    message: str,
) -> None:
    judge = make_judge(factory_for(simulated.url), QUESTIONS)
    with pytest.raises(ValueError, match=message):
        actor_loop.run(judge(batch))


def closed_port_url() -> str:
    """A URL whose port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_server_fails_the_batch_not_each_row(
    actor_loop: ActorLoop, make_judge: Callable[..., RayJudge]
) -> None:
    no_retries = tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))
    judge = make_judge(factory_for(closed_port_url(), http=no_retries), QUESTIONS)
    with pytest.raises(tv.TransportError):
        actor_loop.run(judge(table(0, 3)))


def test_deleting_it_closes_the_session_from_another_thread(
    simulated: ReplayServerProcess, actor_loop: ActorLoop
) -> None:
    """Ray Data deletes the instance when it shuts the actor down, from the actor's thread,
    while the loop runs in its own."""
    judge = RayJudge(factory_for(simulated.url), QUESTIONS)
    actor_loop.run(judge(table(0, 1)))
    session = judge._session
    assert session is not None
    assert "state='open'" in repr(session)
    del judge
    assert "state='closed'" in repr(session)
