"""What tracing costs the SDK client per question: before OpenTelemetry, after it with no provider
installed, and with the OpenTelemetry SDK's providers installed.

The passes are `bench_client_cost`'s (its ``sdk`` pass, `bench_client_cost.sdk_pass`, and its
``floor``, `bench_client_cost.floor_pass`, imported, not copied), against the same replay server
(`benchmarks.client_cost.replay_server`, real recorded llama.cpp bodies, in a CHILD process), at the
default read (K=64), ``judge_many`` at concurrency 1 and 64. Side by side in one run, each pass in a
fresh client process, rounds with the passes' order rotated (and every other round reversed,
so no pass always runs right after the same other one):

- ``before``: the SDK as of the commit before tracing (a checkout given by ``--before-tree``,
  e.g. ``git worktree add --detach ../wt-before 273bb8d``): the child imports ``typevet_async``
  from that tree and the benchmark's modules from this one;
- ``after``: this tree's SDK with no provider installed (the default: what every user without
  OpenTelemetry pays; the OpenTelemetry API is importable here, as with the ``otel`` extra, so
  the checks are the API's, not the cheaper "API absent" ones);
- ``otel``: this tree's SDK with the real OpenTelemetry SDK installed in the child before the
  session opens: a ``TracerProvider`` (default sampler: every span recorded) with a
  ``BatchSpanProcessor`` over a stub exporter that drops the spans it is handed (counted, SUCCESS:
  `_install_otel`), and a ``MeterProvider`` with an ``InMemoryMetricReader``, collected once
  after the timed questions. What a production application with tracing on pays for the SDK's
  spans and metrics (its batch processor's thread included: the clock is the process's);
- ``floor``: `bench_client_cost`'s floor (a minimal aiohttp loop posting the body this tree's SDK
  sends), for context.

Every child is started with an explicit ``PYTHONPATH`` (the tree whose ``typevet_async`` it
runs) and no ``OTEL_*`` variables, and a bootstrap (`BOOTSTRAP`) that puts that tree first on
``sys.path`` for ``typevet_async`` only (the working directory, this tree, would shadow it
otherwise); each child reports the files it imported and its telemetry state, checked here.

Client CPU per question is the client process's CPU time over the timed questions divided by
their number (`bench_client_cost.measured`); cells are medians over rounds (min-max). The
differences are differences of medians, with the per-round paired differences (same round) and
how many rounds went up. ``after - before`` is called *within noise* when all three hold: the
paired per-round differences straddle zero, the difference of medians is smaller than the range
of ``before``'s own rounds, and the sign test on the paired differences does not reject "no
change" (two-sided p >= 0.05).

    python -m benchmarks.client_cost.bench_telemetry_cost --before-tree ../wt-before [--rounds 9]
        [--questions 4000] [--questions-c1 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

import typevet_async as tv
from benchmarks._shared import ROOT, fmt, markdown_table, run_json_subprocess, spread, write_results
from benchmarks.client_cost import bench_client_cost
from benchmarks.client_cost.bench_client_cost import (
    CONCURRENCIES,
    WARM_UP,
    _delta,
    _session,
    floor_pass,
    sdk_pass,
)
from benchmarks.client_cost.replay_server import ReplayServerProcess, capture_sdk_body

NAME = "bench_telemetry_cost"
PASSES = ("before", "after", "otel", "floor")
READ = "default"  # bench_client_cost's default read: whatever tv.Session.llama_cpp asks for
#: A child's first lines: ``typevet_async`` from the tree under test (``argv[1]``), then the
#: benchmark's own modules from this tree (``argv[2]``); both trees hold both packages.
#: The editable install's finder (it maps ``typevet_async`` to the main checkout and would
#: answer for a submodule the tree under test lacks) is taken out first.
BOOTSTRAP = """\
import sys
sdk_tree, bench_tree = sys.argv[1], sys.argv[2]
sys.meta_path[:] = [
    f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
]
sys.path[:] = [
    sdk_tree,
    *(p for p in sys.path if p not in ("", sdk_tree, bench_tree) and "__editable__" not in p),
]
import typevet_async
sys.path[0] = bench_tree
from benchmarks.client_cost.bench_telemetry_cost import child
child(sys.argv[1:])
"""
WHAT = {
    "before": "SDK before tracing",
    "after": "SDK, no provider",
    "otel": "SDK, OpenTelemetry SDK providers",
    "floor": "aiohttp floor",
}
SIGNIFICANCE = 0.05


# -- the child: one pass -------------------------------------------------------------------


def _install_otel() -> Callable[[], dict[str, Any]]:
    """Install the OpenTelemetry SDK's tracer and meter providers (globally, before the session
    opens); returns ``finish``, which flushes the spans, collects the metrics once and reports
    what was recorded (outside the timed questions)."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class StubDroppingSpanExporter(SpanExporter):
        """A STUB exporter: counts the spans the batch processor hands it and drops them
        (SUCCESS), so the pass pays for the spans and the processor, not for a network."""

        def __init__(self) -> None:
            self.spans = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.spans += len(spans)
            return SpanExportResult.SUCCESS

    exporter = StubDroppingSpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)

    def finish() -> dict[str, Any]:
        started = time.process_time()
        tracer_provider.force_flush()
        flushed = time.process_time()
        data = reader.get_metrics_data()
        collected = time.process_time()
        totals: dict[str, float] = {}
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        raw = getattr(point, "value", None)
                        value: float = getattr(point, "count", 0) if raw is None else raw
                        totals[metric.name] = totals.get(metric.name, 0) + value
        tracer_provider.shutdown()
        meter_provider.shutdown()
        return {
            "spans_exported": exporter.spans,
            "flush_cpu_ms": (flushed - started) * 1e3,
            "collect_cpu_ms": (collected - flushed) * 1e3,
            "metric_totals": totals,  # sums of counters, counts of histograms; warm-up included
        }

    return finish


