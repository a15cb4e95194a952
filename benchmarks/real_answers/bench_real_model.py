"""Accuracy and calibration on the real instruction model: the SDK's framings against a plain
hand-written letter prompt, on the same server, the same tickets, in one run.

The model is Qwen2.5 Coder 1.5B Instruct (Q4_K_M, ``pip install 'typevet_async[qwen]'``), served
by the embedded llama.cpp server under its own ChatML template (4 slots). The tickets are the
shipped labelled set (``examples/eval``: 300 tickets, a Noul ``refund``, a 4-label Choice
``route``, a 3-level Score ``urgency``); ``--every K`` takes every K-th ticket (the CI machine
reads about one question a second, so all 300 under every arm take over an hour).

Arms (every one reads each question exactly: every option's logprob, from one read or a wider
one where an option was outside the first):

- ``sdk`` and any ``sdk:<JSON settings>``: ``session.judge_many`` on
  ``tv.Session.llama_cpp(url, **settings)``, e.g. ``sdk:{"controls": "digits"}``,
  ``sdk:{"layout": "fused"}``, ``sdk:{"permutations": {"route": 4}, "label_prior": true}``;
- ``plain``: the prompt a user writes by hand: the ticket, the instructions, the options as
  ``A. billing: charges, ...`` (a Noul: ``A. No`` / ``B. Yes``, a Score its levels), "Answer
  with one letter.", in the model's ChatML turn with its default system message, the letters'
  logprobs read from one ``POST /completion`` (top 4,096, wider if a letter is missing).

Each arm also reads every Choice with its options reversed (``--no-reversed`` skips it): the
order sensitivity is the share of tickets whose answer changes and the mean total variation
between the two probability vectors.

Per question and arm: accuracy, NLL, Brier, ECE (10 equal-width bins, top probability), each
with a 95% bootstrap interval (1,000 resamples), the mean off-menu mass, and the paired
difference in accuracy against ``plain`` with its own bootstrap interval.

    python -m benchmarks.real_answers.bench_real_model [--every 3] [--arm plain --arm sdk \
        --arm 'sdk:{"layout": "fused"}' ...] [--speed 30] [--identity-every 10] [--diagrams]

``--question QID`` (repeated) reads only those questions of the set, e.g. the route alone for its
reversed-order study.

``--identity-every K`` checks that the SDK's default prompt is byte for byte the plain letter
prompt on every ticket and question (rendered, not read), and reads every K-th ticket both ways
one at a time without the prompt cache: equal prompts give equal reads there, so the accuracy of
one is the accuracy of the other, whatever the server's batching does to the last bits when
both run with the cache and 4 slots.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import numpy as np

import typevet_async as tv
from benchmarks._shared import at_least, markdown_table, write_results
from benchmarks.real_answers import bench_public_data as public
from benchmarks.real_answers._plain_reader import (
    LETTERS,
    PlainReader,
    plain_prompt,
    served_vocabulary,
    softmax,
)
from typevet_async._apps.cli.exits import CommandLineError
from typevet_async._apps.cli.inputs import read_json_file
from typevet_async._core.statistics import fitting
from typevet_async._core.statistics.metrics import evaluate
from typevet_async._session.images import NO_IMAGES

ROOT = Path(__file__).resolve().parents[2]
NAME = "bench_real_model"
EVAL = ROOT / "examples" / "eval"
MODEL = "qwen2.5-coder-1.5b"


def load_set(
    every: int, questions_file: Path = EVAL / "questions.json"
) -> tuple[list[dict[str, Any]], dict[str, tv.Question]]:
    """Every ``every``-th shipped ticket, and the questions of ``questions_file`` (System One
    JSON, ``x_examples`` read: the shipped set's own by default)."""
    tickets = [json.loads(line) for line in (EVAL / "tickets.jsonl").read_text().splitlines()]
    questions = tv.questions_from_json(read_json_file(questions_file, "--questions"))
    return tickets[::every], dict(questions)


def gold_index(question: tv.Question, label: Any) -> int:
    labels = [option.label for option in question.options()]
    if isinstance(question, tv.Noul):
        return labels.index("true" if label else "false")
    if isinstance(question, tv.Score):
        return int(label)
    return labels.index(label)


def reversed_choice(question: tv.Choice) -> tv.Choice:
    options = list(reversed(question.options()))
    return tv.Choice({o.label: o.description for o in options}, instructions=question.instructions)


async def run_plain(
    url: str, tickets: Sequence[Mapping[str, Any]], questions: Mapping[str, tv.Question],
    reverse: bool, concurrency: int,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    slots = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as http:
        reader = PlainReader(url, http, await served_vocabulary(url, http))

        async def one(ticket: Mapping[str, Any], qid: str, flipped: bool) -> dict[str, Any]:
            question = questions[qid]
            n = len(question.options())
            order = list(range(n))[::-1] if flipped else list(range(n))
            async with slots:
                prompt = plain_prompt(ticket["state"], question, order)
                logprobs, off = await reader.read(prompt, LETTERS[:n])
            shown = softmax(logprobs)
            probabilities = [0.0] * n
            for position, index in enumerate(order):
                probabilities[index] = shown[position]
            return {"id": ticket["id"], "p": probabilities, "off": off}

        results: dict[str, list[dict[str, Any]]] = {}
        for qid in questions:
            results[qid] = list(await asyncio.gather(*(one(t, qid, False) for t in tickets)))
            if reverse and isinstance(questions[qid], tv.Choice):
                results[f"{qid}:reversed"] = list(
                    await asyncio.gather(*(one(t, qid, True) for t in tickets))
                )
    return results


# -- the SDK -------------------------------------------------------------------------------------


def parse_arm(arm: str) -> dict[str, Any]:
    """``sdk`` -> ``{}``; ``sdk:{"layout": "fused"}`` -> the session settings in the JSON."""
    _, _, spec = arm.partition(":")
    settings = json.loads(spec) if spec else {}
    if not isinstance(settings, dict):
        raise SystemExit(f"arm {arm!r}: the settings after 'sdk:' must be a JSON object")
    return settings


async def run_sdk(
    url: str, tickets: Sequence[Mapping[str, Any]], questions: Mapping[str, tv.Question],
    reverse: bool, concurrency: int, settings: Mapping[str, Any],
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    asked: dict[str, tv.Question] = dict(questions)
    if reverse:
        for qid, question in questions.items():
            if isinstance(question, tv.Choice):
                asked[f"{qid}:reversed"] = reversed_choice(question)
    results: dict[str, list[dict[str, Any]]] = {qid: [] for qid in asked}
    async with tv.Session.llama_cpp(url, max_concurrency=concurrency, **settings) as session:
        states = [ticket["state"] for ticket in tickets]
        async for item in session.judge_many(states, asked):
            judgment = item.judgment
            if judgment is None:
                raise RuntimeError(f"ticket {tickets[item.index]['id']}: {item.error!r}")
            for qid in asked:
                answer = judgment[qid]
                base = questions[qid.split(":")[0]]
                if isinstance(answer, tv.ChoiceAnswer):  # by label: a reversed one too
                    probabilities = [answer.probabilities[o.label] for o in base.options()]
                else:
                    probabilities = list(answer.probabilities.values())
                off = judgment.diagnostics[qid].off_menu_mass
                results[qid].append(
                    {"id": tickets[item.index]["id"], "p": probabilities, "off": off}
                )
    for rows in results.values():
        rows.sort(key=lambda row: str(row["id"]))
    return results


# -- the report ------------------------------------------------------------------------------


def summarise(
    arm_results: Mapping[str, Mapping[str, list[dict[str, Any]]]],
    tickets: Sequence[Mapping[str, Any]],
    questions: Mapping[str, tv.Question],
) -> dict[str, Any]:
    gold = {
        qid: np.array(
            [gold_index(q, t["labels"][qid]) for t in sorted(tickets, key=lambda t: t["id"])]
        )
        for qid, q in questions.items()
    }
    summary: dict[str, Any] = {}
    for arm, results in arm_results.items():
        summary[arm] = {}
        for qid in questions:
            p = np.array([row["p"] for row in results[qid]])
            metrics = evaluate(p, gold[qid], resamples=1000)
            entry: dict[str, Any] = {
                "accuracy": attrs.asdict(metrics.accuracy),
                "nll": attrs.asdict(metrics.nll),
                "brier": attrs.asdict(metrics.brier),
                "ece": attrs.asdict(metrics.ece_width),
                "off_menu": float(np.mean([row["off"] for row in results[qid]])),
                "correct": (p.argmax(axis=1) == gold[qid]).astype(int).tolist(),
            }
            flipped = results.get(f"{qid}:reversed")
            if flipped is not None:
                q = np.array([row["p"] for row in flipped])
                entry["order"] = {
                    "answer_changes": float(np.mean(p.argmax(axis=1) != q.argmax(axis=1))),
                    "mean_total_variation": float(np.mean(np.abs(p - q).sum(axis=1) / 2)),
                    "reversed_accuracy": float(np.mean(q.argmax(axis=1) == gold[qid])),
                }
            summary[arm][qid] = entry
    if "plain" in summary:
        rng = np.random.default_rng(0)
        for arm in summary:
            for qid in questions:
                a = np.array(summary[arm][qid]["correct"])
                b = np.array(summary["plain"][qid]["correct"])
                draws = rng.integers(0, len(a), size=(1000, len(a)))
                diffs = (a[draws] - b[draws]).mean(axis=1)
                summary[arm][qid]["vs_plain"] = {
                    "difference": float((a - b).mean()),
                    "low": float(np.quantile(diffs, 0.025)),
                    "high": float(np.quantile(diffs, 0.975)),
                }
    return summary


def batch_calibration(
    reads: Mapping[str, Mapping[str, list[dict[str, Any]]]],
    tickets: Sequence[Mapping[str, Any]],
    questions: Mapping[str, tv.Question],
) -> dict[str, Any]:
    """Batch calibration computed from the stored reads of ``plain`` and ``sdk`` (the SDK's
    defaults), no read of its own: per question, all the tickets (no held-out half: nothing is
    fitted), in ticket order, cut into batches of 10, 50 or all, each batch's prior divided out
    of its own items; the figures and table are bench_public_data's (`batch_section`)."""
    ordered = sorted(tickets, key=lambda t: str(t["id"]))
    tasks, summaries = [], {}
    for position, (qid, question) in enumerate(questions.items()):
        labels = tuple(option.label for option in question.options())
        task = public.Task(qid, functools.partial(asked, question), labels)
        stored = {arm: reads[arm][qid] for arm in ("plain", "sdk")}
        for arm, read in stored.items():
            if [str(row["id"]) for row in read] != [str(t["id"]) for t in ordered]:
                raise SystemExit(f"{arm} {qid}: the stored reads are not of these tickets")
        items = [
            public.Item(str(t["id"]), str(t["state"]), gold_index(question, t["labels"][qid]), True)
            for t in ordered
        ]
        everything = np.ones(len(items), dtype=bool)
        rows: dict[str, dict[str, Any]] = {}
        for arm, name in (("plain", public.PLAIN), ("sdk", public.DEFAULTS)):
            row = {"p": [r["p"] for r in stored[arm]], "off": [r["off"] for r in stored[arm]]}
            rows[name] = row
            for size in public.BATCH_SIZES:
                rows[public.bc_name(name, size)] = public.batch_calibrated(row, everything, size)
        tasks.append(task)
        summaries[qid] = public.task_summary(task, position, items, rows)
    lead = (
        "Every ticket counts as held-out here (nothing is fitted: a batch's prior is its own "
        "items' mean), so the batches cut all the tickets in ticket order."
    )
    table = public.batch_section(tasks, summaries, {task.name: "sdk" for task in tasks})
    return {"summary": public.without_draws(summaries), "table": lead + "\n\n" + table}


def asked(question: tv.Question, _examples: Any) -> tv.Question:
    return question


def with_batch_calibration(path: Path) -> None:
    """Rewrite the results file ``path`` with its batch-calibration section, computed from the
    per-item reads it stores (no read is made)."""
    results = json.loads(path.read_text())
    reads = results.get("reads")
    if not isinstance(reads, Mapping) or not {"plain", "sdk"} <= set(reads):
        raise SystemExit(
            f"{path}: holds no per-item reads of both `plain` and `sdk` (a run before the reads "
            "were stored keeps only its figures): run the benchmark with --arm plain --arm sdk"
        )
    tickets, questions = load_set(int(results["every"]), ROOT / results["questions_file"])
    questions = {qid: q for qid, q in questions.items() if qid in reads["plain"]}
    results["batch_calibration"] = batch_calibration(reads, tickets, questions)
    print(results["batch_calibration"]["table"])
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nrewritten: {path}", file=sys.stderr)


def calibration_study(
    results: Mapping[str, list[dict[str, Any]]],
    tickets: Sequence[Mapping[str, Any]],
    questions: Mapping[str, tv.Question],
) -> dict[str, Any]:
    """Fit on one half of the tickets, score on the other: within the fitting half the SDK's
    own rule picks a map (fitted on its first part, kept only if it lowers the NLL of its
    second part); the other half, never seen, scores the raw and the mapped probabilities."""
    ordered = sorted(tickets, key=lambda ticket: str(ticket["id"]))
    study: dict[str, Any] = {}
    for qid, question in questions.items():
        p = np.array([row["p"] for row in results[qid]])
        gold = np.array([gold_index(question, t["labels"][qid]) for t in ordered])
        half = np.arange(len(gold)) % 2 == 0  # alternate tickets: the halves are alike
        fit_half = fitting.Labelled(p[half], gold[half])
        inner = np.arange(len(fit_half)) % 2 == 0
        best, report = fitting.choose_transform(fit_half.subset(inner), fit_half.subset(~inner))
        scored = p[~half]
        mapped = fitting.transformed(best.transform, scored) if best is not None else scored
        raw_metrics = evaluate(scored, gold[~half], resamples=1000)
        mapped_metrics = evaluate(mapped, gold[~half], resamples=1000)
        study[qid] = {
            "kept": best.name if best is not None else None,
            "selection": report,
            "scored_items": int((~half).sum()),
            "raw": {k: attrs.asdict(getattr(raw_metrics, k)) for k in ("nll", "ece_width")},
            "mapped": {k: attrs.asdict(getattr(mapped_metrics, k)) for k in ("nll", "ece_width")},
        }
    return study


async def speed_study(
    url: str, tickets: Sequence[Mapping[str, Any]], question: tv.Choice
) -> dict[str, Any]:
    """One decision at a time, prompt cache warm (each ticket decided once untimed first): the
    logprob read (``judge``) against schema-bound generation of ``{"label": <enum>}`` and
    against a tool call through ``/v1/chat/completions`` (llama.cpp's own tool-call parsing of
    the model's ChatML ``<tool_call>``, ``tool_choice: "required"``, the label an enum)."""
    labels = [option.label for option in question.options()]
    schema = {
        "type": "object",
        "properties": {"label": {"enum": labels}},
        "required": ["label"],
        "additionalProperties": False,
    }
    rows: list[dict[str, Any]] = []
    async with tv.Session.llama_cpp(url, max_concurrency=1) as session:
        for ticket in tickets:
            state = ticket["state"]
            await session.judge(state, {"route": question})  # warm the prompt cache
            began = time.perf_counter()
            judgment = await session.judge(state, {"route": question})
            judged = time.perf_counter() - began
            answer = judgment["route"]
            assert isinstance(answer, tv.ChoiceAnswer)
            options = "\n".join(
                f"- {o.label}: {o.description}" if o.description else f"- {o.label}"
                for o in question.options()
            )
            prompt = (
                f"{state}\n\n{question.instructions}\n{options}\n"
                'Answer in JSON as {"label": "<one of the labels>"}.'
            )
            await session.generate(prompt, schema=schema, max_tokens=32)  # warm it too
            began = time.perf_counter()
            generation = await session.generate(prompt, schema=schema, max_tokens=32)
            generated = time.perf_counter() - began
            tool_body = tool_call_body(f"{state}\n\n{question.instructions}\n{options}", labels)
            await tool_call(url, tool_body)  # warm it too
            began = time.perf_counter()
            tool_label, tool_tokens, tool_where = await tool_call(url, tool_body)
            called = time.perf_counter() - began
            rows.append({
                "id": ticket["id"], "gold": ticket["labels"]["route"],
                "judge_seconds": judged, "judge_label": answer.choice,
                "generate_seconds": generated, "generate_label": generation.value["label"],
                "generate_tokens": generation.completion_tokens,
                "tool_seconds": called, "tool_label": tool_label, "tool_tokens": tool_tokens,
                "tool_call_in": tool_where,
            })  # fmt: skip
    judge_times = sorted(row["judge_seconds"] for row in rows)
    generate_times = sorted(row["generate_seconds"] for row in rows)
    tool_times = sorted(row["tool_seconds"] for row in rows)
    return {
        "tool_median_s": tool_times[len(rows) // 2],
        "tool_speedup_median": tool_times[len(rows) // 2] / judge_times[len(rows) // 2],
        "tool_accuracy": sum(r["tool_label"] == r["gold"] for r in rows) / len(rows),
        "tool_calls_missing": sum(r["tool_label"] is None for r in rows),
        "tool_calls_parsed_by_server": sum(r["tool_call_in"] == "tool_calls" for r in rows),
        "decisions": len(rows),
        "judge_median_s": judge_times[len(rows) // 2],
        "generate_median_s": generate_times[len(rows) // 2],
        "judge_mean_s": sum(judge_times) / len(rows),
        "generate_mean_s": sum(generate_times) / len(rows),
        "speedup_median": generate_times[len(rows) // 2] / judge_times[len(rows) // 2],
        "speedup_mean": sum(generate_times) / sum(judge_times),
        "judge_accuracy": sum(r["judge_label"] == r["gold"] for r in rows) / len(rows),
        "generate_accuracy": sum(r["generate_label"] == r["gold"] for r in rows) / len(rows),
        "rows": rows,
    }


async def identity_check(
    url: str, tickets: Sequence[Mapping[str, Any]], questions: Mapping[str, tv.Question],
    every: int,
) -> dict[str, Any]:  # fmt: skip
    """Whether the SDK's default prompt *is* the plain letter prompt: every ticket's and
    question's prefix compared byte for byte (rendered by the SDK's planner, nothing read),
    then every ``every``-th ticket read both ways one at a time without the prompt cache (the
    SDK's ``reproducible=True``; the plain loop with ``cache_prompt: false``), so any
    difference left would be the framing's, not the server's batching."""
    same = different = 0
    example: dict[str, str] | None = None
    async with tv.Session.llama_cpp(url, reproducible=True) as session:
        _, planner = await session._ready_planner()  # the SDK's own rendering, no read
        for ticket in tickets:
            for qid, question in questions.items():
                (request,) = planner.plan(ticket["state"], [(qid, question)], NO_IMAGES)
                plain = plain_prompt(ticket["state"], question, range(len(question.options())))
                if request.prompt == plain:
                    same += 1
                else:
                    different += 1
                    example = example or {"sdk": str(request.prompt), "plain": plain}
        sample = list(tickets[::every])
        judged = [
            await session.judge(ticket["state"], dict(questions)) for ticket in sample
        ]  # one at a time: reproducible
    largest = 0.0
    answers_equal = 0
    async with aiohttp.ClientSession() as http:
        reader = PlainReader(url, http, await served_vocabulary(url, http), cache_prompt=False)
        for ticket, judgment in zip(sample, judged, strict=True):
            for qid, question in questions.items():
                n = len(question.options())
                logprobs, _ = await reader.read(
                    plain_prompt(ticket["state"], question, range(n)), LETTERS[:n]
                )
                plain_p = softmax(logprobs)
                sdk_p = list(judgment[qid].probabilities.values())
                largest = max(largest, *(abs(a - b) for a, b in zip(plain_p, sdk_p, strict=True)))
                answers_equal += int(np.argmax(plain_p) == np.argmax(sdk_p))
    return {
        "prompts_identical": same,
        "prompts_different": different,
        "first_difference": example,
        "read_tickets": len(sample),
        "read_questions": len(sample) * len(questions),
        "answers_equal": answers_equal,
        "max_abs_probability_difference": largest,
    }


def reliability_diagrams(
    results: Mapping[str, list[dict[str, Any]]],
    tickets: Sequence[Mapping[str, Any]],
    questions: Mapping[str, tv.Question],
    folder: Path,
) -> list[str]:
    """The arm's reliability diagram per question (the eval report's own figure)."""
    from typevet_async._apps.evaluation import report as _report

    ordered = sorted(tickets, key=lambda ticket: str(ticket["id"]))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for qid, question in questions.items():
        p = np.array([row["p"] for row in results[qid]])
        gold = np.array([gold_index(question, t["labels"][qid]) for t in ordered])
        metrics = evaluate(p, gold, resamples=0)
        path = folder / f"real-{qid}-reliability.png"
        title = f"{qid}: Qwen2.5 Coder 1.5B, SDK defaults, {len(gold)} tickets"
        _report.reliability_png(metrics.bins_width, path, title=title)
        written.append(str(path.relative_to(ROOT)))
    return written


def tool_call_body(prompt: str, labels: Sequence[str]) -> dict[str, Any]:
    function = {
        "name": "route_ticket",
        "description": "Route the ticket to the team that should handle it.",
        "parameters": {
            "type": "object",
            "properties": {"label": {"type": "string", "enum": list(labels)}},
            "required": ["label"],
        },
    }
    return {
        "messages": [{"role": "user", "content": prompt}],
        "tools": [{"type": "function", "function": function}],
        # "required" made llama.cpp hold the model to a grammar it filled to max_tokens with
        # blank lines after the call (measured here); "auto" lets it stop.
        "tool_choice": "auto",
        "temperature": 0.0,
        "max_tokens": 64,
    }


async def tool_call(url: str, body: Mapping[str, Any]) -> tuple[str | None, int, str]:
    """The label the model called the tool with, the tokens generated, and where the call
    was found: ``"tool_calls"`` (parsed by llama.cpp), ``"content"`` (a JSON call written as
    text, which this model does: a fenced ``{"name", "arguments"}`` block) or ``"none"``."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=body) as response,
    ):
        reply = await response.json()
    tokens = int(reply.get("usage", {}).get("completion_tokens", 0))
    message = (reply.get("choices") or [{}])[0].get("message", {})
    calls = message.get("tool_calls") or []
    try:
        if calls:
            arguments, where = json.loads(calls[0]["function"]["arguments"]), "tool_calls"
        else:
            text = str(message.get("content") or "")
            start, end = text.find("{"), text.rfind("}")
            arguments, where = json.loads(text[start : end + 1]).get("arguments"), "content"
        label = arguments.get("label")
    except (AttributeError, KeyError, TypeError, ValueError):
        return None, tokens, "none"
    return (label, tokens, where) if isinstance(label, str) else (None, tokens, "none")


def arm_label(arm: str) -> str:
    """``sdk:{"layout": "fused"}`` -> ``sdk layout=fused``, for the tables."""
    settings = parse_arm(arm) if arm.startswith("sdk") else {}
    shown = " ".join(
        f"{key}={value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))}"
        for key, value in settings.items()
    )
    return f"{arm.partition(':')[0]} {shown}".strip()


def print_tables(summary: Mapping[str, Any], questions: Mapping[str, tv.Question]) -> None:
    def cell(stat: Mapping[str, float]) -> str:
        return f"{stat['value']:.3f} [{stat['low']:.3f}, {stat['high']:.3f}]"

    for qid in questions:
        rows = []
        for arm, per_question in summary.items():
            entry = per_question[qid]
            order = entry.get("order")
            versus = entry.get("vs_plain")
            rows.append([
                arm_label(arm), cell(entry["accuracy"]), cell(entry["nll"]), cell(entry["brier"]),
                cell(entry["ece"]), f"{entry['off_menu']:.3f}",
                f"{versus['difference']:+.3f} [{versus['low']:+.3f}, {versus['high']:+.3f}]"
                if versus else "",
                f"{order['answer_changes']:.3f} / {order['mean_total_variation']:.3f}"
                if order else "",
            ])  # fmt: skip
        print(f"\n### {qid} ({type(questions[qid]).__name__})\n")
        header = ["arm", "accuracy", "NLL", "Brier", "ECE", "off-menu", "vs plain"]
        print(markdown_table([*header, "reversed: changed / TV"], rows))


async def main_async(args: argparse.Namespace) -> None:
    tickets, questions = load_set(args.every, args.questions)
    if args.question:
        questions = {qid: questions[qid] for qid in questions if qid in args.question}
    arms = args.arm or ["plain", "sdk"]
    options = tv.ServerOptions(model=MODEL, n_ctx=8192, n_parallel=args.slots)
    started = time.monotonic()
    with tv.EmbeddedServer(options) as server:
        print(
            f"{MODEL} served at {server.url} in {time.monotonic() - started:.1f} s", file=sys.stderr
        )
        arm_results: dict[str, dict[str, list[dict[str, Any]]]] = {}
        seconds: dict[str, float] = {}
        for arm in arms:
            began = time.monotonic()
            if arm == "plain":
                arm_results[arm] = await run_plain(
                    server.url, tickets, questions, args.reversed, args.slots
                )
            else:
                arm_results[arm] = await run_sdk(
                    server.url, tickets, questions, args.reversed, args.slots, parse_arm(arm)
                )
            seconds[arm] = time.monotonic() - began
            print(f"{arm}: {seconds[arm]:.0f} s", file=sys.stderr, flush=True)
        identity = None
        if args.identity_every:
            began = time.monotonic()
            identity = await identity_check(server.url, tickets, questions, args.identity_every)
            seconds["identity"] = time.monotonic() - began
            print(f"identity: {identity}", file=sys.stderr, flush=True)
        speed = None
        if args.speed:
            route = questions["route"]
            assert isinstance(route, tv.Choice)
            speed = await speed_study(server.url, tickets[: args.speed], route)
    summary = summarise(arm_results, tickets, questions)
    print_tables(summary, questions)
    calibration = {
        arm: calibration_study(arm_results[arm], tickets, questions)
        for arm in arms
        if arm != "plain"
    }
    for arm, study in calibration.items():
        print(f"\n### calibration, {arm_label(arm)}: fitted on one half, scored on the other\n")
        rows = [
            [
                qid,
                str(entry["kept"]),
                f"{entry['raw']['nll']['value']:.3f} -> {entry['mapped']['nll']['value']:.3f}",
                f"{entry['raw']['ece_width']['value']:.3f} -> "
                f"{entry['mapped']['ece_width']['value']:.3f}",
            ]
            for qid, entry in study.items()
        ]
        print(markdown_table(["question", "map kept", "NLL raw -> mapped", "ECE"], rows))
    if speed is not None:
        print(
            f"\n### one decision at a time, cache warm, {speed['decisions']} tickets\n\n"
            f"judge {speed['judge_median_s'] * 1000:.0f} ms median, right "
            f"{speed['judge_accuracy']:.3f}; generation {speed['generate_median_s'] * 1000:.0f} "
            f"ms, right {speed['generate_accuracy']:.3f}; {speed['speedup_median']:.1f}x "
            f"(mean {speed['speedup_mean']:.1f}x); tool call {speed['tool_median_s'] * 1000:.0f} "
            f"ms, right {speed['tool_accuracy']:.3f} ({speed['tool_calls_missing']} without a "
            f"call, {speed['tool_calls_parsed_by_server']} parsed by the server), "
            f"{speed['tool_speedup_median']:.1f}x"
        )
    diagrams = (
        reliability_diagrams(arm_results["sdk"], tickets, questions, ROOT / "docs" / "images")
        if args.diagrams and "sdk" in arm_results
        else []
    )
    if identity is not None:
        print(
            f"\n### the SDK's default prompt against the plain letter prompt\n\n"
            f"prompts identical byte for byte: {identity['prompts_identical']} of "
            f"{identity['prompts_identical'] + identity['prompts_different']}; read one at a "
            f"time without the cache on {identity['read_tickets']} tickets: answers equal on "
            f"{identity['answers_equal']} of {identity['read_questions']}, largest probability "
            f"difference {identity['max_abs_probability_difference']:.2e}"
        )
    write_results(
        NAME if args.results is None else f"{NAME}.{args.results}",
        {
            "model": MODEL,
            "tickets": len(tickets),
            "every": args.every,
            "questions_file": str(args.questions.resolve().relative_to(ROOT)),
            "slots": args.slots,
            "arms": arms,
            "seconds": seconds,
            "summary": summary,
            "calibration": calibration,
            "identity": identity,
            "diagrams": diagrams,
            "speed": speed,
            "reads": arm_results,
            "batch_calibration": batch_calibration(arm_results, tickets, questions)
            if {"plain", "sdk"} <= set(arm_results)
            else None,
        },
    )


def _questions_file(text: str) -> Path:
    """An argparse type: a readable questions file inside the repository (its path is recorded
    relative to it), whose questions parse (exit 2 naming the problem otherwise)."""
    path = Path(text).resolve()
    if not path.is_relative_to(ROOT) or not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file inside the repository")
    try:  # read as the CLI reads --questions (a nesting too deep, a key twice: refused)
        tv.questions_from_json(read_json_file(path, "--questions"))
    except (CommandLineError, tv.TypevetError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return path


def _results_name(text: str) -> str:
    """A named run's name: a plain word, the results then go to ``bench_real_model.<name>.json``
    beside the latest run's file, never to a path."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a plain name (letters, digits, '_', '-'; at most 80)"
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--every", type=at_least(1), default=3, help="every K-th ticket (default: 3)"
    )
    parser.add_argument(
        "--arm",
        action="append",
        help="an arm, repeated: plain, sdk, sdk:layout=fused,... (default: plain and sdk)",
    )
    parser.add_argument(
        "--question",
        action="append",
        metavar="QID",
        help="read only this question, repeated (default: every question of the set)",
    )
    parser.add_argument(
        "--questions",
        type=_questions_file,
        default=EVAL / "questions.json",
        metavar="FILE",
        help="the questions (System One JSON under the repository, `x_examples` read; the plain "
        "arm asks them without examples; default: examples/eval/questions.json)",
    )
    parser.add_argument("--slots", type=at_least(1), default=4, help="server slots (default: 4)")
    parser.add_argument("--no-reversed", dest="reversed", action="store_false")
    parser.add_argument(
        "--speed",
        type=at_least(0),
        default=30,
        metavar="N",
        help="time N route decisions by judge and by generation (0: skip; default: 30)",
    )
    parser.add_argument(
        "--results",
        type=_results_name,
        default=None,
        metavar="RUN",
        help=f"a named run kept beside the latest: results to {NAME}.RUN.json (default: the "
        f"latest run, {NAME}.json, under benchmarks/results/real_answers/)",
    )
    parser.add_argument(
        "--identity-every",
        type=at_least(0),
        default=0,
        metavar="K",
        help="compare the SDK's default prompts with the plain ones for every ticket, and read "
        "every K-th ticket both ways without the cache (0: skip; default: 0)",
    )
    parser.add_argument(
        "--diagrams",
        action="store_true",
        help="write the sdk arm's reliability diagrams (docs/images/real-QUESTION-reliability.png)",
    )
    parser.add_argument(
        "--batch-calibration-from",
        type=Path,
        metavar="RESULTS",
        help="read nothing: add batch calibration of `plain` and `sdk`, computed from the "
        "per-item reads the results file RESULTS stores, to that file",
    )
    args = parser.parse_args()
    if args.batch_calibration_from is not None:
        with_batch_calibration(args.batch_calibration_from)
        return
    _, questions = load_set(1, args.questions)
    unknown = sorted(set(args.question or ()) - set(questions))
    if unknown:
        parser.error(f"--question: no such question {unknown} (the set has {sorted(questions)})")
    if args.question and args.speed and "route" not in args.question:
        parser.error("--speed times route decisions: read the route too, or --speed 0")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
