"""Where the default framing's accuracy goes: one change at a time, on the real model.

The study behind the default field block (``typevet_async._core.prompts.fields``): each variant is a
user message in the model's own ChatML turn (its default system message), read exactly with
raw ``POST /completion`` reads (`benchmarks.real_answers._plain_reader.PlainReader`), over the
shipped labelled set's three questions. Every variant changes one thing against its neighbour:

- ``before``: the SDK's field block until this study: ``Question: <instructions>``, option
  lines ``0 = billing: ...``, "Reply with the one digit of the option that fits best.";
- ``before-letters``: the same with letters ``A = billing: ...``;
- ``before-letters-dot``: and ``A. billing: ...``;
- ``plain``: and no ``Question:`` prefix, "Answer with one letter." (the SDK's default now, and
  the prompt a user writes by hand);
- ``plain-question-prefix``: ``plain`` with ``Question:`` put back;
- ``plain-rule-fits``: ``plain`` with "Answer with the one letter of the option that fits
  best.";
- ``plain-digits``: ``plain`` with digits ("Answer with one digit.");
- ``words-for-noul``: ``plain``, except that a Noul asks "Answer Yes or No." and reads the
  tokens ``Yes`` / ``No``, and a Score reads digits;
- ``plain-no-system``: ``plain`` without the system turn (the template's default system
  message left out);
- ``plain-instructions-first``: ``plain`` with the question block before the ticket.

Thinking-off prefill is not a variant: Qwen2.5 Coder has no thinking mode (its template has no
``<think>`` block to close), so there is nothing to switch off at the answer position.

    python -m benchmarks.real_answers.measure_framing [--every 5]
        [--variant plain --variant before ...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import numpy as np

import typevet_async as tv
from benchmarks._shared import markdown_table, write_results
from benchmarks.real_answers._plain_reader import (
    PLAIN_SYSTEM,
    PlainReader,
    served_vocabulary,
    softmax,
)
from benchmarks.real_answers.bench_real_model import MODEL, gold_index, load_set

NAME = "measure_framing"
LETTERS = tuple("ABCDEFGHIJ")
DIGITS = tuple("0123456789")
#: A variant: (question, state) -> (user message, the answer tokens in option order).
Variant = Callable[[tv.Question, str], tuple[str, Sequence[str]]]


def option_text(question: tv.Question, option: tv.Option) -> str:
    label: str = option.label
    if isinstance(question, tv.Noul):
        return "Yes" if label == "true" else "No"
    if isinstance(question, tv.Score):
        return option.description or label
    return f"{label}: {option.description}" if option.description else label


def block(
    question: tv.Question,
    state: str,
    controls: Sequence[str],
    *,
    prefix: str,
    separator: str,
    rule: str,
    state_first: bool = True,
) -> tuple[str, Sequence[str]]:
    options = question.options()
    lines = [f"{prefix}{question.instructions}"]
    lines += [
        f"{control}{separator}{option_text(question, option)}"
        for control, option in zip(controls, options, strict=False)
    ]
    lines.append(rule)
    asked = "\n".join(lines)
    user = f"{state}\n\n{asked}" if state_first else f"{asked}\n\n{state}"
    return user, controls[: len(options)]


def _before_rule(question: tv.Question, kind: str) -> str:
    if isinstance(question, tv.Choice):
        return f"Reply with the one {kind} of the option that fits best."
    if isinstance(question, tv.Score):
        return f"Reply with the one {kind} of the level that fits best."
    return f"Reply with the one {kind} of your answer."


def _words_for_noul(question: tv.Question, state: str) -> tuple[str, Sequence[str]]:
    if isinstance(question, tv.Noul):
        return f"{state}\n\n{question.instructions}\nAnswer Yes or No.", ("No", "Yes")
    if isinstance(question, tv.Score):
        return block(
            question, state, DIGITS, prefix="", separator=". ", rule="Answer with one digit."
        )
    return block(
        question, state, LETTERS, prefix="", separator=". ", rule="Answer with one letter."
    )


PLAIN_RULE = "Answer with one letter."
VARIANTS: dict[str, Variant] = {
    "before": lambda q, s: block(
        q, s, DIGITS, prefix="Question: ", separator=" = ", rule=_before_rule(q, "digit")
    ),
    "before-letters": lambda q, s: block(
        q, s, LETTERS, prefix="Question: ", separator=" = ", rule=_before_rule(q, "letter")
    ),
    "before-letters-dot": lambda q, s: block(
        q, s, LETTERS, prefix="Question: ", separator=". ", rule=_before_rule(q, "letter")
    ),
    "plain": lambda q, s: block(q, s, LETTERS, prefix="", separator=". ", rule=PLAIN_RULE),
    "plain-question-prefix": lambda q, s: block(
        q, s, LETTERS, prefix="Question: ", separator=". ", rule=PLAIN_RULE
    ),
    "plain-rule-fits": lambda q, s: block(
        q,
        s,
        LETTERS,
        prefix="",
        separator=". ",
        rule="Answer with the one letter of the option that fits best.",
    ),
    "plain-digits": lambda q, s: block(
        q, s, DIGITS, prefix="", separator=". ", rule="Answer with one digit."
    ),
    "words-for-noul": _words_for_noul,
    "plain-no-system": lambda q, s: block(
        q, s, LETTERS, prefix="", separator=". ", rule=PLAIN_RULE
    ),
    "plain-instructions-first": lambda q, s: block(
        q, s, LETTERS, prefix="", separator=". ", rule=PLAIN_RULE, state_first=False
    ),
}
#: Variants read without the system turn.
NO_SYSTEM = frozenset({"plain-no-system"})


def chatml(user: str, *, system: bool = True) -> str:
    turn = f"<|im_start|>system\n{PLAIN_SYSTEM}<|im_end|>\n" if system else ""
    return f"{turn}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


async def measure(
    url: str,
    variant: Variant,
    tickets: Sequence[Mapping[str, Any]],
    questions: Mapping[str, tv.Question],
    slots: int,
    *,
    system: bool = True,
) -> dict[str, Any]:
    gate = asyncio.Semaphore(slots)
    async with aiohttp.ClientSession() as http:
        reader = PlainReader(url, http, await served_vocabulary(url, http))

        async def one(ticket: Mapping[str, Any], qid: str) -> tuple[float, float, bool]:
            question = questions[qid]
            user, answers = variant(question, ticket["state"])
            async with gate:
                logprobs, off = await reader.read(chatml(user, system=system), answers)
            p = softmax(logprobs)
            gold = gold_index(question, ticket["labels"][qid])
            return -float(np.log(max(p[gold], 1e-12))), off, int(np.argmax(p)) == gold

        figures: dict[str, Any] = {}
        for qid in questions:
            rows = await asyncio.gather(*(one(t, qid) for t in tickets))
            figures[qid] = {
                "accuracy": float(np.mean([right for _, _, right in rows])),
                "nll": float(np.mean([nll for nll, _, _ in rows])),
                "off_menu": float(np.mean([off for _, off, _ in rows])),
            }
    return figures


async def main_async(args: argparse.Namespace) -> None:
    tickets, questions = load_set(args.every)
    names = args.variant or list(VARIANTS)
    options = tv.ServerOptions(model=MODEL, n_ctx=8192, n_parallel=args.slots)
    results: dict[str, Any] = {}
    with tv.EmbeddedServer(options) as server:
        for name in names:
            began = time.monotonic()
            results[name] = await measure(
                server.url, VARIANTS[name], tickets, questions, args.slots,
                system=name not in NO_SYSTEM,
            )  # fmt: skip
            print(f"{name}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    rows = [
        [name]
        + [
            f"{results[name][qid]['accuracy']:.3f} / {results[name][qid]['nll']:.3f}"
            for qid in questions
        ]
        for name in names
    ]
    print(markdown_table(["variant", *(f"{qid}: accuracy / NLL" for qid in questions)], rows))
    write_results(NAME, {"model": MODEL, "tickets": len(tickets), "every": args.every,
                         "variants": results})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=5, help="every K-th ticket (default: 5)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    parser.add_argument("--slots", type=int, default=4)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