def _telemetry_state() -> dict[str, Any]:
    """Whether the imported SDK has telemetry, and if so whether it is on."""
    if not any((Path(folder) / "_telemetry").is_dir() for folder in tv.__path__):
        return {"module": False}
    from typevet_async import _telemetry

    return {"module": True, "active": _telemetry.active(), "observing": _telemetry.observing()}


def child(argv: Sequence[str]) -> None:
    """One pass in this (fresh) process: prints its figures as one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("sdk_tree", type=Path)
    parser.add_argument("bench_tree", type=Path)
    parser.add_argument("--pass", dest="client", choices=PASSES, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--questions", type=int, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", type=Path, required=True)
    args = parser.parse_args(argv)
    imported: dict[str, Any] = {
        "typevet_async": str(Path(tv.__file__).resolve()),
        "benchmarks": str(Path(bench_client_cost.__file__).resolve()),
    }
    for package, tree in (("typevet_async", args.sdk_tree), ("benchmarks", args.bench_tree)):
        if not Path(imported[package]).is_relative_to(tree.resolve()):
            raise SystemExit(f"{package} imported from {imported[package]}, not from {tree}")
    finish = _install_otel() if args.client == "otel" else None
    telemetry = _telemetry_state()
    if args.client == "floor":
        template = orjson.loads(args.body_file.read_bytes())
        result = asyncio.run(floor_pass(args.url, template, args.concurrency, args.questions))
    else:
        result = asyncio.run(sdk_pass(args.url, READ, args.concurrency, args.questions, "sdk"))
    foreign = sorted(
        name
        for name, module in sys.modules.items()
        if name.split(".")[0] == "typevet_async"
        and getattr(module, "__file__", None)
        and not Path(module.__file__ or "").resolve().is_relative_to(args.sdk_tree.resolve())
    )
    if foreign:
        raise SystemExit(f"modules imported from outside {args.sdk_tree}: {foreign}")
    imported["typevet_async_modules"] = sum(
        name.split(".")[0] == "typevet_async" for name in sys.modules
    )
    result["imported"] = imported
    result["telemetry"] = telemetry
    if finish is not None:
        result["otel"] = finish()
        result["otel"]["spans_per_question"] = result["otel"]["spans_exported"] / (
            WARM_UP + args.questions
        )
    print(json.dumps(result), flush=True)


# -- the orchestrating process -------------------------------------------------------------


def _revision(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False, timeout=10,
    )  # fmt: skip
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "typevet_async"],
        capture_output=True, text=True, check=False, timeout=10,
    ).stdout.strip()  # fmt: skip
    revision = done.stdout.strip() or "unknown"
    return f"{revision}{' + uncommitted changes in typevet_async/' if dirty else ''}"


def _environment(sdk_tree: Path) -> dict[str, str]:
    """This process's environment, its ``PYTHONPATH`` the tree under test, no ``OTEL_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(sdk_tree)
    return env


