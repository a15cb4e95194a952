"""Where the client's instructions go: a deterministic budget per question, layer by layer.

CPU time on this 2-core VM moves by tens of percent between runs, so a change worth 10 µs
cannot be seen in `bench_client_cost`. Instructions executed can: each layer below runs in a
fresh client process under valgrind's callgrind (``--instr-atstart=no``), which counts the
instructions of the timed questions only (switched on and off around them with
``callgrind_control``); repeated runs agree within about 1%. The server is the replay server
(`benchmarks.client_cost.replay_server`, real recorded llama.cpp bodies, in a child process that
valgrind does not trace), and every layer sends the same top-64 ``/completion`` bodies.

The layers are cumulative, each adding one stage of the SDK's path to the one above it:

- ``floor``: the minimal aiohttp loop of `bench_client_cost` (post the body, read the bytes);
- ``http``: the SDK's HTTP client posting that body (its slots, time slices, retries);
- ``decode``: plus the strict reply decoder and the entry checks;
- ``read``: the backend's read of a request the SDK plans (prompt, body, candidates);
- ``interpret``: plus the answer and diagnostics built from the read;
- ``read_judgment``: the judgment of the planned request (usage, judgment record);
- ``judge``: ``session.judge`` (checks, the planner's marker verdicts, deadline);
- ``judge_many``: ``session.judge_many`` (the batch engine, ordered items).

It reaches into the session's internals (``_backend``, ``_ready_planner``, ``_slots``) to
run a stage alone: a measuring tool, not an example. Instructions are not time: the
interpreter's work retires fewer instructions per cycle than msgspec's decoding loop, so read
the differences between layers, not a conversion to µs. Under valgrind the client runs about
50 times slower, so the time slice (the session's ``time_slice``, 1 ms by default) is scaled by
``--slice-scale`` (default 50) to keep the number of parks per question as it is natively.

    python -m benchmarks.client_cost.measure_instructions [--questions 600] [--concurrency 64]
        [--layers floor judge_many]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import typevet_async as tv
from benchmarks._shared import markdown_table, ticket, write_results
from benchmarks.client_cost.replay_server import (
    PRIME_TICKET,
    QUESTIONS,
    RECORDED_SETTINGS,
    ReplayServerProcess,
    capture_sdk_body,
    floor_loop,
)

NAME = "measure_instructions"
LAYERS = (
    "floor",
    "http",
    "decode",
    "read",
    "interpret",
    "read_judgment",
    "judge",
    "judge_many",
)
WARM_UP = 200
ROOT = Path(__file__).resolve().parents[2]


# -- the client process (under valgrind) ----------------------------------------------------


def _instrument(on: bool) -> None:
    """Switch callgrind's counting on or off for this process (off also dumps the counts)."""
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", pid], capture_output=True)
    if not on:
        subprocess.run(["callgrind_control", "-d", pid], capture_output=True)


async def _workers(concurrency: int, count: int, one: Callable[[int], Awaitable[None]]) -> None:
    numbers = iter(range(count))

    async def worker() -> None:
        for n in numbers:
            await one(n)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _measured(concurrency: int, count: int, one: Callable[[int], Awaitable[None]]) -> None:
    await _workers(concurrency, WARM_UP, lambda n: one(2 * 10**9 + n))
    gc.collect()
    _instrument(True)
    await _workers(concurrency, count, one)
    _instrument(False)


