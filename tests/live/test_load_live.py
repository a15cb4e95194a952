"""Load through ``judge_many``: 10,000 questions at concurrency 64 (5,000 short records, two
questions each), clean and with faults injected into 5% of the responses, over a REPLAYING
upstream (a stub, named as such).

The upstream is `benchmarks.client_cost.replay_server` run with ``--derive`` in a child process: a
llama.cpp server answering every read at once with a body recorded from the real server, its token
count and logprobs derived from the prompt the read carried (`derived_logprob`), so each record's
answer is its own and the same on every read of it. What this proves is the SDK's under load
(the pipeline, retries, typed errors, memory, leaks), not the model's: judge_many against the
real llama.cpp server is ``test_batch_live``, each fault against it ``test_faults_live``.

Clean: zero errors, every record exactly once and in order, one read per question, memory flat.
Faulted: every record ends answered (and the answer equals the clean run's exactly) or with a
typed error, and a record errs only where an unretryable fault hit it; none lost or repeated.

The figures go to ``~/.cache/typevet_async/test-logs/load.json``. ``TYPEVET_LOAD_RECORDS``
changes the size for development only.
"""

from __future__ import annotations

import array
import asyncio
import gc
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import typevet_async as tv
from benchmarks.client_cost.replay_server import RECORDED_SETTINGS, ReplayServerProcess

from .faults import BODY_FAULTS, FaultInjectingProxy, RandomFaults, open_fds
from .helpers import InFlightCounter

pytestmark = [pytest.mark.live, pytest.mark.asyncio, pytest.mark.timeout(900)]

#: 5,000 records: 10,000 questions a pass.
RECORDS = int(os.environ.get("TYPEVET_LOAD_RECORDS", "5000"))
CONCURRENCY = 64
FAULT_RATE = 0.05
QUESTIONS = {
    "billing": tv.Noul("Is this ticket about billing?"),
    "route": tv.Choice({"billing": None, "shipping": None, "account": None}, instructions="Team?"),
}
#: Retried by the SDK (then the answer must equal the clean one).
TRANSIENT = {"http_500", "http_503", "http_429", "reset_mid_body", "truncated_body"}
#: Never retried: the question ends with a typed ProtocolError.
MALFORMED = set(BODY_FAULTS)
FAULTS_BY_PATH = {"/completion": TRANSIENT | MALFORMED, "/apply-template": TRANSIENT}
#: Slack for the allocator and aiohttp's pools. A per-record leak of 2 KiB is 10 MiB in a
#: 5,000-record pass. Measured growth after warm-up (README "Load", 10,000-question run on
#: this 2-core machine, over the real server): +3.0 MiB clean, -0.7 MiB faulted.
FLAT_MEMORY_MIB = 8.0

SUBJECTS = ["charged twice", "parcel late", "password reset", "refund missing", "wrong size"]


def records(count: int = RECORDS) -> Iterator[tuple[int, str]]:
    """Short, distinct states, produced lazily (judge_many never materialises them); any 128
    records in a row differ in length (fixed-width fields, then ``n % 128`` dots), so their
    answers differ too."""
    for n in range(count):
        subject = SUBJECTS[n % len(SUBJECTS)]
        order = n * 7919 % 100_000
        yield n, f"Record {n}: {subject:<14}, order {order:05d}." + "." * (n % 128)


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class Run:
    """One pass over the records: outcomes in fixed-size arrays (so the bookkeeping does not
    itself grow memory) and figures."""

    def __init__(self, count: int) -> None:
        #: Per record: P(billing), then P(route = each label); NaN until answered.
        self.count = count
        self.answers = array.array("d", [float("nan")] * (count * 4))
        self.seen = array.array("i", [0] * count)
        #: Per failed record: the error's type and message, as a pipeline would log them.
        #: Not the exception object: a kept exception pins ~50 KB of RSS through allocator
        #: fragmentation (README, "Reliability"), which is the caller's choice, not the SDK's.
        self.errors: dict[int, tuple[type[tv.TypevetError], str]] = {}
        self.out_of_order = 0
        self.rss: list[tuple[int, float]] = []
        self.figures: dict[str, Any] = {}

    def keep(self, expected_index: int, item: tv.BatchItem) -> None:
        if item.index != expected_index or item.record_id != expected_index:
            self.out_of_order += 1
        self.seen[item.record_id] += 1
        if item.judgment is not None:
            base = item.record_id * 4
            self.answers[base] = item.judgment["billing"].noul
            for offset, p in enumerate(item.judgment["route"].probabilities.values(), 1):
                self.answers[base + offset] = p
        else:
            assert item.error is not None
            self.errors[item.record_id] = (type(item.error), str(item.error))

    def answer(self, record: int) -> list[float]:
        return list(self.answers[record * 4 : record * 4 + 4])


