"""How the size K of a llama.cpp top-K read changes an answer: figures for the README's
"How a read works, and why it is exact" section, and for the size of the first read
(``LlamaCppConfig.first_top_k``).

Each question of a measured set (the demo's 5 tickets x its 3 questions, plus 10-, 20- and
36-option Choices on the same tickets, default layout, Gemma 3 template) is read with
``POST /completion`` (``n_predict: 0``, pre-sampling probabilities) at K = 16 ... 4,096 and at
the whole vocabulary, with the prompt cache off and on. The reads are posted with plain urllib
and parsed with the stdlib ``json``, not through the SDK's read path; the SDK only builds the
prompts (``plan_question`` with the probed control ids), exactly as it frames them.

Per K it reports: how many reads missed a candidate (the SDK would escalate), the largest
difference in an answer probability (softmax over the candidates) and in the off-menu mass
(1 - sum of the candidates' probabilities) against the whole-vocabulary read of the same
prompt under the same cache mode, the candidates' logprob difference (raw, and after removing
the one shift common to every candidate), body size and read time. Every K below the whole
vocabulary is read ``--repeats`` times (interleaved) to show run-to-run noise.

With the cache on, a first read of each prompt (discarded) fills the cache, so every measured
read evaluates the same cached state; with it off, every read evaluates the whole prompt.

    python -m benchmarks.real_answers.measure_top_k            # embedded server, Gemma 3 template
    python -m benchmarks.real_answers.measure_top_k --url URL  # or a running one
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

import typevet_async as tv
from benchmarks._shared import results_path
from typevet_async._apps.demo import QUESTIONS as DEMO_QUESTIONS
from typevet_async._apps.demo import TICKETS
from typevet_async._backends.llama_cpp import next_top_k
from typevet_async._core.prompts.scoring import plan_question
from typevet_async._core.wires.jsonvalues import render_state

SMALL_KS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: The tolerance the README promises for "equal to a whole-vocabulary read".
EQUAL = 1e-6
RESULTS = results_path("measure_top_k")

DEPARTMENTS = [
    "billing", "shipping", "technical", "accounts", "returns",
    "sales", "legal", "privacy", "feedback", "other",
]  # fmt: skip
PRODUCTS = [
    "phone", "laptop", "tablet", "watch", "headphones", "speaker", "camera", "printer",
    "router", "monitor", "keyboard", "mouse", "charger", "cable", "case", "software",
    "subscription", "gift card", "warranty", "accessory",
]  # fmt: skip
TOPICS = [
    "double charge", "refund", "invoice", "price", "discount", "payment failed", "late parcel",
    "lost parcel", "damaged item", "wrong item", "address change", "customs", "crash",
    "login", "password", "slow app", "sync", "notifications", "battery", "screen", "sound",
    "data export", "account deletion", "privacy request", "complaint", "praise",
    "feature request", "cancellation", "upgrade", "downgrade", "trial", "coupon", "gift",
    "repair", "replacement", "other",
]  # fmt: skip

QUESTIONS: dict[str, tv.Question] = {
    **DEMO_QUESTIONS,
    "department": tv.Choice(dict.fromkeys(DEPARTMENTS), instructions="Which department?"),
    "product": tv.Choice(dict.fromkeys(PRODUCTS), instructions="Which product is this about?"),
    "topic": tv.Choice(dict.fromkeys(TOPICS), instructions="What is the ticket's topic?"),
}


# -- building the prompts (the SDK's framing; nothing else of the SDK) --------------------------


async def build_prompts(url: str) -> tuple[list[dict[str, Any]], int]:
    """Every (ticket, question) prompt and its candidate ids, framed as the SDK frames them."""
    async with tv.Session.llama_cpp(url) as session:
        probe = await session.probe()
    if probe.family is not tv.TemplateFamily.GEMMA3:
        raise SystemExit(f"expected a Gemma 3 template, the probe found {probe.family}")
    prompts = []
    for n, ticket in enumerate(TICKETS):
        for question_id, question in QUESTIONS.items():
            request = plan_question(
                question_id,
                question,
                render_state(ticket),
                family=tv.TemplateFamily.GEMMA3,
                control_ids=probe.control_ids,
            )
            assert request.prompt is not None
            assert not request.variant_ids
            prompts.append(
                {
                    "name": f"t{n}.{question_id}",
                    "options": len(request.token_ids),
                    "prompt": request.prompt,
                    "ids": list(request.token_ids),
                }
            )
    return prompts, probe.vocab_size


# -- one independent read --------------------------------------------------------------------------


def read(url: str, prompt: str, k: int, *, cache: bool) -> dict[str, Any]:
    """One ``/completion`` read of the top ``k``: plain urllib, stdlib json."""
    body = {
        "prompt": prompt,
        "n_predict": 0,
        "n_probs": k,
        "post_sampling_probs": False,
        "cache_prompt": cache,
        "return_tokens": False,
    }
    request = urllib.request.Request(
        f"{url}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        raw = response.read()
    wall = time.perf_counter() - started
    payload = json.loads(raw)
    parse = time.perf_counter() - started - wall
    top = payload["completion_probabilities"][0]["top_logprobs"]
    if len(top) != k:
        raise SystemExit(f"asked for {k} entries, got {len(top)}")
    timings = payload.get("timings") or {}
    return {
        "logprobs": {int(e["id"]): float(e["logprob"]) for e in top},
        "bytes": len(raw),
        "wall_ms": wall * 1000,
        "parse_ms": parse * 1000,
        "server_ms": float(timings.get("prompt_ms", 0.0)) + float(timings.get("predicted_ms", 0.0)),
        "cache_n": int(timings.get("cache_n", 0)),
        "prompt_n": int(timings.get("prompt_n", 0)),
    }


def softmax(logprobs: Sequence[float]) -> list[float]:
    """The softmax over the candidates (what an answer reports), computed here."""
    top = max(logprobs)
    weights = [math.exp(value - top) for value in logprobs]
    total = math.fsum(weights)
    return [weight / total for weight in weights]


def off_menu(logprobs: Sequence[float]) -> float:
    """1 minus the candidates' summed probability, unclamped."""
    return 1.0 - math.fsum(math.exp(value) for value in logprobs)