async def client(
    url: str,
    layer: str,
    concurrency: int,
    count: int,
    template: dict[str, Any],
    time_slice: float,
) -> None:
    # Imported here: only the client process needs the SDK's internals.
    from typevet_async._backends.llama_cpp_wire import decode_completion
    from typevet_async._core.reading.interpreting import interpret_read
    from typevet_async._core.reading.readings import read_entries
    from typevet_async._core.wires.jsonvalues import render_state
    from typevet_async._options import UNSET
    from typevet_async._session import judging as _judging
    from typevet_async._session.settings import ReadOptions

    if layer == "floor":
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as raw_http:
            run = floor_loop(raw_http, url, template, concurrency)
            await run(WARM_UP, 2 * 10**9)
            gc.collect()
            _instrument(True)
            await run(count, 0)
            _instrument(False)
        return
    prompt, primed = template["prompt"], ticket(PRIME_TICKET)
    questions = list(QUESTIONS.items())
    session = tv.Session.llama_cpp(
        url,
        max_concurrency=concurrency,
        http=tv.HttpSettings(time_slice=time_slice),
        **RECORDED_SETTINGS,
    )
    async with session:
        await session.probe()
        _, planner = await session._ready_planner()
        backend, probe, slots = planner.backend, planner.probe, session._slots.share()
        http = session._backend.http  # type: ignore[attr-defined]
        options = ReadOptions.for_call(
            session._settings,
            off_menu_threshold=UNSET,
            raise_off_menu=UNSET,
            max_retries=UNSET,
            timeout=None,
            permutations=UNSET,
            label_prior=UNSET,
            calibration=UNSET,
        )
        top_k = template["n_probs"]

        async def one(n: int) -> None:
            if layer in ("http", "decode"):
                body = dict(template, prompt=prompt.replace(primed, ticket(n)))
                raw = await http.post("/completion", body)
                if layer == "decode":
                    read_entries(decode_completion(raw, top_k).top, probe.vocab_size)
                return
            if layer == "judge":
                await session.judge(ticket(n), QUESTIONS)
                return
            text = render_state(ticket(n))
            requests = planner.plan(text, questions, ())
            if layer == "read_judgment":
                await _judging.read_judgment(backend, probe, slots, requests, "auto", options)
                return
            async with slots:
                read = await backend.read(requests[0], probe, max_retries=UNSET)
            if layer == "interpret":
                interpret_read(requests[0], read)

        if layer != "judge_many":
            await _measured(concurrency, count, one)
            return
        stream = (ticket(2 * 10**9 + n) for n in range(WARM_UP))
        async for item in session.judge_many(stream, QUESTIONS, max_in_flight=concurrency):
            assert item.judgment is not None, item.error
        gc.collect()
        _instrument(True)
        stream = (ticket(n) for n in range(count))
        async for item in session.judge_many(stream, QUESTIONS, max_in_flight=concurrency):
            assert item.judgment is not None, item.error
        _instrument(False)


# -- the orchestrating process ----------------------------------------------------------------


def _total_instructions(folder: Path) -> int:
    """The instructions counted in a run: the largest total among its dumps."""
    total = 0
    for path in glob.glob(str(folder / "callgrind.out*")):
        for line in Path(path).read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return total


def run(args: argparse.Namespace) -> None:
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: this measurement counts instructions")
    results: dict[str, float] = {}
    with ReplayServerProcess() as server, tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        asyncio.run(capture_sdk_body(tv.Session.llama_cpp(server.url, **RECORDED_SETTINGS)))
        body_path = folder / "body.json"
        body_path.write_bytes(server.last_completion())
        for layer in args.layers:
            for path in glob.glob(str(folder / "callgrind.out*")):
                os.remove(path)
            command = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={folder / 'callgrind.out'}",
                sys.executable, "-m", f"benchmarks.{NAME}", "--client", server.url,
                layer, str(args.concurrency), str(args.questions), str(body_path),
                str(args.slice_scale),
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
            total = _total_instructions(folder)
            if done.returncode != 0 or total == 0:
                raise SystemExit(f"layer {layer} failed:\n{done.stderr[-3000:]}")
            results[layer] = total / args.questions / 1e3
            print(f"{layer:14} {results[layer]:8.1f} k instructions per question", flush=True)
    rows = []
    previous = None
    for layer in args.layers:
        added = "-" if previous is None else f"{results[layer] - results[previous]:+.1f}"
        share = f"{results[layer] / results['floor']:.2f}x" if "floor" in results else "-"
        rows.append([layer, f"{results[layer]:.1f}", added, share])
        previous = layer
    table = markdown_table(["layer", "k instructions / question", "added", "vs floor"], rows)
    print(
        f"\ncallgrind, concurrency {args.concurrency}, {args.questions} questions a layer, one "
        f"Noul per ticket, top-64 reads\n\n{table}"
    )
    if tuple(args.layers) != LAYERS:
        return  # a partial run (an A/B of a change) is not the budget: nothing written
    path = write_results(
        NAME,
        {
            "concurrency": args.concurrency,
            "questions": args.questions,
            "slice_scale": args.slice_scale,
            "k_instructions_per_question": results,
            "table": table,
        },
    )
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--questions", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--slice-scale", type=float, default=50.0)
    parser.add_argument(
        "--layers",
        nargs="+",
        choices=LAYERS,
        default=list(LAYERS),
        help="only these layers (an A/B of one change; the results file is not written)",
    )
    parser.add_argument("--client", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        url, layer, concurrency, count, body_path, scale = args.client
        from typevet_async._concurrency.slicing import SLICE

        template = orjson.loads(Path(body_path).read_bytes())
        time_slice = SLICE * float(scale)
        asyncio.run(client(url, layer, int(concurrency), int(count), template, time_slice))
        return
    run(args)


if __name__ == "__main__":
    main()