async def run_load(
    url: str, label: str, count: int = RECORDS, settings: dict[str, Any] = RECORDED_SETTINGS
) -> Run:
    """One pass of ``count`` records over ``url``, on a session of ``settings``: by default
    the recorded bodies' controls (digits), with which each question is read once over the
    replaying upstream (`benchmarks.scale.bench_load` passes none for the real server)."""
    run = Run(count)
    reads = InFlightCounter("/completion")
    gc.collect()
    rss_start = rss_mib()
    started = time.monotonic()

    def progress(state: tv.Progress) -> None:
        if state.done % (count // 20 or 1) == 0:
            run.rss.append((state.done, rss_mib()))

    async with tv.Session.llama_cpp(
        url,
        max_concurrency=CONCURRENCY,
        http=tv.HttpSettings(trace_configs=[reads.config]),
        **settings,
    ) as session:
        expected = 0
        async for item in session.judge_many(
            records(count), QUESTIONS, max_in_flight=CONCURRENCY, on_progress=progress
        ):
            run.keep(expected, item)
            expected += 1
    elapsed = time.monotonic() - started
    gc.collect()
    # Memory is judged from the point the pools and caches are warm (a tenth of the way in).
    warm = next(rss for done, rss in run.rss if done >= count // 10)
    run.figures = {
        "run": label,
        "records": count,
        "questions": count * len(QUESTIONS),
        "concurrency": CONCURRENCY,
        "seconds": round(elapsed, 1),
        "questions_per_second": round(count * len(QUESTIONS) / elapsed, 1),
        "answered": count - len(run.errors),
        "errors": len(run.errors),
        "lost": sum(count == 0 for count in run.seen),
        "duplicated": sum(count > 1 for count in run.seen),
        "out_of_order": run.out_of_order,
        "completion_requests": reads.started,
        "peak_reads_in_flight": reads.peak,
        "rss_mib_start": round(rss_start, 1),
        "rss_mib_warm": round(warm, 1),
        "rss_mib_end": round(rss_mib(), 1),
        "rss_mib_peak_sampled": round(max(rss for _, rss in run.rss), 1),
    }
    return run


class Leaks:
    """Tasks and file descriptors alive before a block, compared with after it."""

    def __enter__(self) -> Leaks:
        self.tasks, self.fds = len(asyncio.all_tasks()), open_fds()
        return self

    def __exit__(self, *exc: object) -> None:
        gc.collect()
        self.tasks_left = len(asyncio.all_tasks()) - self.tasks
        self.fds_left = open_fds() - self.fds


async def clean_pass(
    url: str, count: int = RECORDS, settings: dict[str, Any] = RECORDED_SETTINGS
) -> Run:
    """The clean pass over ``url``, with the tasks and descriptors it left."""
    with Leaks() as leaks:
        run = await run_load(url, "clean", count, settings)
    run.figures.update(tasks_left=leaks.tasks_left, fds_left=leaks.fds_left)
    return run


async def faulted_pass(
    url: str, count: int = RECORDS, settings: dict[str, Any] = RECORDED_SETTINGS
) -> tuple[Run, RandomFaults]:
    """The pass through the fault proxy (5% of the responses, seeded) in front of ``url``,
    with the tasks and descriptors it left, and the faults it met."""
    with Leaks() as leaks:
        async with FaultInjectingProxy(url) as proxy:
            proxy.random_faults = faults = RandomFaults(FAULT_RATE, FAULTS_BY_PATH, seed=20261130)
            run = await run_load(proxy.url, "faulted", count, settings)
    run.figures.update(tasks_left=leaks.tasks_left, fds_left=leaks.fds_left)
    return run, faults


def check_faulted(run: Run, clean: Run, faults: RandomFaults) -> None:
    """Asserts each record of the faulted pass: answered only if no unretryable fault hit it,
    else a typed error for what hit it; adds the figures, with the largest difference of an
    answer from the clean pass's."""
    unretryable = {record for record, hit in faults.by_record.items() if MALFORMED & set(hit)}
    largest_difference = 0.0
    for record in range(run.count):
        failed = run.errors.get(record)
        if failed is None:  # answered: never a wrong answer
            assert record not in unretryable, (record, faults.by_record[record])
            for got, clean_answer in zip(run.answer(record), clean.answer(record), strict=True):
                largest_difference = max(largest_difference, abs(got - clean_answer))
        elif record in unretryable:
            assert issubclass(failed[0], tv.ProtocolError), (record, failed)
        else:  # only when one request met more transient faults than its retries allow
            assert issubclass(failed[0], tv.ServerError | tv.TransportError), (record, failed)
            assert len(faults.by_record[record]) > 2, (record, failed, faults.by_record[record])

    injected = faults.injected
    run.figures.update(
        {
            "fault_rate": FAULT_RATE,
            "requests_through_proxy": dict(faults.requests),
            "faults_injected": sum(injected.values()),
            "faults_by_kind": dict(sorted(injected.items())),
            "records_hit": len(faults.by_record),
            "records_hit_unretryable": len(unretryable),
            "errors_after_exhausted_retries": len(set(run.errors) - unretryable),
            "errors_by_type": dict(Counter(kind.__name__ for kind, _ in run.errors.values())),
            "largest_probability_difference_vs_clean": largest_difference,
        }
    )


def save_figures(figures: dict[str, Any]) -> None:
    path = tv.cache_dir() / "test-logs" / "load.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[figures["run"]] = figures
    path.write_text(json.dumps(saved, indent=2) + "\n")
    print(json.dumps(figures))


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """The replaying upstream (module docstring), in a child process: its URL. Each read holds
    one of 64 slots for 20 ms, so that the reads a pass keeps in flight overlap there."""
    with ReplayServerProcess(derive=True, service_time=0.02, slots=CONCURRENCY) as server:
        yield server.url


@pytest.fixture(scope="module")
def clean_run(upstream: str) -> Run:
    """The clean pass, shared: the faulted pass compares its answers with these."""
    return asyncio.run(clean_pass(upstream))


async def test_load_clean(clean_run: Run) -> None:
    figures = clean_run.figures
    save_figures(figures)
    assert figures["errors"] == 0, list(clean_run.errors.items())[:5]
    assert figures["lost"] == figures["duplicated"] == figures["out_of_order"] == 0
    assert figures["completion_requests"] == RECORDS * len(QUESTIONS)
    assert figures["peak_reads_in_flight"] <= CONCURRENCY
    # Each record's answer is its own: no two records in a row were answered alike.
    same = [n for n in range(1, RECORDS) if clean_run.answer(n) == clean_run.answer(n - 1)]
    assert same == [], same[:5]
    assert figures["tasks_left"] == 0
    assert figures["fds_left"] <= 0
    growth = figures["rss_mib_end"] - figures["rss_mib_warm"]
    assert growth <= FLAT_MEMORY_MIB, f"RSS grew {growth:.1f} MiB after warm-up: {figures}"


async def test_load_with_faults_in_five_percent_of_responses(upstream: str, clean_run: Run) -> None:
    run, faults = await faulted_pass(upstream)
    figures = run.figures
    assert figures["lost"] == figures["duplicated"] == figures["out_of_order"] == 0
    assert figures["tasks_left"] == 0
    assert figures["fds_left"] <= 0
    check_faulted(run, clean_run, faults)  # each record answered or failed as its faults say
    save_figures(figures)
    assert sum(faults.requests.values()) > RECORDS * len(QUESTIONS)
    assert figures["faults_injected"] > 0
    # The clean run's answer, to the last bit: over the replaying upstream a read is the same
    # every time it is read (over the real server, batching moves the last digits).
    assert figures["largest_probability_difference_vs_clean"] == 0.0, figures
    growth = figures["rss_mib_end"] - figures["rss_mib_warm"]
    assert growth <= FLAT_MEMORY_MIB, f"RSS grew {growth:.1f} MiB after warm-up: {figures}"
