"""The SDK client's own cost per question, against a server that replays real llama.cpp bodies.

The replay server (`benchmarks.client_cost.replay_server`, in a CHILD process so its CPU is not
counted) answers the probe and every ``POST /completion`` at once with bodies recorded from the real
server: the recorded read of exactly the ``n_probs`` the request asks for, real ``token`` and
``bytes`` fields in every entry, the candidates' real ids among them.

Side by side in one run, each pass in a fresh client process, rounds with the passes' order
rotated:

- ``sdk``: ``session.judge_many(tickets, {"refund": Noul}, max_in_flight=c)`` on
  ``tv.Session.llama_cpp(url, max_concurrency=c)`` (default settings otherwise), after the
  probe and a warm-up batch;
- ``judge``: at concurrency 1 only, a loop of ``await session.judge(ticket, questions)`` (the
  one-question judgment path);
- ``pipeline``: at concurrency 64 and the default read only, ``sdk`` with
  ``time_slice=None``: a batch pipeline's session, whose reads never yield to the loop (what
  the time slices that hold the event-loop lag target cost);
- ``floor``: a minimal aiohttp loop (``c`` workers on one ``ClientSession``) that posts the
  very ``/completion`` body the SDK sent (captured by the replay server from an SDK run, the
  ticket swapped per question and serialised with orjson) and reads the reply's bytes, no
  parse: the least any client pays for the same exchange;
- ``floor64k``: at the default read, the floor reading its sockets 64 KiB at a time, as the
  SDK does (``SOCKET_READ_SIZE``; asyncio's transport asks for 256 KiB, which glibc maps and
  unmaps for every read): the overhead like for like.

Two reads: ``default`` (whatever ``tv.Session.llama_cpp`` asks for by default: the K is
measured from the ``n_probs`` of the requests the server received) and ``top4096`` (the old
default, ``top_k=4096``: a 370 KB body). Client CPU per question is the client process's CPU
time (``time.process_time``, every thread) over the timed questions divided by their number;
the overhead is the SDK's minus the floor's. Cells are medians over rounds (min-max).

``--profile`` adds, after the rounds, one cProfile'd SDK pass per concurrency (own CPU time
per package, process clock; the profiler roughly doubles the cost, so read shares);
``--profile-only`` runs just cProfile'd SDK and floor passes side by side
(``bench_client_cost.profile.json``).

    python -m benchmarks.client_cost.bench_client_cost [--rounds 5] [--questions 4000]
        [--questions-c1 1500] [--questions-4096 600] [--reads default top4096]
        [--profile | --profile-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import pstats
import statistics
import tempfile
import time
from asyncio import selector_events
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import typevet_async as tv
from benchmarks._shared import (
    fmt,
    markdown_table,
    run_json_subprocess,
    spread,
    ticket_stream,
    write_results,
)
from benchmarks.client_cost.replay_server import (
    QUESTIONS,
    RECORDED_SETTINGS,
    ReplayServerProcess,
    capture_sdk_body,
    floor_loop,
)
from typevet_async._backends.http import SOCKET_READ_SIZE

NAME = "bench_client_cost"
WARM_UP = 300
CONCURRENCIES = (1, 64)
READS: dict[str, int | None] = {"default": None, "top4096": 4096}  # top_k
TARGET_CPU_US = 600.0
TARGET_OVERHEAD_US = {64: 150.0, 1: 250.0}


# -- client passes (each in its own process) -----------------------------------------------


def _session(url: str, read: str, concurrency: int, mode: str = "sdk") -> tv.Session:
    # A pipeline's loop runs nothing but the batch: its reads need not yield (`time_slice`).
    extra: dict[str, Any] = {"time_slice": None} if mode == "pipeline" else {}
    return tv.Session.llama_cpp(
        url, max_concurrency=concurrency, top_k=READS[read], **RECORDED_SETTINGS, **extra
    )


def profile_by_package(profiler: cProfile.Profile, count: int) -> dict[str, float]:
    """Own CPU time (tottime, process clock) per package, in µs per question (inflated by the
    profiler itself: read it as shares)."""
    shares: dict[str, float] = {}
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (path, _line, function), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        if "/typevet_async/" in path:
            package = "typevet_async/" + path.rsplit("/typevet_async/", 1)[1]
        elif "site-packages/" in path:
            package = path.rsplit("site-packages/", 1)[1].split("/", 1)[0]
        elif path == "~":
            package = f"builtin {function}"[:70]
        elif "/asyncio/" in path:
            package = "asyncio"
        else:
            package = "other: " + Path(path).name
        shares[package] = shares.get(package, 0.0) + tottime / count * 1e6
    return dict(sorted(shares.items(), key=lambda item: -item[1])[:25])


@contextlib.contextmanager
def measured(profile: bool) -> Iterator[dict[str, Any]]:
    """Times the block (process CPU and wall clock, after a collection), cProfile'd if asked;
    fills ``cpu``, ``wall`` and ``profiler`` when it ends."""
    gc.collect()
    profiler = cProfile.Profile(time.process_time) if profile else None
    figures: dict[str, Any] = {"profiler": profiler}
    if profiler is not None:
        profiler.enable()
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    try:
        yield figures
    finally:
        figures["cpu"] = time.process_time() - cpu_started
        figures["wall"] = time.perf_counter() - wall_started
        if profiler is not None:
            profiler.disable()


def _profile_figures(profiler: cProfile.Profile | None, count: int) -> dict[str, Any]:
    return {"profile_us_per_question": profile_by_package(profiler, count)} if profiler else {}


async def sdk_pass(
    url: str, read: str, concurrency: int, count: int, mode: str, profile: bool = False
) -> dict[str, Any]:
    failed = reads = 0
    first_error = ""
    top_ks: dict[int, int] = {}
    async with _session(url, read, concurrency, mode) as session:
        await session.probe()
        async for item in session.judge_many(
            ticket_stream(WARM_UP, start=2 * 10**9), QUESTIONS, max_in_flight=concurrency
        ):
            if item.judgment is None:
                raise RuntimeError(f"warm-up record {item.index} failed: {item.error!r}")
        with measured(profile) as figures:
            if mode == "judge":
                for state in ticket_stream(count):
                    judgment = await session.judge(state, QUESTIONS)
                    diagnostics = judgment.diagnostics["refund"]
                    reads += diagnostics.reads
                    top_ks[diagnostics.top_k] = top_ks.get(diagnostics.top_k, 0) + 1
            else:
                async for item in session.judge_many(
                    ticket_stream(count), QUESTIONS, max_in_flight=concurrency
                ):
                    if item.judgment is None or not isinstance(
                        item.judgment["refund"], tv.NoulAnswer
                    ):
                        failed += 1
                        first_error = first_error or repr(item.error)
                        continue
                    diagnostics = item.judgment.diagnostics["refund"]
                    reads += diagnostics.reads
                    top_ks[diagnostics.top_k] = top_ks.get(diagnostics.top_k, 0) + 1
    cpu, wall = figures["cpu"], figures["wall"]
    return {
        **_profile_figures(figures["profiler"], count),
        "questions": count,
        "failed": failed,
        "first_error": first_error,
        "reads_per_question": reads / max(count - failed, 1),
        "top_k_used": top_ks,
        "cpu_us_per_question": cpu / count * 1e6,
        "wall_s": wall,
        "questions_per_s": count / wall,
    }


async def floor_pass(
    url: str, template: dict[str, Any], concurrency: int, count: int, profile: bool = False
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        run = floor_loop(http, url, template, concurrency)
        await run(WARM_UP, 2 * 10**9)
        with measured(profile) as figures:
            received = await run(count, 0)
    cpu, wall = figures["cpu"], figures["wall"]
    return {
        **_profile_figures(figures["profiler"], count),
        "questions": count,
        "failed": 0,
        "body_bytes": received / count,
        "cpu_us_per_question": cpu / count * 1e6,
        "wall_s": wall,
        "questions_per_s": count / wall,
    }


# -- the orchestrating process ------------------------------------------------------------


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def run(args: argparse.Namespace) -> None:
    passes: list[tuple[str, str, int]] = []  # (client, read, concurrency)
    for read in args.reads:
        for concurrency in CONCURRENCIES:
            passes += [("sdk", read, concurrency), ("floor", read, concurrency)]
            if concurrency == 1 and read == "default":
                passes.append(("judge", read, concurrency))
            if concurrency > 1 and read == "default":
                passes.append(("pipeline", read, concurrency))
            if read == "default":
                passes.append(("floor64k", read, concurrency))
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = {p: [] for p in passes}
    captured: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    with ReplayServerProcess() as server, tempfile.TemporaryDirectory() as scratch:
        for read in args.reads:
            before = server.stats()["n_probs"]
            asyncio.run(capture_sdk_body(_session(server.url, read, 1)))
            raw = server.last_completion()
            path = Path(scratch) / f"{read}.json"
            path.write_bytes(raw)
            body = orjson.loads(raw)
            captured[read] = {
                "file": str(path),
                "n_probs": body["n_probs"],
                "request_fields": sorted(body),
                "response_fields": body.get("response_fields"),
                "n_probs_seen": _delta(before, server.stats()["n_probs"]),
            }
        for round_index in range(args.rounds):
            shift = round_index % len(passes)
            for client, read, concurrency in passes[shift:] + passes[:shift]:
                count = _count(args, read, concurrency)
                command = [
                    "benchmarks.client_cost.bench_client_cost", "--pass", client, "--read", read,
                    "--concurrency", str(concurrency), "--questions", str(count),
                    "--url", server.url, "--body-file", captured[read]["file"],
                ]  # fmt: skip
                before = server.stats()
                result = run_json_subprocess(command)
                after = server.stats()
                result["n_probs_seen"] = _delta(before["n_probs"], after["n_probs"])
                result["unanswered"] = after["requests"].get("unanswered", 0) - before[
                    "requests"
                ].get("unanswered", 0)
                results[client, read, concurrency].append(result)
                print(
                    f"round {round_index + 1} {client:8} {read:8} c={concurrency:<3} "
                    f"{result['cpu_us_per_question']:8.0f} us/q "
                    f"{result['questions_per_s']:7.0f} q/s n_probs {result['n_probs_seen']}",
                    flush=True,
                )
        profiles: dict[str, Any] = {}
        if args.profile and "default" in args.reads:
            for concurrency in CONCURRENCIES:
                command = [
                    "benchmarks.client_cost.bench_client_cost", "--pass", "sdk",
                    "--read", "default",
                    "--concurrency", str(concurrency), "--questions",
                    str(_count(args, "default", concurrency)), "--url", server.url, "--profile",
                ]  # fmt: skip
                profiles[f"c{concurrency}"] = run_json_subprocess(command)
        stats = server.stats()
    elapsed = time.perf_counter() - started
    report(args, passes, results, captured, stats, elapsed, profiles)


def profile_only(args: argparse.Namespace) -> None:
    """The SDK's and the floor's own CPU per package, side by side (process clock)."""
    profiles: dict[str, Any] = {}
    with ReplayServerProcess() as server, tempfile.TemporaryDirectory() as scratch:
        asyncio.run(capture_sdk_body(_session(server.url, "default", 1)))
        body_file = Path(scratch) / "default.json"
        body_file.write_bytes(server.last_completion())
        for concurrency in CONCURRENCIES:
            for client in ("sdk", "floor"):
                command = [
                    "benchmarks.client_cost.bench_client_cost", "--pass", client,
                    "--read", "default",
                    "--concurrency", str(concurrency), "--questions",
                    str(_count(args, "default", concurrency)), "--url", server.url,
                    "--body-file", str(body_file), "--profile",
                ]  # fmt: skip
                profiles[f"{client}/c{concurrency}"] = run_json_subprocess(command)
    lines = []
    for concurrency in CONCURRENCIES:
        sdk = profiles[f"sdk/c{concurrency}"]
        floor = profiles[f"floor/c{concurrency}"]
        packages = list(
            dict.fromkeys([*sdk["profile_us_per_question"], *floor["profile_us_per_question"]])
        )
        rows = [
            [
                package,
                f"{sdk['profile_us_per_question'].get(package, 0.0):,.1f}",
                f"{floor['profile_us_per_question'].get(package, 0.0):,.1f}",
            ]
            for package in packages[:25]
        ]
        lines.append(
            f"c={concurrency}: under the profiler the SDK took {sdk['cpu_us_per_question']:,.0f} "
            f"µs/q and the floor {floor['cpu_us_per_question']:,.0f}; own CPU per package, "
            "µs per question:\n\n" + markdown_table(["package", "SDK", "floor"], rows)
        )
    path = write_results(f"{NAME}.profile", {"profiles": profiles, "tables": lines})
    print("\n\n".join(lines))
    print(f"(figures in {path})")


def _count(args: argparse.Namespace, read: str, concurrency: int) -> int:
    if read == "top4096":
        return int(args.questions_4096 if concurrency > 1 else max(args.questions_4096 // 2, 1))
    return int(args.questions if concurrency > 1 else args.questions_c1)


def _met(value: float, target: float) -> str:
    return "met" if value <= target else "MISSED"


def _overhead(
    label: str,
    concurrency: int,
    call: str,
    runs: list[dict[str, Any]],
    floor: list[dict[str, Any]],
) -> tuple[float, dict[str, Any], list[str]]:
    """A pass's overhead over the floor (difference of medians), its cell and its table row."""
    cpu = [r["cpu_us_per_question"] for r in runs]
    floor_cpu = [r["cpu_us_per_question"] for r in floor]
    paired = [a - b for a, b in zip(cpu, floor_cpu, strict=True)]
    overhead = statistics.median(cpu) - statistics.median(floor_cpu)
    cell = {"difference_of_medians_us": overhead, "paired_by_round_us": spread(paired)}
    row = [
        label,
        str(concurrency),
        call,
        fmt(spread(cpu)),
        fmt(spread(floor_cpu)),
        f"**{overhead:,.0f}** ({min(paired):,.0f}-{max(paired):,.0f})",
        fmt(spread([r["questions_per_s"] for r in runs])),
        fmt(spread([r["questions_per_s"] for r in floor])),
    ]
    return overhead, cell, row


