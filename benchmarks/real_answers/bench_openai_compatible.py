"""The generic OpenAI-compatible path against the exact llama.cpp path: the same questions, the
same layout, the same server, the same model, in one run.

The model is Qwen2.5 Coder 1.5B Instruct (Q4_K_M, ``pip install 'typevet_async[qwen]'``), served
by the embedded llama.cpp server under its own ChatML template with one slot. Two paths read it:

- ``exact``: ``tv.Session.llama_cpp(url)``, ``POST /completion`` with ``n_probs`` (the SDK's
  exact read: every option's logprob, widened where one is outside the window);
- ``generic``: ``tv.Session.openai_compatible(url + "/v1")``, ``POST /v1/chat/completions``
  with ``top_logprobs`` (20 first; the default ``on_missing="clamp"`` widens the window up to
  the server's cap before it fills anything in, and llama.cpp states none);
- ``cap N``: the generic path through a proxy in front of the same server that refuses a
  ``top_logprobs`` above ``N`` as OpenAI does (HTTP 400 naming the limit; OpenAI's cap is 20),
  every reply the server's own: the probe learns the cap, and an option outside the top ``N``
  is clamped and the answer flagged ``truncated``.

The data: the first ``--tickets`` shipped tickets (``examples/eval``: a Noul ``refund``, a
4-label Choice ``route``, a 3-level Score ``urgency``) and the public sets the project stores in
``benchmarks/public_data/`` ("eval" rows, every ``--every``-th of each class): sst2 (Noul),
agnews (Choice), sst5 (Score). Every session has the SDK's default settings (``max_concurrency``
1), so both paths send the same messages; each judgment asks one question.

Each question is read, one at a time: first fresh by one path (``exact`` on even items,
``generic`` on odd: the fresh-prompt time per judgment), then by both paths in alternating order
with the prompt cached, then by each capped session. llama.cpp's chat endpoint always reuses its
prompt cache and a cached read differs from a fresh one by read noise, so the paths' answers are
compared on the cached reads, where they meet the same conditions; the fresh read against the
same path's cached read measures that noise.

Per task and row: accuracy and NLL (95% bootstrap intervals, 1,000 resamples, seeded, as
``bench_public_data``), the paired difference against ``exact`` with its interval, the largest
``|p - p_exact|`` over options and items, the share of answers flagged ``truncated`` and the
options clamped; per task and path the time per judgment, fresh and cached, and the ratio
generic / exact. Results to ``benchmarks/results/bench_openai_compatible.json``, its tables to
the docs page (``python scripts/benchmark_pages.py``).

    python -m benchmarks.real_answers.bench_openai_compatible \
        [--tickets 80] [--every 4] [--cap 20 --cap 5]

The defaults read 420 questions, five reads each, in about 35 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from aiohttp import web

import typevet_async as tv
from benchmarks._local_proxy import LocalProxy, cap_refusal
from benchmarks._shared import at_least, markdown_table, write_results
from benchmarks.real_answers.bench_public_data import (
    DATA,
    RESAMPLES,
    SEED,
    TASKS,
    Progress,
    in_option_order,
    interval,
    load_task,
    paired_differences,
    resamples,
    without_draws,
)
from benchmarks.real_answers.bench_real_model import MODEL, gold_index, load_set
from typevet_async._core.statistics.metrics import evaluate

NAME = "bench_openai_compatible"
N_CTX = 8192
EXACT, GENERIC = "exact", "generic"
PATHS = (EXACT, GENERIC)
#: OpenAI's cap, and the 5 some hosted providers state.
CAPS = (20, 5)


def capped(cap: int) -> str:
    return f"cap {cap}"


# -- the data -------------------------------------------------------------------------------


@attrs.frozen
class Case:
    """One question about one text, and its gold option's index."""

    task: str
    id: str
    text: str
    question_id: str
    question: tv.Question
    gold: int


def ticket_cases(count: int) -> dict[str, list[Case]]:
    """The first ``count`` shipped tickets, one task per question (``tickets/refund``, ...)."""
    tickets, questions = load_set(1)
    return {
        f"tickets/{qid}": [
            Case(
                f"tickets/{qid}",
                str(t["id"]),
                t["state"],
                qid,
                question,
                gold_index(question, t["labels"][qid]),
            )
            for t in tickets[:count]
        ]
        for qid, question in questions.items()
    }