def _check(client: str, result: dict[str, Any], sdk_tree: Path) -> None:
    """The pass ran the SDK it was meant to, in the telemetry state it was meant to."""
    telemetry = result["telemetry"]
    expected = {
        "before": {"module": False},
        "after": {"module": True, "active": False, "observing": False},
        "otel": {"module": True, "active": True, "observing": True},
        "floor": telemetry,
    }[client]
    problems = []
    if not Path(result["imported"]["typevet_async"]).is_relative_to(sdk_tree):
        problems.append(f"typevet_async from {result['imported']['typevet_async']}")
    if not Path(result["imported"]["benchmarks"]).is_relative_to(ROOT):
        problems.append(f"benchmarks from {result['imported']['benchmarks']}")
    if telemetry != expected:
        problems.append(f"telemetry {telemetry}, expected {expected}")
    if result["failed"] or result.get("unanswered"):
        problems.append(f"{result['failed']} failed, {result.get('unanswered')} unanswered")
    if client == "otel" and result["otel"]["spans_per_question"] < 1:
        problems.append(f"spans per question {result['otel']['spans_per_question']}")
    if problems:
        raise SystemExit(f"pass {client} c={result.get('concurrency')}: {'; '.join(problems)}")


def run(args: argparse.Namespace) -> None:
    if not Path(tv.__file__).resolve().is_relative_to(ROOT):
        raise SystemExit(f"typevet_async imported from {tv.__file__}: run from {ROOT}")
    before_tree = args.before_tree.resolve()
    trees = {"before": before_tree, "after": ROOT, "otel": ROOT, "floor": ROOT}
    revisions = {"before": _revision(before_tree), "after": _revision(ROOT)}
    passes = [(client, concurrency) for concurrency in CONCURRENCIES for client in PASSES]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {p: [] for p in passes}
    started = time.perf_counter()
    with ReplayServerProcess() as server, tempfile.TemporaryDirectory() as scratch:
        before = server.stats()["n_probs"]
        asyncio.run(capture_sdk_body(_session(server.url, READ, 1)))
        raw = server.last_completion()
        body_file = Path(scratch) / f"{READ}.json"
        body_file.write_bytes(raw)
        body = orjson.loads(raw)
        captured = {
            "n_probs": body["n_probs"],
            "request_fields": sorted(body),
            "response_fields": body.get("response_fields"),
            "n_probs_seen": _delta(before, server.stats()["n_probs"]),
        }
        for round_index in range(args.rounds):
            shift = round_index % len(passes)
            order = passes[shift:] + passes[:shift]
            if round_index % 2:
                order.reverse()
            for client, concurrency in order:
                count = args.questions if concurrency > 1 else args.questions_c1
                command = [
                    str(trees[client]), str(ROOT), "--pass", client,
                    "--concurrency", str(concurrency), "--questions", str(count),
                    "--url", server.url, "--body-file", str(body_file),
                ]  # fmt: skip
                stats_before = server.stats()
                result = run_json_subprocess(
                    command, code=BOOTSTRAP, env=_environment(trees[client])
                )
                stats_after = server.stats()
                result["concurrency"] = concurrency
                result["n_probs_seen"] = _delta(stats_before["n_probs"], stats_after["n_probs"])
                result["unanswered"] = stats_after["requests"].get("unanswered", 0) - stats_before[
                    "requests"
                ].get("unanswered", 0)
                if client != "floor":  # the last body the pass sent, its prompt aside
                    last = orjson.loads(server.last_completion())
                    last.pop("prompt", None)
                    result["last_body_except_prompt"] = last
                _check(client, result, trees[client])
                results[client, concurrency].append(result)
                print(
                    f"round {round_index + 1} {client:6} c={concurrency:<3} "
                    f"{result['cpu_us_per_question']:8.0f} us/q "
                    f"{result['questions_per_s']:7.0f} q/s n_probs {result['n_probs_seen']}",
                    flush=True,
                )
        stats = server.stats()
    elapsed = time.perf_counter() - started
    report(args, passes, results, captured, stats, elapsed, trees, revisions)


def _signed(value: float) -> str:
    return f"{value:+,.0f}"


