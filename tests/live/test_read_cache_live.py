"""The read cache against the real servers (llama.cpp serving Gemma 3 270M; vLLM for one
test): a second identical judgment reads nothing and answers the same, read for read; a
changed model pin, template framing, prompt or read size misses; 64 identical questions at
once send one read; rotations and a calibration map on cached reads answer as on fresh ones;
and a cached re-run of the whole shipped eval set sends no read and writes the same report.

Reads are counted where they leave the client, by aiohttp's own trace hooks on the session
(`helpers.InFlightCounter`), not by the SDK's usage.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

import typevet_async as tv
from typevet_async._core.statistics.calibration import QuestionMap, Temperature, question_hash
from typevet_async._core.statistics.content_free import CONTENT_FREE_STATES

from .faults import FaultInjectingProxy
from .helpers import LETTERED, TICKET, InFlightCounter, questions
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

REPOSITORY = Path(__file__).parent.parent.parent
SHIPPED = REPOSITORY / "examples" / "eval"
COMPLETION = "/completion"


def same_reads(first: tv.Judgment, second: tv.Judgment) -> None:
    """The same answers, and the same logprobs, top-K and prompt, read for read."""
    assert dict(second.answers) == dict(first.answers)
    for question_id, read in first.diagnostics.items():
        again = second.diagnostics[question_id]
        assert again.logprobs == read.logprobs
        assert again.candidates == read.candidates
        assert (again.top_k, again.prompt, again.off_menu_mass) == (
            read.top_k, read.prompt, read.off_menu_mass,
        )  # fmt: skip


def assert_all_hits(judgment: tv.Judgment, hits: int) -> None:
    """Every read answered by the read cache: `hits` of them (a question's read each, and
    the content-free prior reads the session did not already keep)."""
    assert judgment.usage == tv.Usage(cache_hits=hits)
    for diagnostics in judgment.diagnostics.values():
        assert diagnostics.cache == "hit"
        assert (diagnostics.reads, diagnostics.attempts) == (0, 0)


@asynccontextmanager
async def cache_of(kind: str, folder: Path) -> AsyncIterator[Callable[[], Any]]:
    """A factory of the same cache for each session: one memory store, or a new
    `SqliteReadCache` object on one file each time (so the second session reads the file)."""
    if kind == "memory":
        memory = tv.MemoryReadCache()
        yield lambda: memory
        return
    opened: list[tv.SqliteReadCache] = []

    def sqlite() -> tv.SqliteReadCache:
        opened.append(tv.SqliteReadCache(folder / "reads.db"))
        return opened[-1]

    try:
        yield sqlite
    finally:
        for cache in opened:
            await cache.aclose()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_second_identical_judgment_reads_nothing(
    gemma3_url: str, tmp_path: Path, kind: str
) -> None:
    judgments = []
    async with cache_of(kind, tmp_path) as new_cache:
        for _ in range(2):  # two sessions, one cache (for SQLite: the same file)
            cache = new_cache()
            if isinstance(cache, tv.SqliteReadCache):
                await cache.open()
            counter = InFlightCounter(COMPLETION)
            async with tv.Session.llama_cpp(
                gemma3_url,
                cache=cache,
                content_free="scores",
                http=tv.HttpSettings(trace_configs=[counter.config]),
            ) as session:
                judgments.append((await session.judge(TICKET, questions()), counter.started))
    (first, sent), (second, sent_again) = judgments
    assert sent == first.usage.reads >= 3
    assert all(d.cache == "miss" for d in first.diagnostics.values())
    assert first.usage.cache_hits == 0
    assert sent_again == 0
    # A new session keeps no prior: the Score's three prior reads come from the cache too (a
    # read and its escalations are one entry, so hits count questions and prior states).
    assert_all_hits(second, hits=len(second) + len(CONTENT_FREE_STATES))
    same_reads(first, second)


async def test_a_changed_model_pin_template_prompt_or_read_size_misses(gemma3_url: str) -> None:
    cache, counter = tv.MemoryReadCache(), InFlightCounter(COMPLETION)
    ask = {"refund": questions()["refund"]}

    async def reads_of(state: str = TICKET, **settings: Any) -> int:
        before = counter.started
        async with tv.Session.llama_cpp(
            gemma3_url,
            cache=cache,
            http=tv.HttpSettings(trace_configs=[counter.config]),
            **{**LETTERED, **settings},
        ) as session:
            judgment = await session.judge(state, ask)
        assert counter.started - before == judgment.usage.reads
        return judgment.usage.cache_hits

    assert await reads_of() == 0  # stored
    assert await reads_of() == 1  # the same: a hit
    async with tv.Session.llama_cpp(gemma3_url) as session:
        served = (await session.probe()).model_ids
    for changed in (
        {"model": served[0]},  # a model pin
        {"layout": "fused"},  # another framing, rendered by the server's template
        {"controls": "digits"},  # another field block and candidates
        {"top_k": 256},  # another read size
        {"reproducible": True},  # no prompt cache
        {"state": TICKET + " Please hurry."},  # another prompt
    ):
        assert await reads_of(**changed) == 0, changed  # missed: read and stored
        assert await reads_of(**changed) == 1, changed  # and then a hit
    assert await cache.entries() == 7


async def test_64_identical_questions_at_once_send_one_read(gemma3_url: str) -> None:
    counter = InFlightCounter(COMPLETION)
    ask = {"refund": questions()["refund"]}
    async with tv.Session.llama_cpp(
        gemma3_url,
        cache=tv.MemoryReadCache(),
        http=tv.HttpSettings(trace_configs=[counter.config]),
        **LETTERED,
    ) as session:
        judgments = await asyncio.gather(*(session.judge(TICKET, ask) for _ in range(64)))
    assert counter.started == 1
    leaders = [j for j in judgments if j.diagnostics["refund"].cache == "miss"]
    assert len(leaders) == 1
    assert leaders[0].usage.reads == 1
    assert sum(j.usage.cache_hits for j in judgments) == 63
    assert len({j["refund"].probabilities["true"] for j in judgments}) == 1
    assert len({j.diagnostics["refund"].logprobs for j in judgments}) == 1


async def test_a_judgment_that_may_retry_never_takes_the_503_of_one_that_may_not(
    gemma3_url: str,
) -> None:
    ask = {"refund": questions()["refund"]}
    async with (
        FaultInjectingProxy(gemma3_url) as proxy,
        tv.Session.llama_cpp(proxy.url, cache=tv.MemoryReadCache(), **LETTERED) as session,
    ):
        await session.probe()
        before = len(proxy.seen)
        proxy.script = ["held_503"]  # the first read: in flight until released, then a 503
        impatient = asyncio.create_task(session.judge(TICKET, ask, max_retries=0))
        await proxy.holding.wait()
        patient = asyncio.create_task(session.judge(TICKET, ask, max_retries=3))
        await asyncio.sleep(0.3)  # the identical judgment is under way beside the first
        proxy.release.set()
        with pytest.raises(tv.ServerError) as refused:
            await impatient
        judged = await patient  # its own read (it shared the first one's flight: its 503)
    assert refused.value.status == 503
    assert judged.diagnostics["refund"].cache == "miss"
    reads = [seen for path, seen in zip(proxy.paths, proxy.seen, strict=True) if path == COMPLETION]
    assert reads[-2:] == ["held_503", "pass"]
    assert len(proxy.seen) - before == 2


async def test_rotations_and_a_calibration_map_on_cached_reads_answer_as_on_fresh_ones(
    gemma3_url: str,
) -> None:
    # Reproducible mode: independent reads of one prompt are bit-identical, so the session
    # without a cache is the reference for the cached one, number for number.
    ask = {"route": questions()["route"]}
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        plan = await session.read_plan(ask, permutations=3)
        route = QuestionMap(
            question_hash(ask["route"]), plan.readings["route"], Temperature(2.0), "question"
        )
        calibration = tv.CalibrationMap(plan.pins, {"route": route})
        fresh = await session.judge(TICKET, ask, permutations=3, calibration=calibration)
    counter = InFlightCounter(COMPLETION)
    async with tv.Session.llama_cpp(
        gemma3_url,
        reproducible=True,
        cache=tv.MemoryReadCache(),
        http=tv.HttpSettings(trace_configs=[counter.config]),
    ) as session:
        plain = await session.judge(TICKET, ask)  # stores the unrotated read alone
        assert counter.started == plain.usage.reads
        first = await session.judge(TICKET, ask, permutations=3, calibration=calibration)
        sent = counter.started
        again = await session.judge(TICKET, ask, permutations=3, calibration=calibration)
    assert first.usage.cache_hits == 1  # the unrotated read came from the cache
    assert first.diagnostics["route"].cache == "miss"  # the other two rotations did not
    assert counter.started == sent  # and then every rotation did
    assert again.usage == tv.Usage(cache_hits=3)
    assert again.diagnostics["route"].cache == "hit"
    for judgment in (first, again):
        assert dict(judgment.answers) == dict(fresh.answers)
        got, want = judgment.diagnostics["route"], fresh.diagnostics["route"]
        assert got.raw_probabilities == want.raw_probabilities
        assert got.rotations == want.rotations
        assert got.calibration == want.calibration
    assert plain.diagnostics["route"].logprobs == fresh.diagnostics["route"].logprobs


async def test_vllm_a_second_identical_judgment_reads_nothing(vllm_url: str) -> None:
    cache, counter = tv.MemoryReadCache(), InFlightCounter("/v1/chat/completions")
    async with tv.Session.vllm(
        vllm_url,
        model=VLLM_MODEL_ID,
        cache=cache,
        http=tv.HttpSettings(trace_configs=[counter.config]),
    ) as session:
        first = await session.judge(TICKET, questions())
        sent = counter.started
        second = await session.judge(TICKET, questions())
    assert sent == first.usage.reads == 3
    assert counter.started == sent
    assert_all_hits(second, hits=len(second))
    same_reads(first, second)


# A script whose judgment's reads go to a cache it opened and never closes: it raises first.
_RAISES_BEFORE_ACLOSE = """
import asyncio, sys
import typevet_async as tv