def public_cases(every: int) -> tuple[dict[str, list[Case]], dict[str, Any]]:
    """Each public task's eval rows (every ``every``-th of each class), and their provenance."""
    cases, provenance = {}, {}
    for name, task in TASKS.items():
        data = load_task(task, DATA, every)
        question = task.question(())
        cases[name] = [
            Case(name, item.id, item.text, name, question, item.gold) for item in data.items
        ]
        provenance[name] = {
            key: data.provenance[key] for key in ("file", "sha256", "eval_rows", "sampled")
        }
    return cases, provenance


# -- a server capped as OpenAI's ----------------------------------------------------------------


class CappedProxy(LocalProxy):
    """A proxy on 127.0.0.1 in front of the server that refuses ``top_logprobs`` above
    ``cap`` as OpenAI does (HTTP 400 naming the limit) and passes everything else through, the
    replies the server's own."""

    def __init__(self, upstream: str, cap: int) -> None:
        super().__init__(upstream)
        self.cap = cap

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        data = await request.read()
        if request.path.endswith("/chat/completions"):
            refusal = cap_refusal(json.loads(data).get("top_logprobs"), self.cap)
            if refusal is not None:
                return refusal
        status, body = await self.forward(request, data)
        return web.Response(status=status, body=body, content_type="application/json")


# -- reading --------------------------------------------------------------------------------


@attrs.frozen
class Read:
    """One judgment's read of one question: the answer's probabilities (option order), the
    off-menu mass (None where clamped), the flags, the window, and the seconds it took."""

    p: tuple[float, ...]
    off: float | None
    truncated: bool
    clamped: int
    top_k: int
    reads: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float


async def judged(session: tv.Session, case: Case) -> Read:
    began = time.perf_counter()
    judgment = await session.judge(case.text, {case.question_id: case.question})
    seconds = time.perf_counter() - began
    diagnostics = judgment.diagnostics[case.question_id]
    return Read(
        in_option_order(judgment[case.question_id].probabilities) or (),
        diagnostics.off_menu_mass,
        diagnostics.truncated,
        diagnostics.clamped,
        diagnostics.top_k,
        diagnostics.reads,
        judgment.usage.prompt_tokens,
        judgment.usage.cached_tokens,
        seconds,
    )


@attrs.frozen
class CaseReads:
    """A case's fresh read (by ``fresh_path``), and each row's read with the prompt cached."""

    fresh_path: str
    fresh: Read
    rows: dict[str, Read]


async def read_case(sessions: Mapping[str, tv.Session], case: Case, index: int) -> CaseReads:
    """Fresh by one path (alternating with the index), then cached by both paths in
    alternating order, then by each capped session."""
    first, second = PATHS if index % 2 == 0 else PATHS[::-1]
    fresh = await judged(sessions[first], case)
    rows = {path: await judged(sessions[path], case) for path in (second, first)}
    for name, session in sessions.items():
        if name not in PATHS:
            rows[name] = await judged(session, case)
    return CaseReads(first, fresh, rows)


@asynccontextmanager
async def opened_sessions(url: str, caps: Sequence[int]) -> AsyncIterator[dict[str, tv.Session]]:
    """The exact and generic sessions, and one generic session behind each capped proxy."""
    async with AsyncExitStack() as stack:
        sessions = {
            EXACT: await stack.enter_async_context(tv.Session.llama_cpp(url, max_concurrency=1)),
            GENERIC: await stack.enter_async_context(
                tv.Session.openai_compatible(f"{url}/v1", max_concurrency=1)
            ),
        }
        for cap in caps:
            proxy = await stack.enter_async_context(CappedProxy(url, cap))
            sessions[capped(cap)] = await stack.enter_async_context(
                tv.Session.openai_compatible(f"{proxy.url}/v1", max_concurrency=1)
            )
        yield sessions