def largest(values: Sequence[float]) -> float:
    return max((abs(v) for v in values), default=0.0)


# -- the measurement -------------------------------------------------------------------------------


def measure_one(
    url: str, item: dict[str, Any], vocab: int, *, cache: bool, repeats: int
) -> dict[str, Any]:
    """Every K for one prompt under one cache mode, compared with its whole-vocabulary read."""
    prompt, ids = item["prompt"], item["ids"]
    if cache:
        read(url, prompt, SMALL_KS[0], cache=True)  # fill the cache; discarded
    full = read(url, prompt, vocab, cache=cache)
    full_lp = [full["logprobs"][i] for i in ids]
    # Each candidate's rank in the whole vocabulary: the smallest K that holds every candidate.
    order = sorted(full["logprobs"].items(), key=lambda entry: (-entry[1], entry[0]))
    rank = {token: n + 1 for n, (token, _) in enumerate(order)}
    whole_mass = math.fsum(math.exp(v) for v in full["logprobs"].values())
    reads: dict[int, list[dict[str, Any]]] = {k: [] for k in SMALL_KS}
    for _ in range(repeats):
        for k in SMALL_KS:
            reads[k].append(read(url, prompt, k, cache=cache))
    result: dict[str, Any] = {
        "name": item["name"],
        "options": item["options"],
        "cache": cache,
        "ranks": [rank[i] for i in ids],
        "needed_k": max(rank[i] for i in ids),
        "whole_vocabulary": {
            "off_menu": off_menu(full_lp),
            "mass_minus_1": whole_mass - 1.0,
            "bytes": full["bytes"],
            "wall_ms": full["wall_ms"],
            "parse_ms": full["parse_ms"],
            "server_ms": full["server_ms"],
            "cache_n": full["cache_n"],
        },
        "k": {},
    }
    full_p = softmax(full_lp)
    full_off = off_menu(full_lp)
    ref_4096 = reads[4096]
    for k in SMALL_KS:
        per_rep = []
        for rep, r in enumerate(reads[k]):
            present = [i in r["logprobs"] for i in ids]
            row: dict[str, Any] = {
                "missed": present.count(False),
                "bytes": r["bytes"],
                "wall_ms": r["wall_ms"],
                "server_ms": r["server_ms"],
                "cache_n": r["cache_n"],
                "prompt_n": r["prompt_n"],
            }
            if all(present):
                lp = [r["logprobs"][i] for i in ids]
                diffs = [a - b for a, b in zip(lp, full_lp, strict=True)]
                shift = statistics.fmean(diffs)
                lp_4096 = [ref_4096[rep]["logprobs"].get(i) for i in ids]
                row |= {
                    "d_prob": largest([a - b for a, b in zip(softmax(lp), full_p, strict=True)]),
                    "d_logprob": largest(diffs),
                    "shift": shift,
                    "d_logprob_unshifted": largest([d - shift for d in diffs]),
                    "off_menu": off_menu(lp),
                    "d_off_menu": abs(off_menu(lp) - full_off),
                    "d_off_menu_4096": (
                        abs(off_menu(lp) - off_menu(lp_4096)) if None not in lp_4096 else None
                    ),
                }
            per_rep.append(row)
        # Run-to-run: the same K's candidate logprobs across repeats (when all present).
        same = [[r["logprobs"].get(i) for i in ids] for r in reads[k]]
        noise = None
        if all(None not in s for s in same):
            noise = max(largest([a - b for a, b in zip(s, same[0], strict=True)]) for s in same)
        result["k"][k] = {"reads": per_rep, "run_to_run": noise}
    return result