async def main(url, path):
    cache = tv.SqliteReadCache(path)
    await cache.open()
    async with tv.Session.llama_cpp(url, cache=cache) as session:
        judgment = await session.judge(sys.argv[3], {"refund": tv.Noul(instructions="Refund?")})
    assert judgment.diagnostics["refund"].cache == "miss"
    raise RuntimeError("between open and aclose")

asyncio.run(main(*sys.argv[1:3]))
"""


async def test_a_script_that_raises_before_aclose_exits_with_its_reads_kept(
    gemma3_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "reads.db"
    # Unbounded before (aiosqlite's threads held the process): a bound far past a judgment's,
    # within the test's own timeout so that a hang fails as the child's.
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _RAISES_BEFORE_ACLOSE, gemma3_url, str(path), TICKET],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=REPOSITORY,
    )
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: between open and aclose" in done.stderr
    # Its stores were never flushed: the loop's end wrote them, so this reads nothing.
    counter = InFlightCounter(COMPLETION)
    async with (
        tv.SqliteReadCache(path) as cache,
        tv.Session.llama_cpp(
            gemma3_url, cache=cache, http=tv.HttpSettings(trace_configs=[counter.config])
        ) as session,
    ):
        again = await session.judge(TICKET, {"refund": tv.Noul(instructions="Refund?")})
    assert counter.started == 0
    assert_all_hits(again, hits=1)


def eval_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typevet_async._apps.cli", "eval", *args, "--base-url", url],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


@pytest.mark.timeout(1500)  # 900 reads through the real server, then two cached re-runs
async def test_a_cached_rerun_of_the_shipped_eval_set_sends_no_read(
    gemma3_url: str, tmp_path: Path
) -> None:
    database, tickets = tmp_path / "reads.db", SHIPPED / "tickets.jsonl"
    shipped_questions = SHIPPED / "questions.json"

    def run(out: str) -> tuple[dict[str, Any], str]:
        done = eval_cli(str(tickets), "--questions", str(shipped_questions), "--out",
                        str(tmp_path / out), "--cache", str(database), "--resamples", "200",
                        "--no-progress", url=gemma3_url)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads((tmp_path / out / "report.json").read_text()), done.stdout

    report, printed = run("first")
    assert report["facts"]["records"] == 300
    assert report["facts"]["failed records"] == 0
    assert "reads sent: 0" not in printed
    assert f"answered by the read cache {database}: 0" in printed

    # The same set through tv.evaluate, its reads counted on the wire: none.
    counter = InFlightCounter(COMPLETION)
    async with tv.SqliteReadCache(database) as cache:
        assert await cache.entries() == 900  # 300 tickets x 3 questions
        async with tv.Session.llama_cpp(
            gemma3_url, cache=cache, http=tv.HttpSettings(trace_configs=[counter.config])
        ) as session:
            records = [json.loads(line) for line in tickets.read_text().splitlines()]
            shipped = tv.questions_from_json(json.loads(shipped_questions.read_text()))
            evaluation = await tv.evaluate(session, records, shipped)
    assert counter.started == 0
    assert evaluation.usage == tv.Usage(cache_hits=900)
    assert orjson.loads(orjson.dumps(evaluation.report(resamples=200))) == report

    again, printed = run("again")
    assert again == report
    assert f"reads sent: 0; answered by the read cache {database}: 900" in printed