async def probes(sessions: Mapping[str, tv.Session]) -> dict[str, dict[str, Any]]:
    """What each generic session's probe learnt of its server."""
    learnt = {}
    for name, session in sessions.items():
        server = (await session.probe()).chat_server
        if server is not None:
            learnt[name] = {
                "top_logprobs_cap": server.top_logprobs_cap,
                "thinking_switch": server.thinking_switch,
                "tokenize": server.tokenize,
                "refused": list(server.refused),
            }
    return learnt


# -- the figures ----------------------------------------------------------------------------


def rows_of(reads: Sequence[CaseReads]) -> dict[str, dict[str, Any]]:
    """Per row, every case's probabilities, off-menu mass, flags, window and seconds."""
    names = list(reads[0].rows)
    return {
        name: {
            "p": [list(r.rows[name].p) for r in reads],
            "off": [r.rows[name].off for r in reads],
            "truncated": [r.rows[name].truncated for r in reads],
            "clamped": [r.rows[name].clamped for r in reads],
            "top_k": [r.rows[name].top_k for r in reads],
            "reads": [r.rows[name].reads for r in reads],
            "seconds": [r.rows[name].seconds for r in reads],
        }
        for name in names
    }


def fresh_of(reads: Sequence[CaseReads]) -> dict[str, Any]:
    return {
        "path": [r.fresh_path for r in reads],
        "p": [list(r.fresh.p) for r in reads],
        "seconds": [r.fresh.seconds for r in reads],
        "prompt_tokens": [r.fresh.prompt_tokens for r in reads],
        "cached_tokens": [r.fresh.cached_tokens for r in reads],
    }


def largest_difference(p: np.ndarray, q: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(p - q)[mask].max()) if mask.any() else 0.0


def row_summary(
    row: Mapping[str, Any], exact: Mapping[str, Any], gold: np.ndarray, draws: np.ndarray
) -> dict[str, Any]:
    p, q = np.asarray(row["p"], dtype=np.float64), np.asarray(exact["p"], dtype=np.float64)
    truncated = np.asarray(row["truncated"], dtype=bool)
    metrics = evaluate(p, gold, resamples=RESAMPLES, seed=SEED)
    known = [off for off in row["off"] if off is not None]
    return {
        "n": len(gold),
        "accuracy": attrs.asdict(metrics.accuracy),
        "nll": attrs.asdict(metrics.nll),
        "off_menu": float(np.mean(known)) if known else None,
        "truncated": float(truncated.mean()),
        "clamped_options": int(np.sum(row["clamped"])),
        "widened": float(np.mean(np.asarray(row["reads"]) > 1)),
        "vs_exact": paired_differences(row, exact, gold, np.ones(len(gold), bool), draws),
        "max_abs_dp": largest_difference(p, q, np.ones(len(gold), bool)),
        "max_abs_dp_not_truncated": largest_difference(p, q, ~truncated),
        "answers_differ": int(np.sum(p.argmax(axis=1) != q.argmax(axis=1))),
        "answers_differ_not_truncated": int(
            np.sum((p.argmax(axis=1) != q.argmax(axis=1)) & ~truncated)
        ),
    }


def read_noise(fresh: Mapping[str, Any], rows: Mapping[str, Any]) -> dict[str, float]:
    """Per path: the largest ``|p_fresh - p_cached|`` of the same path and question."""
    noise = {}
    for path in PATHS:
        mask = np.array([who == path for who in fresh["path"]])
        p = np.asarray(fresh["p"], dtype=np.float64)
        q = np.asarray(rows[path]["p"], dtype=np.float64)
        noise[path] = largest_difference(p, q, mask)
    return noise


def ratio_interval(
    generic: np.ndarray, exact: np.ndarray, paired: bool, salt: Sequence[int]
) -> dict[str, float]:
    """median(generic) / median(exact), with a 95% bootstrap interval (items resampled
    together where ``paired``, else each path's own)."""
    rng = np.random.default_rng([SEED, *salt])
    a = rng.integers(0, len(generic), size=(RESAMPLES, len(generic)))
    b = a if paired else rng.integers(0, len(exact), size=(RESAMPLES, len(exact)))
    draws = np.median(generic[a], axis=1) / np.median(exact[b], axis=1)
    return interval(float(np.median(generic) / np.median(exact)), draws)