def _median_by_mode(results: list[dict[str, Any]], key: str, k: int | None) -> dict[str, float]:
    """The median of ``key`` over the reads at ``k`` (None: the whole vocabulary), per mode."""
    medians = {}
    for mode, cache in (("nocache", False), ("cache", True)):
        values = [
            row[key]
            for r in results
            if r["cache"] is cache
            for row in (r["k"][k]["reads"] if k is not None else [r["whole_vocabulary"]])
        ]
        medians[mode] = statistics.median(values)
    return medians


def summarise(results: list[dict[str, Any]], vocab: int) -> dict[str, Any]:
    """Per K, over every prompt and both cache modes."""
    table: dict[str, Any] = {}
    for k in SMALL_KS:
        cells = [r["k"][k] for r in results]
        rows = [row for c in cells for row in c["reads"]]
        found = [row for row in rows if not row["missed"]]
        missed = [
            f"{r['name']}/{'cache' if r['cache'] else 'nocache'}"
            for r in results
            if any(row["missed"] for row in r["k"][k]["reads"])
        ]
        noise = [c["run_to_run"] for c in cells if c["run_to_run"] is not None]
        off_4096 = [row["d_off_menu_4096"] for row in found if row["d_off_menu_4096"] is not None]
        table[str(k)] = {
            "prompts_missed": len(missed),
            "missed": missed,
            "reads": len(rows),
            "max_d_prob": max((row["d_prob"] for row in found), default=None),
            "max_d_logprob": max((row["d_logprob"] for row in found), default=None),
            "max_abs_shift": max((abs(row["shift"]) for row in found), default=None),
            "max_d_logprob_unshifted": max(
                (row["d_logprob_unshifted"] for row in found), default=None
            ),
            "max_d_off_menu": max((row["d_off_menu"] for row in found), default=None),
            "max_d_off_menu_4096": max(off_4096, default=None),
            "max_run_to_run": max(noise, default=None),
            "median_bytes": statistics.median(row["bytes"] for row in rows),
            "median_wall_ms": _median_by_mode(results, "wall_ms", k),
            "median_server_ms": _median_by_mode(results, "server_ms", k),
        }
    whole = [r["whole_vocabulary"] for r in results]
    table[str(vocab)] = {
        "prompts_missed": 0,
        "missed": [],
        "reads": len(whole),
        "max_d_prob": 0.0,
        "max_d_logprob": 0.0,
        "max_abs_shift": 0.0,
        "max_d_logprob_unshifted": 0.0,
        "max_d_off_menu": 0.0,
        "max_d_off_menu_4096": max(
            abs(r["whole_vocabulary"]["off_menu"] - row["off_menu"])
            for r in results
            for row in r["k"][4096]["reads"]
            if not row["missed"]
        )
        if any(not row["missed"] for r in results for row in r["k"][4096]["reads"])
        else None,
        "max_run_to_run": None,
        "median_bytes": statistics.median(w["bytes"] for w in whole),
        "median_wall_ms": _median_by_mode(results, "wall_ms", None),
        "median_server_ms": _median_by_mode(results, "server_ms", None),
        "median_parse_ms": statistics.median(w["parse_ms"] for w in whole),
        "max_abs_mass_minus_1": max(abs(w["mass_minus_1"]) for w in whole),
    }
    return table