def _p(p: float) -> str:
    """A p-value as ``= 0.012``, or ``< 0.001``."""
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def _sign_test(higher: int, lower: int) -> float:
    """Two-sided exact sign test of ``higher`` against ``lower`` paired differences (ties
    dropped): the chance of a split at least this uneven if neither direction is favoured."""
    n = higher + lower
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(higher, lower) + 1)) / (1 << n)
    return min(1.0, 2 * tail)


def _difference(
    runs: list[dict[str, Any]], baseline: list[dict[str, Any]]
) -> tuple[dict[str, Any], str]:
    """``runs`` minus ``baseline``: the difference of medians, the paired per-round
    differences and their signs; and its table cell."""
    cpu = [r["cpu_us_per_question"] for r in runs]
    base = [r["cpu_us_per_question"] for r in baseline]
    paired = [a - b for a, b in zip(cpu, base, strict=True)]
    higher, lower = sum(d > 0 for d in paired), sum(d < 0 for d in paired)
    difference = statistics.median(cpu) - statistics.median(base)
    figures = {
        "difference_of_medians_us": difference,
        "relative": difference / statistics.median(base),
        "paired_by_round_us": spread(paired),
        "rounds_higher": higher,
        "rounds_lower": lower,
        "sign_test_p": _sign_test(higher, lower),
        "baseline_range_us": max(base) - min(base),
    }
    cell = (
        f"**{_signed(difference)}** ({difference / statistics.median(base):+.1%}); "
        f"paired {_signed(min(paired))} to {_signed(max(paired))}"
    )
    return figures, cell


def _noise_verdict(figures: dict[str, Any]) -> tuple[bool, str]:
    paired = figures["paired_by_round_us"]
    straddles = paired["min"] < 0 < paired["max"]
    inside = abs(figures["difference_of_medians_us"]) < figures["baseline_range_us"]
    unsigned = figures["sign_test_p"] >= SIGNIFICANCE
    within = straddles and inside and unsigned
    reasons = [
        f"paired per-round differences {_signed(paired['min'])} to {_signed(paired['max'])} µs "
        f"({'straddle' if straddles else 'do NOT straddle'} 0)",
        f"|difference of medians| {abs(figures['difference_of_medians_us']):,.0f} µs "
        f"{'<' if inside else '>='} `before`'s range over rounds "
        f"{figures['baseline_range_us']:,.0f} µs",
        f"higher in {figures['rounds_higher']} of {paired['n']} rounds (sign test p "
        f"{_p(figures['sign_test_p'])}, {'not ' if unsigned else ''}below {SIGNIFICANCE})",
    ]
    return within, "; ".join(reasons)