def time_summary(
    fresh: Mapping[str, Any], rows: Mapping[str, Any], salt: Sequence[int]
) -> dict[str, Any]:
    """Seconds per judgment per path, fresh (each path on its own half of the items) and cached
    (every item, both paths), medians, and the ratios generic / exact."""
    seconds = np.asarray(fresh["seconds"])
    tokens = np.asarray(fresh["prompt_tokens"])
    by_path = {path: np.array([who == path for who in fresh["path"]]) for path in PATHS}
    figures: dict[str, Any] = {"fresh": {}, "cached": {}}
    for path in PATHS:
        mine = seconds[by_path[path]]
        figures["fresh"][path] = {
            "median_s": float(np.median(mine)),
            "mean_s": float(np.mean(mine)),
            "n": int(mine.size),
            "median_prompt_tokens": float(np.median(tokens[by_path[path]])),
        }
        cached = np.asarray(rows[path]["seconds"])
        figures["cached"][path] = {"median_s": float(np.median(cached)), "n": int(cached.size)}
    figures["fresh"]["ratio"] = ratio_interval(
        seconds[by_path[GENERIC]], seconds[by_path[EXACT]], False, (*salt, 0)
    )
    figures["cached"]["ratio"] = ratio_interval(
        np.asarray(rows[GENERIC]["seconds"]), np.asarray(rows[EXACT]["seconds"]), True, (*salt, 1)
    )
    return figures


def task_summary(
    position: int, cases: Sequence[Case], rows: Mapping[str, Any], fresh: Mapping[str, Any]
) -> dict[str, Any]:
    gold = np.array([case.gold for case in cases])
    draws = resamples(len(cases), (position, 0))
    return {
        "rows": {name: row_summary(row, rows[EXACT], gold, draws) for name, row in rows.items()},
        "read_noise": read_noise(fresh, rows),
        "time": time_summary(fresh, rows, (position,)),
    }


def overall_time(records: Mapping[str, Mapping[str, Any]], tasks: Sequence[str]) -> dict[str, Any]:
    """`time_summary` over every task's items together."""
    fresh = {
        key: [v for t in tasks for v in records[t]["fresh"][key]]
        for key in ("path", "seconds", "prompt_tokens")
    }
    rows = {
        path: {"seconds": [v for t in tasks for v in records[t]["rows"][path]["seconds"]]}
        for path in PATHS
    }
    return time_summary(fresh, rows, (len(tasks),))


# -- the tables -----------------------------------------------------------------------------


def cell(stat: Mapping[str, float] | None, sign: bool = False) -> str:
    if stat is None:
        return ""
    form = "+.3f" if sign else ".3f"
    value, low, high = (round(stat[key], 3) + 0.0 for key in ("value", "low", "high"))  # no -0
    return f"{value:{form}} [{low:{form}}, {high:{form}}]"


def accuracy_table(summary: Mapping[str, Any]) -> str:
    rows = []
    for task, figures in summary.items():
        for name in PATHS:
            entry = figures["rows"][name]
            versus = entry["vs_exact"] if name != EXACT else {}
            rows.append(
                [
                    task,
                    f"`{name}`",
                    cell(entry["accuracy"]),
                    cell(entry["nll"]),
                    "" if entry["off_menu"] is None else f"{entry['off_menu']:.3f}",
                    cell(versus.get("accuracy"), sign=True),
                    cell(versus.get("nll"), sign=True),
                ]
            )
    header = ["task", "path", "accuracy", "NLL", "off-menu", "Δ accuracy", "Δ NLL"]
    lead = (
        "Each path's answers, read with the prompt cached (the same conditions for both). "
        "Δ: generic - exact, paired by item (accuracy: above 0 is better; NLL: below 0). 95% "
        "bootstrap intervals, 1,000 resamples."
    )
    return lead + "\n\n" + markdown_table(header, rows)


