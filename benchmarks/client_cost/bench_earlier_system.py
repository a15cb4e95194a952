"""The earlier system, typevet 0.11.0, against this SDK: the same tickets, the same three
questions, the same real llama.cpp server; wall time per three-question judgment.

typevet 0.11.0 (PyPI) needs Python 3.12+ and is not a dependency of this project: install it in
a virtual environment of its own and pass that environment's Python::

    python3.12 -m venv /some/dir && /some/dir/bin/pip install typevet==0.11.0
    python -m benchmarks.client_cost.bench_earlier_system --typevet011-python /some/dir/bin/python \
        [--tickets 6]

(or set ``TYPEVET011_PYTHON``). This module's worker mode runs inside that environment and
imports only the standard library and ``typevet``.

One embedded llama.cpp server (Gemma 3 270M, the built-in ``gemma`` template, 4 slots, as
the live tests start it). Each system opens once (its probe is not timed) and judges one
untimed warm-up ticket; then, ticket by ticket, each judges the ticket with a Noul, a 3-label
Choice and a 4-level Score, and its call is timed (wall clock):

- ``SDK``: ``await session.judge(ticket, questions)`` on ``tv.Session.llama_cpp(url)``, default
  settings (its default top-K read, prompt cache on, the three questions read concurrently);
- ``SDK reproducible``: the same with ``reproducible=True`` (no prompt cache, one read at a
  time: the earlier system's conditions);
- ``typevet 0.11.0``: ``open_gemma_native_vision_judgment(..., require_gemma4=False,
  require_vision=False)`` and ``port.judge(ticket, questions, model)``: a whole-vocabulary read
  (``n_probs`` = 262,144, a 26 MB body parsed with the stdlib ``json``) per question, the
  questions one after another, prompt cache off.

The SDK judges each fresh ticket first, so it never reuses a prompt the earlier system sent.

    python -m benchmarks.client_cost.bench_earlier_system --typevet011-python PATH [--tickets 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NAME = "bench_earlier_system"
TIMES = "\u00d7"
CHOICE = {"billing": "Money matters", "shipping": "Deliveries", "technical": "Bugs and errors"}
LEVELS = ["can wait", "this week", "today", "right now"]
INSTRUCTIONS = {
    "refund": "Is a refund requested?",
    "route": "Which team should handle this?",
    "urgency": "How urgent is this?",
}


# -- worker: runs under typevet 0.11.0's own Python --------------------------------------------


def worker(url: str) -> None:
    """Read one ticket per stdin line, judge it, write one JSON line per ticket."""
    from types import SimpleNamespace

    from typevet.domain.judgment_questions import (  # type: ignore[import-not-found]
        Choice,
        Noul,
        Score,
    )
    from typevet.runtime import (  # type: ignore[import-not-found]
        open_gemma_native_vision_judgment,
    )

    with urllib.request.urlopen(f"{url}/v1/models", timeout=60) as response:
        model = json.loads(response.read())["data"][0]["id"]
    settings = SimpleNamespace(base_url=url, timeout=900.0, multimodal_model=model, autoload=True)
    questions = {
        "refund": Noul(instructions=INSTRUCTIONS["refund"]),
        "route": Choice(criteria=dict(CHOICE), instructions=INSTRUCTIONS["route"]),
        "urgency": Score(criteria=list(LEVELS), instructions=INSTRUCTIONS["urgency"]),
    }
    from importlib.metadata import version

    opened = time.perf_counter()
    with open_gemma_native_vision_judgment(
        settings=settings, require_gemma4=False, require_vision=False
    ) as session:
        ready = {
            "ready": True,
            "version": version("typevet"),
            "python": sys.version.split()[0],
            "served": str(session.served),
            "open_s": time.perf_counter() - opened,
        }
        print(json.dumps(ready), flush=True)
        for line in sys.stdin:
            ticket = json.loads(line)
            started = time.perf_counter()
            try:
                response = session.port.judge(ticket, questions, session.model)
            except Exception as error:
                print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
                continue
            seconds = time.perf_counter() - started
            print(
                json.dumps(
                    {
                        "seconds": seconds,
                        "refund": response.nouls["refund"].noul,
                        "route": response.choices["route"].choice,
                        "urgency": response.scores["urgency"].score,
                        "off_option": {
                            k: v.off_option_mass for k, v in response.off_option.items()
                        },
                    }
                ),
                flush=True,
            )


# -- the benchmark: runs under this project's Python ---------------------------------------


def run(args: argparse.Namespace) -> None:
    import statistics

    import anyio

    import typevet_async as tv
    from benchmarks._shared import fmt, markdown_table, spread, tickets, write_results

    questions: dict[str, tv.Question] = {
        "refund": tv.Noul(instructions=INSTRUCTIONS["refund"]),
        "route": tv.Choice(dict(CHOICE), instructions=INSTRUCTIONS["route"]),
        "urgency": tv.Score(list(LEVELS), instructions=INSTRUCTIONS["urgency"]),
    }
    python = args.typevet011_python or os.environ.get("TYPEVET011_PYTHON")
    if not python:
        raise SystemExit(
            "pass --typevet011-python (a Python 3.12+ with typevet==0.11.0 installed); see "
            "this module's docstring"
        )
    start = (int(time.time()) % 100_000) * 10_000
    warm_up, *states = tickets(args.tickets + 1, start)
    logs = tv.cache_dir() / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    options = tv.ServerOptions(
        chat_template="gemma", n_ctx=8192, n_parallel=4, log_file=logs / "bench-earlier.log"
    )
    rows_raw: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tv.EmbeddedServer(options) as server:
        url = server.url
        earlier = subprocess.Popen(
            [python, "-m", "benchmarks.client_cost.bench_earlier_system", "--worker", "--url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        stdin, stdout = earlier.stdin, earlier.stdout
        assert stdin is not None
        assert stdout is not None
        ready_line = stdout.readline()
        if not ready_line:
            earlier.wait()
            raise SystemExit(
                f"typevet 0.11.0 could not open a judgment session on {url} "
                f"(exit {earlier.returncode}); its traceback is above"
            )
        ready = json.loads(ready_line)
        print(f"typevet {ready['version']} open on {url} (served {ready['served']})", flush=True)

        async def sdk_judge(session: tv.Session, state: str) -> dict[str, Any]:
            t0 = time.perf_counter()
            judgment = await session.judge(state, questions)
            seconds = time.perf_counter() - t0
            return {
                "seconds": seconds,
                "refund": getattr(judgment["refund"], "noul", None),
                "route": getattr(judgment["route"], "choice", None),
                "urgency": getattr(judgment["urgency"], "score", None),
                "reads": {k: d.reads for k, d in judgment.diagnostics.items()},
                "top_k": {k: d.top_k for k, d in judgment.diagnostics.items()},
            }

        async def sdk_all() -> None:
            async with (
                tv.Session.llama_cpp(url) as fast,
                tv.Session.llama_cpp(url, reproducible=True) as reproducible,
            ):
                await fast.probe()
                await reproducible.probe()
                # One untimed judgment each (connections, first-read warm-up), on its own ticket.
                await fast.judge(warm_up, questions)
                await reproducible.judge(warm_up, questions)
                stdin.write(json.dumps(warm_up) + "\n")
                stdin.flush()
                await anyio.to_thread.run_sync(stdout.readline)
                for index, state in enumerate(states):
                    row: dict[str, Any] = {"ticket": state}
                    row["SDK"] = await sdk_judge(fast, state)
                    row["SDK reproducible"] = await sdk_judge(reproducible, state)
                    stdin.write(json.dumps(state) + "\n")
                    stdin.flush()
                    row["typevet 0.11.0"] = await anyio.to_thread.run_sync(
                        lambda: json.loads(stdout.readline() or '{"error": "exited"}')
                    )
                    rows_raw.append(row)
                    print(
                        f"ticket {index + 1}: "
                        + ", ".join(
                            f"{name} {row[name].get('seconds', float('nan')):.2f} s"
                            for name in ("SDK", "SDK reproducible", "typevet 0.11.0")
                        ),
                        flush=True,
                    )

        try:
            anyio.run(sdk_all)
        finally:
            stdin.close()
            earlier.wait(timeout=60)
    elapsed = time.perf_counter() - started
    systems = ("SDK", "SDK reproducible", "typevet 0.11.0")
    errors = {s: [r[s]["error"] for r in rows_raw if "error" in r[s]] for s in systems}
    seconds = {s: [r[s]["seconds"] for r in rows_raw if "seconds" in r[s]] for s in systems}
    if not seconds["typevet 0.11.0"]:
        raise SystemExit(f"typevet 0.11.0 judged no ticket: {errors['typevet 0.11.0'][:1]}")
    base = statistics.median(seconds["SDK"])
    reference = statistics.median(seconds["typevet 0.11.0"])
    rows = []
    for system in systems:
        median = statistics.median(seconds[system])
        rows.append(
            [
                {
                    "SDK": "this SDK, `judge` (default read, prompt cache on, questions "
                    "read concurrently)",
                    "SDK reproducible": "this SDK, `reproducible=True` (no prompt cache, one "
                    "read at a time)",
                    "typevet 0.11.0": "typevet 0.11.0 (whole-vocabulary read per question, "
                    "sequential, cache off)",
                }[system],
                fmt(spread(seconds[system]), 2, " s"),
                f"{median / base:.2f}{TIMES}",
                f"**{reference / median:.1f}{TIMES}**",
            ]
        )
    table = markdown_table(
        ["system", "wall time per 3-question judgment", "vs this SDK", "typevet 0.11.0 / this"],
        rows,
    )
    path = write_results(
        NAME,
        {
            "settings": {"tickets": len(states), "questions": list(INSTRUCTIONS)},
            "server": "embedded: Gemma 3 270M Q4_K_M, xllamacpp, gemma template, 4 slots",
            "typevet011": ready,
            "tickets": rows_raw,
            "seconds": {s: spread(v) for s, v in seconds.items() if v},
            "errors": errors,
            "ratio_typevet011_over_sdk": reference / base,
            "elapsed_s": elapsed,
            "table": table,
        },
    )
    print()
    print(
        f"{len(states)} tickets x 3 questions (Noul, 3-label Choice, 4-level Score), one "
        f"embedded llama.cpp server; median (min-max) over tickets; {elapsed:.0f} s in all"
    )
    print()
    print(table)
    print()
    print(
        f"- typevet 0.11.0 / this SDK per judgment: {reference / base:.1f}{TIMES} "
        f"({reference:.2f} s vs {base:.2f} s)"
    )
    for system, messages in errors.items():
        if messages:
            print(f"- {system}: {len(messages)} errors; the first: {messages[0]}")
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--typevet011-python", help="a Python with typevet==0.11.0 installed")
    parser.add_argument("--tickets", type=int, default=6)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.url)
    else:
        run(args)


if __name__ == "__main__":
    main()