def escalation_path(first: int, needed: int, vocab: int) -> list[int]:
    """The K of each read the SDK makes for a prompt whose candidates need ``needed``, when
    ``first`` is the first read: the SDK's own escalation (`next_top_k`) after each miss."""
    path = [first]
    while path[-1] < needed:
        path.append(next_top_k(path[-1], vocab))
    return path


#: The SDK's default first read: by the question's number of options.
BY_MENU = "32 per option"


def simulate(
    results: list[dict[str, Any]], table: dict[str, Any], vocab: int
) -> list[dict[str, Any]]:
    """What each first K costs under the SDK's escalation rule, from each prompt's measured
    needed K (the largest candidate rank in its whole-vocabulary read). Read times of a K not
    measured are interpolated (linear in K) between the measured medians, cache on."""
    measured: list[tuple[int, float]] = sorted(
        (int(k), float(row["median_wall_ms"]["cache"])) for k, row in table.items()
    )
    per_entry = table["4096"]["median_bytes"] / 4096

    def wall_ms(k: int) -> float:
        for (k0, t0), (k1, t1) in itertools.pairwise(measured):
            if k0 <= k <= k1:
                return t0 + (t1 - t0) * (k - k0) / (k1 - k0)
        return measured[0][1]

    sdk = tv.LlamaCppConfig(base_url="http://unused")
    rows = []
    for first in (*SMALL_KS, vocab, BY_MENU):
        for subset, keep in (("all", lambda r: True), ("demo", lambda r: r["options"] <= 4)):
            chosen = [r for r in results if keep(r)]
            paths = [
                escalation_path(
                    sdk.first_top_k(r["options"]) if first == BY_MENU else int(first),
                    r["needed_k"],
                    vocab,
                )
                for r in chosen
            ]
            rows.append(
                {
                    "first_k": first,
                    "questions": subset,
                    "pairs": len(chosen),
                    "escalated": sum(len(p) > 1 for p in paths),
                    "mean_reads": statistics.fmean(len(p) for p in paths),
                    "max_reads": max(len(p) for p in paths),
                    "mean_kb": statistics.fmean(sum(p) * per_entry / 1e3 for p in paths),
                    "mean_ms_cached": statistics.fmean(sum(map(wall_ms, p)) for p in paths),
                }
            )
    return rows


def fmt(value: float | None, spec: str = ".1e") -> str:
    return "-" if value is None else format(value, spec)


def _size(size: float) -> str:
    return f"{size / 1e6:.1f} MB" if size > 1e6 else f"{size / 1e3:.1f} KB"