def report(
    args: argparse.Namespace,
    passes: list[tuple[str, int]],
    results: dict[tuple[str, int], list[dict[str, Any]]],
    captured: dict[str, Any],
    stats: dict[str, Any],
    elapsed: float,
    trees: dict[str, Path],
    revisions: dict[str, str],
) -> None:
    cells: dict[str, Any] = {}
    for client, concurrency in passes:
        runs = results[client, concurrency]
        cells[f"{client}/c{concurrency}"] = {
            "cpu_us_per_question": spread([r["cpu_us_per_question"] for r in runs]),
            "questions_per_s": spread([r["questions_per_s"] for r in runs]),
            "failed": sum(r["failed"] for r in runs),
            "unanswered": sum(r.get("unanswered", 0) for r in runs),
            "questions": runs[0]["questions"],
            "imported_typevet_async": sorted({r["imported"]["typevet_async"] for r in runs}),
            "telemetry": runs[0]["telemetry"],
            "runs": runs,
        }
    label = {
        "before": f"`before`: {WHAT['before']} (`{revisions['before']}`)",
        "after": f"`after`: {WHAT['after']} (`{revisions['after']}`)",
        "otel": f"`otel`: {WHAT['otel']} (`{revisions['after']}`)",
        "floor": f"`floor`: {WHAT['floor']}",
    }
    rows, difference_rows, verdicts = [], [], []
    differences: dict[str, Any] = {}
    for concurrency in CONCURRENCIES:
        floor = statistics.median(r["cpu_us_per_question"] for r in results["floor", concurrency])
        compared = {"after": "before", "otel": "after"}
        for client in PASSES:
            runs = results[client, concurrency]
            cpu = [r["cpu_us_per_question"] for r in runs]
            vs = ""
            if client in compared:
                base = compared[client]
                key = f"{client}-{base}/c{concurrency}"
                differences[key], cell = _difference(runs, results[base, concurrency])
                vs = f"{client} - {base}: {cell}"
            over = "" if client == "floor" else _signed(statistics.median(cpu) - floor)
            rows.append([
                str(concurrency), label[client], fmt(spread(cpu)), vs, over,
                fmt(spread([r["questions_per_s"] for r in runs])),
            ])  # fmt: skip
        off = differences[f"after-before/c{concurrency}"]
        within, reasons = _noise_verdict(off)
        off["within_noise"] = within
        verdict = "within noise" if within else "NOT within noise"
        on = differences[f"otel-after/c{concurrency}"]
        otel_runs = results["otel", concurrency]
        spans = statistics.median(r["otel"]["spans_per_question"] for r in otel_runs)
        for name, figures, text in (
            ("after - before", off, verdict),
            ("otel - after", on, "the cost of tracing on"),
        ):
            paired = figures["paired_by_round_us"]
            difference_rows.append([
                str(concurrency), f"`{name}`",
                f"{_signed(figures['difference_of_medians_us'])} "
                f"({figures['relative']:+.1%})",
                f"{_signed(paired['median'])} ({_signed(paired['min'])} to "
                f"{_signed(paired['max'])})",
                f"{figures['rounds_higher']} of {paired['n']} (p {_p(figures['sign_test_p'])})",
                f"{figures['baseline_range_us']:,.0f}", text,
            ])  # fmt: skip
        verdicts.append(
            f"- c={concurrency}, tracing off (`after - before`): "
            f"{_signed(off['difference_of_medians_us'])} µs/question "
            f"({off['relative']:+.1%}): **{verdict}** ({reasons})"
        )
        verdicts.append(
            f"- c={concurrency}, tracing on (`otel - after`): "
            f"{_signed(on['difference_of_medians_us'])} µs/question ({on['relative']:+.1%}), "
            f"paired per round {_signed(on['paired_by_round_us']['min'])} to "
            f"{_signed(on['paired_by_round_us']['max'])}, higher in {on['rounds_higher']} of "
            f"{on['paired_by_round_us']['n']} rounds; {spans:g} spans per question exported"
        )
    header = ["c", "pass", "client CPU µs/q", "difference µs/q", "over the floor µs/q", "q/s"]
    table = markdown_table(header, rows)
    difference_header = [
        "c", "difference", "of medians µs/q", "paired per round µs/q, median (min to max)",
        "rounds higher (sign test)", "baseline's range over rounds µs/q", "verdict",
    ]  # fmt: skip
    difference_table = markdown_table(difference_header, difference_rows)
    path = write_results(
        NAME,
        {
            "settings": {
                "rounds": args.rounds,
                "questions": args.questions,
                "questions_c1": args.questions_c1,
                "warm_up": WARM_UP,
                "read": f"{READ} (K={captured['n_probs']})",
                "concurrencies": list(CONCURRENCIES),
                "order": "rotated by one pass a round; every other round reversed",
                "before": {"tree": str(trees["before"]), "revision": revisions["before"]},
                "after": {"tree": str(trees["after"]), "revision": revisions["after"]},
                "otel": "TracerProvider (default sampler) + BatchSpanProcessor (defaults) over "
                "a stub exporter that drops spans; MeterProvider + InMemoryMetricReader, "
                "collected once after the timed questions",
                "noise_rule": "within noise: paired per-round differences straddle 0, "
                "|difference of medians| < before's range over rounds, sign test p >= "
                f"{SIGNIFICANCE}",
            },
            "captured_request": captured,
            "replay_server": stats,
            "cells": cells,
            "differences": differences,
            "elapsed_s": elapsed,
            "table": table,
            "tables": {"Differences": difference_table},
            "verdicts": verdicts,
        },
    )
    print()
    print(
        f"Replay server (real recorded llama.cpp bodies) in a child process; one Noul per "
        f"ticket; {args.rounds} rounds, passes rotated, each pass a fresh client process; "
        f"median (min-max); {elapsed:.0f} s in all; the SDK asked for n_probs "
        f"{captured['n_probs']}"
    )
    print()
    print(table)
    print()
    print(difference_table)
    print()
    print("\n".join(verdicts))
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--before-tree",
        type=Path,
        required=True,
        help="a checkout of the commit before tracing (git worktree add --detach DIR 273bb8d)",
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--questions", type=int, default=4000, help="per pass at c=64")
    parser.add_argument("--questions-c1", type=int, default=1500, help="per pass at c=1")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