def agreement_table(summary: Mapping[str, Any]) -> str:
    rows = []
    for task, figures in summary.items():
        entry, noise = figures["rows"][GENERIC], figures["read_noise"]
        rows.append(
            [
                task,
                str(entry["n"]),
                f"{entry['max_abs_dp']:.1e}",
                str(entry["answers_differ"]),
                f"{entry['truncated']:.3f}",
                f"{entry['widened']:.3f}",
                f"{noise[EXACT]:.3f} / {noise[GENERIC]:.3f}",
            ]
        )
    header = ["task", "questions", "max abs(p_generic - p_exact)", "answers that differ"]
    header += ["truncated", "widened past 20", "read noise: fresh vs cached, exact / generic"]
    lead = (
        "The generic path against the exact one on the same cached prompt: the largest "
        "difference in any option's probability, and the answers (most likely option) that "
        "differ. Truncated: the generic answers flagged (none can be: llama.cpp states no cap, so "
        "the window widens up to 4,096 before anything is clamped). Widened: the share read "
        "again wider because an option was outside the first top 20. Read noise: the largest "
        "difference between a path's fresh read and its cached read of the same prompt."
    )
    return lead + "\n\n" + markdown_table(header, rows)


def truncation_table(summary: Mapping[str, Any], caps: Sequence[int]) -> str:
    rows = []
    for task, figures in summary.items():
        for cap in caps:
            entry = figures["rows"][capped(cap)]
            versus = entry["vs_exact"]
            rows.append(
                [
                    task,
                    f"`{capped(cap)}`",
                    f"{entry['truncated']:.3f}",
                    str(entry["clamped_options"]),
                    f"{entry['max_abs_dp_not_truncated']:.1e}",
                    cell(entry["accuracy"]),
                    cell(entry["nll"]),
                    cell(versus["accuracy"], sign=True),
                    cell(versus["nll"], sign=True),
                ]
            )
    header = ["task", "server", "truncated", "options clamped", "max abs Δp, not truncated"]
    header += ["accuracy", "NLL", "Δ accuracy", "Δ NLL"]
    lead = (
        "The generic path on a server that refuses `top_logprobs` above N as OpenAI does "
        "(OpenAI's N is 20): the probe learns N from the refusal, and an option outside the "
        'top N gets the lowest logprob returned (`on_missing="clamp"`, the default), the '
        "answer flagged `truncated`. Truncated: the share of answers flagged; Δ: against "
        "`exact`, paired by item."
    )
    return lead + "\n\n" + markdown_table(header, rows)


def time_table(summary: Mapping[str, Any], overall: Mapping[str, Any]) -> str:
    def row(task: str, figures: Mapping[str, Any]) -> list[str]:
        fresh, cached = figures["fresh"], figures["cached"]
        return [
            task,
            f"{fresh[EXACT]['median_s']:.2f} ({fresh[EXACT]['n']})",
            f"{fresh[GENERIC]['median_s']:.2f} ({fresh[GENERIC]['n']})",
            cell(fresh["ratio"]),
            f"{cached[EXACT]['median_s'] * 1000:.0f}",
            f"{cached[GENERIC]['median_s'] * 1000:.0f}",
            cell(cached["ratio"]),
        ]

    rows = [row(task, figures["time"]) for task, figures in summary.items()]
    rows.append(row("all", overall))
    header = ["task", "exact, fresh: median s (judgments)", "generic, fresh", "ratio"]
    header += ["exact, cached: median ms", "generic, cached", "ratio"]
    lead = (
        "Seconds per judgment (one question), interleaved in one run on one server slot. Fresh: "
        "the prompt's first read, by `exact` on even items and `generic` on odd ones (each "
        "path's median over its own half). Cached: every item by both paths, the prompt in the "
        "server's cache (what remains is each path's own cost: the request, one token's "
        "evaluation, the reply). Ratio: generic / exact, of the medians, with a 95% bootstrap "
        "interval. The machine was shared with other work: compare the ratios, not the seconds."
    )
    return lead + "\n\n" + markdown_table(header, rows)