def report(
    table: dict[str, Any],
    results: list[dict[str, Any]],
    simulation: list[dict[str, Any]],
    vocab: int,
    repeats: int,
) -> None:
    prompts = len(results) // 2
    print(
        f"\n{prompts} prompts x 2 cache modes = {len(results)} pairs; each K < {vocab:,} read "
        f"{repeats} times (interleaved), the whole vocabulary once per pair"
    )
    print(
        "| K | pairs missing a candidate | max abs d answer prob | max abs d logprob "
        "| ... after common shift | max abs d off-menu vs whole | ... vs K=4096 | run-to-run "
        "| median body | median read, no cache / cache | median server, no cache / cache |"
    )
    print("|" + " --- |" * 11)
    for key, row in table.items():
        wall, server = row["median_wall_ms"], row["median_server_ms"]
        print(
            f"| {int(key):,} | {row['prompts_missed']} of {len(results)} "
            f"| {fmt(row['max_d_prob'])} | {fmt(row['max_d_logprob'])} "
            f"| {fmt(row['max_d_logprob_unshifted'])} | {fmt(row['max_d_off_menu'])} "
            f"| {fmt(row['max_d_off_menu_4096'])} | {fmt(row['max_run_to_run'])} "
            f"| {_size(row['median_bytes'])} "
            f"| {wall['nocache']:.0f} / {wall['cache']:.0f} ms "
            f"| {server['nocache']:.0f} / {server['cache']:.0f} ms |"
        )
    whole = table[str(vocab)]
    print(
        f"\nwhole vocabulary: stdlib json.loads median {whole['median_parse_ms']:.0f} ms; "
        f"its {vocab:,} probabilities sum to 1 within {whole['max_abs_mass_minus_1']:.1e}"
    )
    offs = [r["whole_vocabulary"]["off_menu"] for r in results]
    print(f"off-menu mass (whole vocabulary): min {min(offs):.3f}, max {max(offs):.3f}")
    shifts = [
        abs(row["shift"])
        for r in results
        for c in r["k"].values()
        for row in c["reads"]
        if "shift" in row
    ]
    print(
        f"common shift (top-K minus whole-vocabulary logprob): nonzero on "
        f"{sum(x > 0 for x in shifts)} of {len(shifts)} complete reads, largest {max(shifts):.1e}"
    )

    def seen(key: str, cache: bool) -> list[int]:
        return sorted(
            {row[key] for r in results if r["cache"] is cache for c in r["k"].values()
             for row in c["reads"]}
        )  # fmt: skip

    print(
        f"tokens evaluated per measured read, cache on: {seen('prompt_n', True)}; "
        f"cached tokens per read, cache off: {seen('cache_n', False)}"
    )
    inconsistent = [
        r["name"]
        for r in results
        for k, c in r["k"].items()
        for row in c["reads"]
        if bool(row["missed"]) != (r["needed_k"] > k)
    ]
    print(
        f"reads whose candidates' presence disagrees with their whole-vocabulary ranks: "
        f"{len(inconsistent)}"
    )

    print("\nthe smallest K that holds every candidate (largest rank in the whole vocabulary):")
    print("| options | pairs | median | max | which is largest |")
    print("| --- | --- | --- | --- | --- |")
    for options in sorted({r["options"] for r in results}):
        group = [r for r in results if r["options"] == options]
        needed = [r["needed_k"] for r in group]
        worst = max(group, key=lambda r: r["needed_k"])
        print(
            f"| {options} | {len(group)} | {statistics.median(needed):,.0f} | {max(needed):,} "
            f"| {worst['name']}/{'cache' if worst['cache'] else 'nocache'} |"
        )

    report_first_read(simulation)

    def passes(row: dict[str, Any]) -> bool:
        return row["prompts_missed"] == 0 and (row["max_d_prob"] or 0.0) <= EQUAL

    keys = [int(key) for key in table]
    smallest = next(k for k in keys if passes(table[str(k)]))
    print(
        f"\nsmallest K with no candidate missed and every answer within {EQUAL:g} of the "
        f"whole-vocabulary read: {smallest:,}"
    )
    if keys.index(smallest) > 0:
        below_k = keys[keys.index(smallest) - 1]
        below = table[str(below_k)]
        print(
            f"the next smaller K, {below_k:,}: missed a candidate on {below['prompts_missed']} "
            f"pairs ({', '.join(below['missed'])}); where every candidate was present, "
            f"max abs d answer prob {fmt(below['max_d_prob'])}"
        )
    complete = [row["max_d_prob"] for row in table.values() if row["max_d_prob"] is not None]
    print(
        f"at every K, where every candidate was present: max abs d answer prob "
        f"{max(complete):.1e} (EQUAL = {EQUAL:g}: {'yes' if max(complete) <= EQUAL else 'NO'})"
    )
    for key, row in table.items():
        if row["missed"]:
            print(f"K={int(key):,} missed: {', '.join(row['missed'])}")