def report(
    args: argparse.Namespace,
    passes: list[tuple[str, str, int]],
    results: dict[tuple[str, str, int], list[dict[str, Any]]],
    captured: dict[str, dict[str, Any]],
    stats: dict[str, Any],
    elapsed: float,
    profiles: dict[str, Any],
) -> None:
    cells: dict[str, Any] = {}
    for client, read, concurrency in passes:
        runs = results[client, read, concurrency]
        cells[f"{client}/{read}/c{concurrency}"] = {
            "cpu_us_per_question": spread([r["cpu_us_per_question"] for r in runs]),
            "questions_per_s": spread([r["questions_per_s"] for r in runs]),
            "failed": sum(r["failed"] for r in runs),
            "unanswered": sum(r.get("unanswered", 0) for r in runs),
            "questions": runs[0]["questions"],
            "runs": runs,
        }
    rows = []
    verdicts = []
    for read in args.reads:
        floor_bytes = results["floor", read, CONCURRENCIES[-1]][0]["body_bytes"]
        label = f"{read} (K={captured[read]['n_probs']}, {floor_bytes / 1000:,.1f} KB)"
        for concurrency in CONCURRENCIES:
            floor = results["floor", read, concurrency]
            overhead, cells[f"overhead/{read}/c{concurrency}"], row = _overhead(
                label, concurrency, "`judge_many`", results["sdk", read, concurrency], floor
            )
            rows.append(row)
            if read == "default":
                cpu = statistics.median(
                    r["cpu_us_per_question"] for r in results["sdk", read, concurrency]
                )
                target = TARGET_OVERHEAD_US[concurrency]
                verdicts.append(
                    f"- c={concurrency}: client CPU {cpu:,.0f} µs/question (target <= "
                    f"{TARGET_CPU_US:,.0f}): {_met(cpu, TARGET_CPU_US)}; "
                    f"overhead {overhead:,.0f} µs over the floor (target <= {target:,.0f}): "
                    f"{_met(overhead, target)}"
                )
            if ("pipeline", read, concurrency) in results:
                pipeline = results["pipeline", read, concurrency]
                overhead, cells[f"overhead-pipeline/{read}/c{concurrency}"], row = _overhead(
                    label, concurrency, "`judge_many`, `time_slice=None`", pipeline, floor
                )
                rows.append(row)
                target = TARGET_OVERHEAD_US[concurrency]
                verdicts.append(
                    f"  - with `time_slice=None` (no slices: the lag target does not hold): "
                    f"overhead {overhead:,.0f} µs (target <= {target:,.0f}): "
                    f"{_met(overhead, target)}"
                )
            if ("floor64k", read, concurrency) in results:
                overhead, cells[f"overhead-floor64k/{read}/c{concurrency}"], row = _overhead(
                    label,
                    concurrency,
                    "`judge_many` over the floor reading 64 KiB",
                    results["sdk", read, concurrency],
                    results["floor64k", read, concurrency],
                )
                rows.append(row)
                verdicts.append(
                    f"  - like for like, over the floor reading 64 KiB a call as the SDK does: "
                    f"{overhead:,.0f} µs"
                )
            if concurrency == 1 and ("judge", read, 1) in results:
                judge = results["judge", read, 1]
                _, cells[f"overhead-judge/{read}/c1"], row = _overhead(
                    label, 1, "`judge` loop", judge, floor
                )
                rows.append(row)
    header = [
        "read", "c", "SDK call", "SDK CPU µs/q", "floor CPU µs/q", "overhead µs/q",
        "SDK q/s", "floor q/s",
    ]  # fmt: skip
    table = markdown_table(header, rows)
    failures = {k: v["failed"] + v["unanswered"] for k, v in cells.items() if "failed" in v}
    path = write_results(
        NAME,
        {
            "settings": {
                "rounds": args.rounds,
                "questions": args.questions,
                "questions_c1": args.questions_c1,
                "questions_4096": args.questions_4096,
                "warm_up": WARM_UP,
                "questions_per_record": 1,
            },
            "captured_requests": {
                k: {kk: vv for kk, vv in v.items() if kk != "file"} for k, v in captured.items()
            },
            "replay_server": stats,
            "cells": cells,
            "elapsed_s": elapsed,
            "table": table,
            "verdicts": verdicts,
            "profiles": profiles,
        },
    )
    print()
    print(
        f"Replay server (real recorded llama.cpp bodies) in a child process; one Noul per "
        f"ticket; {args.rounds} rounds, passes rotated, each pass a fresh client process; "
        f"median (min-max); {elapsed:.0f} s in all"
    )
    for read, c in captured.items():
        print(
            f"- {read}: the SDK asked for n_probs {c['n_probs']}; request fields "
            f"{c['request_fields']}; response_fields {c['response_fields']}"
        )
    print()
    print(table)
    print()
    print("\n".join(verdicts))
    for name, profiled in profiles.items():
        print(
            f"\nProfiled SDK pass, default read, {name} ({profiled['cpu_us_per_question']:,.0f} "
            "µs/q under the profiler); own time per package, µs per question:"
        )
        for package, micros in list(profiled["profile_us_per_question"].items())[:15]:
            print(f"  {micros:8.1f}  {package}")
    bad = {k: v for k, v in failures.items() if v}
    if bad:
        print(f"FAILED or unanswered questions: {bad}")
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--questions", type=int, default=4000, help="per pass at c=64")
    parser.add_argument("--questions-c1", type=int, default=1500, help="per pass at c=1")
    parser.add_argument(
        "--questions-4096", type=int, default=600, help="per top-4,096 pass at c=64 (half at c=1)"
    )
    parser.add_argument("--reads", nargs="+", choices=list(READS), default=list(READS))
    parser.add_argument(
        "--pass", dest="client", choices=["sdk", "judge", "pipeline", "floor", "floor64k"]
    )
    parser.add_argument("--read", choices=list(READS))
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--url")
    parser.add_argument("--body-file", type=Path)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the rounds, one cProfile'd SDK pass per concurrency at the default read",
    )
    parser.add_argument(
        "--profile-only",
        action="store_true",
        help="only cProfile'd SDK and floor passes at the default read (no rounds); figures to "
        "bench_client_cost.profile.json",
    )
    args = parser.parse_args()
    if args.profile_only:
        profile_only(args)
        return
    if args.client is None:
        run(args)
        return
    if args.client in ("floor", "floor64k"):
        if args.client == "floor64k":  # this process only: it runs nothing but the floor
            selector_events._SelectorSocketTransport.max_size = SOCKET_READ_SIZE
        template = orjson.loads(args.body_file.read_bytes())
        result = asyncio.run(
            floor_pass(args.url, template, args.concurrency, args.questions, args.profile)
        )
    else:
        result = asyncio.run(
            sdk_pass(
                args.url, args.read, args.concurrency, args.questions, args.client, args.profile
            )
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
