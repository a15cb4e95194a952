"""Load through ``judge_many`` over the real llama.cpp server: 10,000 questions at concurrency 64
(5,000 short records, a Noul and a three-label Choice each), clean and then through the fault
proxy with a fault drawn at random (seeded) for 5% of the responses. The full-size run, over
the real server (Gemma 3 270M, 4 slots, as the live tests start it), of what
``tests/live/test_load_live.py`` proves over a replaying upstream; it runs that test's passes
and checks (``clean_pass``, ``faulted_pass``, ``check_faulted``) at the SDK's default settings.

Over the real server two passes agree to ``SAME_ANSWER``, not bit for bit: llama.cpp's logits
move with batch composition and prompt-cache reuse (README, "Reproducibility": up to 0.060
measured; 0.066 and 0.075 in two 10,000-question runs). A faulted response leaking into an
answer is caught exactly instead (an answered record no unretryable fault hit).

About an hour on 2 cores at 5,000 records. Exits 1 if a check fails.

    python -m benchmarks.scale.bench_load [--records 5000] [--url URL]
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks._shared import run_on_gemma
from tests.live.test_load_live import (
    CONCURRENCY,
    FLAT_MEMORY_MIB,
    QUESTIONS,
    check_faulted,
    clean_pass,
    faulted_pass,
)

NAME = "bench_load"
SAME_ANSWER = 0.10


def problems_of(figures: dict[str, Any], questions: int) -> list[str]:
    """What a pass's figures show wrong (both passes)."""
    found = []
    if figures["lost"] or figures["duplicated"] or figures["out_of_order"]:
        found.append("records lost, duplicated or out of order")
    if figures["tasks_left"] or figures["fds_left"] > 0:
        found.append("tasks or file descriptors left")
    if figures["peak_reads_in_flight"] > CONCURRENCY:
        found.append("more reads in flight than the concurrency")
    if figures["rss_mib_end"] - figures["rss_mib_warm"] > FLAT_MEMORY_MIB:
        found.append("RSS grew after warm-up")
    clean_pass_wrong = figures["errors"] or figures["completion_requests"] != questions
    if figures["run"] == "clean" and clean_pass_wrong:
        found.append("errors, or not one read per question, in the clean pass")
    return found


async def run(url: str, records: int) -> dict[str, Any]:
    questions = records * len(QUESTIONS)
    clean = await clean_pass(url, records, {})
    faulted, faults = await faulted_pass(url, records, {})
    problems = problems_of(clean.figures, questions) + problems_of(faulted.figures, questions)
    try:
        check_faulted(faulted, clean, faults)
    except AssertionError as failed:
        problems.append(f"a faulted record's outcome: {failed}")
    difference = faulted.figures.get("largest_probability_difference_vs_clean")
    if difference is not None and difference > SAME_ANSWER:
        problems.append(f"an answer {difference:.3f} off the clean pass's")
    return {
        "server": "the embedded llama.cpp server (Gemma 3 270M, 4 slots)",
        "clean": clean.figures,
        "faulted": faulted.figures,
        "same_answer_bound": SAME_ANSWER,
        "problems": problems,
        "passed": not problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--url", help="a running llama.cpp server (default: the embedded one)")
    args = parser.parse_args()
    if args.records < 20:
        parser.error("--records must be at least 20 (memory is judged from a tenth of the way)")
    run_on_gemma(NAME, run, args.records, args.url)


if __name__ == "__main__":
    main()