def report_first_read(simulation: list[dict[str, Any]]) -> None:
    print(
        "\nthe first read under the SDK's rule (miss: read again at x32, at least 4,096, "
        "capped at the vocabulary); 'demo' = the demo's three questions (2-4 options):"
    )
    print(
        "| first K | questions | pairs escalated | mean reads | max reads | mean body per "
        "question | mean read time per question, cache on (interpolated) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in simulation:
        first = row["first_k"]
        shown = first if isinstance(first, str) else format(first, ",")
        print(
            f"| {shown} | {row['questions']} | {row['escalated']} of {row['pairs']} "
            f"| {row['mean_reads']:.2f} | {row['max_reads']} | {row['mean_kb']:.0f} KB "
            f"| {row['mean_ms_cached']:.0f} ms |"
        )


def recompute_first_read(path: Path) -> None:
    """The first-read simulation again, from a results file's measured ranks and timings."""
    document = json.loads(path.read_text())
    simulation = simulate(document["per_prompt"], document["summary"], document["vocabulary"])
    report_first_read(simulation)
    document["first_read"] = simulation
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path}")


def run(url: str, repeats: int, out: Path | None) -> None:
    started = time.monotonic()
    prompts, vocab = anyio.run(build_prompts, url)
    print(
        f"{len(prompts)} prompts, vocabulary {vocab:,}; options per question: "
        f"{sorted({p['options'] for p in prompts})}"
    )
    results = []
    for n, item in enumerate(prompts):
        for cache in (False, True):
            results.append(measure_one(url, item, vocab, cache=cache, repeats=repeats))
        done = results[-2:]
        print(
            f"  [{n + 1}/{len(prompts)}] {item['name']:14} options {item['options']:2}  "
            f"off-menu {done[0]['whole_vocabulary']['off_menu']:.3f}/"
            f"{done[1]['whole_vocabulary']['off_menu']:.3f}  "
            f"missed at K=16: {sum(r['k'][16]['reads'][0]['missed'] for r in done)}  "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    table = summarise(results, vocab)
    simulation = simulate(results, table, vocab)
    report(table, results, simulation, vocab, repeats)
    elapsed = time.monotonic() - started
    print(f"\nrun time: {elapsed:.0f} s")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "script": "benchmarks/real_answers/measure_top_k.py",
            "python": platform.python_version(),
            "prompts": len(prompts),
            "repeats": repeats,
            "vocabulary": vocab,
            "run_seconds": round(elapsed),
            "summary": table,
            "first_read": simulation,
            "per_prompt": [
                {
                    "name": r["name"],
                    "options": r["options"],
                    "cache": r["cache"],
                    "whole_vocabulary_off_menu": r["whole_vocabulary"]["off_menu"],
                    "ranks": r["ranks"],
                    "needed_k": r["needed_k"],
                    "k": {
                        str(k): {
                            "missed": max(row["missed"] for row in c["reads"]),
                            "d_prob": max(
                                (row["d_prob"] for row in c["reads"] if "d_prob" in row),
                                default=None,
                            ),
                            "shift": c["reads"][0].get("shift"),
                            "d_off_menu": max(
                                (row["d_off_menu"] for row in c["reads"] if "d_off_menu" in row),
                                default=None,
                            ),
                            "run_to_run": c["run_to_run"],
                        }
                        for k, c in r["k"].items()
                    },
                }
                for r in results
            ],
        }
        out.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--url", help="a running llama.cpp server (default: start the embedded one)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="reads of each K below the vocabulary"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument(
        "--first-read-only",
        action="store_true",
        help="no reads: recompute the first-read table from --out's recorded ranks (after a "
        "change to the SDK's first-read or escalation rule) and write it back",
    )
    args = parser.parse_args()
    if args.first_read_only:
        recompute_first_read(args.out)
        return
    if args.url:
        run(args.url, args.repeats, args.out)
        return
    options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
    with tv.EmbeddedServer(options) as server:
        run(server.url, args.repeats, args.out)


if __name__ == "__main__":
    main()