def probe_table(learnt: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [
        [
            f"`{name}`",
            "none stated" if entry["top_logprobs_cap"] is None else str(entry["top_logprobs_cap"]),
            "yes" if entry["thinking_switch"] else "no",
            "yes" if entry["tokenize"] else "no",
            ", ".join(entry["refused"]) or "nothing",
        ]
        for name, entry in learnt.items()
    ]
    header = ["session", "top_logprobs cap", "chat_template_kwargs", "/tokenize", "refused"]
    return "What each generic session's probe learnt (`session.probe().chat_server`).\n\n" + (
        markdown_table(header, rows)
    )


def data_table(
    cases: Mapping[str, Sequence[Case]], provenance: Mapping[str, Any], tickets: int
) -> str:
    rows = []
    for task, items in cases.items():
        question = items[0].question
        source = provenance.get(task)
        where = (
            f"`{source['file']}`, every {source['every']}: {source['sampled']} of "
            f"{source['eval_rows']} eval rows"
            if source
            else f"`examples/eval/tickets.jsonl`, the first {tickets}"
        )
        rows.append([task, type(question).__name__, str(len(items)), where])
    return markdown_table(["task", "question", "items", "source"], rows)


# -- the run --------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> None:
    cases = ticket_cases(args.tickets)
    public, provenance = public_cases(args.every)
    for entry in provenance.values():
        entry["every"] = args.every
    cases.update(public)
    caps = list(dict.fromkeys(args.cap or CAPS))
    total = sum(len(items) for items in cases.values())
    options = tv.ServerOptions(model=MODEL, n_ctx=N_CTX, n_parallel=1)
    started, load = time.monotonic(), os.getloadavg()[0]
    records: dict[str, dict[str, Any]] = {}
    with tv.EmbeddedServer(options) as server:
        server_start = time.monotonic() - started
        print(f"{MODEL} served at {server.url} in {server_start:.1f} s", file=sys.stderr)
        async with opened_sessions(server.url, caps) as sessions:
            learnt = await probes(sessions)
            progress = Progress("questions", total, started)
            for task, items in cases.items():
                reads = []
                for index, case in enumerate(items):
                    reads.append(await read_case(sessions, case, index))
                    progress.tick()
                records[task] = {"rows": rows_of(reads), "fresh": fresh_of(reads)}
    summary = {
        task: task_summary(position, cases[task], records[task]["rows"], records[task]["fresh"])
        for position, task in enumerate(cases)
    }
    overall = overall_time(records, list(cases))
    tables = {
        "accuracy and NLL": accuracy_table(summary),
        "generic against exact": agreement_table(summary),
        "truncation by the server's cap": truncation_table(summary, caps),
        "time per judgment": time_table(summary, overall),
        "what the probe learnt": probe_table(learnt),
        "data": data_table(cases, provenance, args.tickets),
    }
    for heading, text in tables.items():
        print(f"\n### {heading}\n\n{text}")
    path = write_results(
        NAME,
        {
            "model": MODEL,
            "server": "embedded llama.cpp (xllamacpp), one slot, the model's ChatML template",
            "tickets": args.tickets,
            "every": args.every,
            "slots": 1,
            "n_ctx": N_CTX,
            "run_seconds": time.monotonic() - started,
            "note": f"load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at "
            "the end, on 2 cores shared with other work",
            "server_start_s": server_start,
            "settings": {
                EXACT: "tv.Session.llama_cpp(url, max_concurrency=1)",
                GENERIC: 'tv.Session.openai_compatible(url + "/v1", max_concurrency=1)',
                "caps": caps,
                "cap N": "the generic session through a proxy refusing top_logprobs above N",
                "judgment": "one question; the SDK's default session settings",
                "resamples": RESAMPLES,
                "seed": SEED,
            },
            "probes": learnt,
            "data": provenance,
            "summary": without_draws(summary),
            "time": without_draws(overall),
            "items": {
                task: {
                    "ids": [case.id for case in cases[task]],
                    "gold": [case.gold for case in cases[task]],
                    **records[task],
                }
                for task in cases
            },
            "tables": tables,
        },
        folder=args.out,
    )
    print(f"\nwritten to {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tickets", type=at_least(1), default=80, help="the first N shipped tickets (default: 80)"
    )
    parser.add_argument(
        "--every", type=at_least(1), default=4, help="every K-th public eval row of each class (4)"
    )
    parser.add_argument(
        "--cap",
        action="append",
        type=at_least(1),
        help="a capped server's top_logprobs limit, repeated (default: "
        f"{', '.join(map(str, CAPS))})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the results folder (default: benchmarks/results/real_answers)",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
