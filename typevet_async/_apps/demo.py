"""The README's main job: judge a handful of support tickets on the embedded llama.cpp server.

By default the model is Qwen2.5 Coder 1.5B Instruct (the ``qwen`` extra), a real instruction
model whose answers mean something. ``--model gemma3-270m`` takes the small base model the test
suite runs on: it shows the SDK working end to end (real logprobs, real probabilities), not
accurate judgments.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import Any

import anyio

import typevet_async as tv

DEFAULT_MODEL = "qwen2.5-coder-1.5b"

TICKETS: list[str | dict[str, str]] = [
    "I was charged twice for my order and need a refund today.",
    "My parcel has been stuck in transit for three weeks. Where is it?",
    "The app crashes every time I open the settings page on Android.",
    "Thanks, the replacement arrived and works perfectly!",
    {"subject": "Invoice", "body": "Please send a VAT invoice for order 1182.", "plan": "pro"},
]

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "route": tv.Choice(
        {
            "billing": "charges, invoices, payments, refunds",
            "shipping": "deliveries, parcels, tracking",
            "technical": "the app or the website not working",
        },
        instructions="Which team should handle this?",
    ),
    # A Score this model reads: how the customer feels (on SST-5, the same kind of scale, its
    # expected level has a Spearman of 0.78 with human labels). Urgency, asked here before, it
    # reads barely: no method measured beat the plain prompt's NLL of 0.953 on the shipped
    # tickets' three levels (chance: 1.099), and none separated these five (docs: Real answers).
    "mood": tv.Score(
        ["very unhappy", "unhappy", "neutral", "happy"],
        instructions="How does the customer feel?",
    ),
}


#: What the figures after each answer mean, printed once before the answers.
LEGEND = (
    "Each answer comes with its confidence (0: as unsure as an even spread over the options,\n"
    "1: certain) and its off-menu mass (the probability the model gave to tokens that are none\n"
    "of the options)."
)


def describe(answer: tv.Answer) -> str:
    if isinstance(answer, tv.NoulAnswer):
        return f"P(true)={answer.noul:.3f}"
    if isinstance(answer, tv.ChoiceAnswer):
        spread = " ".join(f"{k}={p:.2f}" for k, p in answer.probabilities.items())
        return f"{answer.choice!r} ({spread})"
    return f"{answer.score:.2f}, most likely {answer.legend[answer.level]!r}"


def ticket_text(ticket: str | Mapping[str, Any]) -> str:
    """A ticket as the model reads it: its text, or a structured ticket as JSON."""
    return ticket if isinstance(ticket, str) else json.dumps(ticket, ensure_ascii=False)


def judgment_lines(ticket: str | Mapping[str, Any], judgment: tv.Judgment) -> list[str]:
    """A ticket and its answers, one line each, and what the judgment read."""
    lines = [f"ticket: {ticket_text(ticket)}"]
    for question_id, answer in judgment.items():
        off_menu = judgment.diagnostics[question_id].off_menu_mass
        lines.append(
            f"  {question_id:8} {describe(answer):54} "
            f"confidence={answer.confidence:.2f} off-menu={off_menu:.2f}"
        )
    usage = judgment.usage
    lines.append(
        f"  {usage.reads} reads, {usage.prompt_tokens} prompt tokens "
        f"({usage.cached_tokens} of them cached)"
    )
    return lines


def _json(value: Any, indent: str = "") -> str:
    """Indented JSON whose innermost objects and lists stay on one line, numbers rounded."""
    if isinstance(value, float):
        return json.dumps(round(value, 4))
    if not isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    pairs = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    members = [
        (f"{json.dumps(key, ensure_ascii=False)}: " if key is not None else "", item)
        for key, item in pairs
    ]
    opening, closing = "{}" if isinstance(value, dict) else "[]"
    if not any(isinstance(item, dict | list) for _, item in members):  # innermost: one line
        return opening + ", ".join(name + _json(item) for name, item in members) + closing
    inner = indent + "  "
    lines = ",\n".join(f"{inner}{name}{_json(item, inner)}" for name, item in members)
    return f"{opening}\n{lines}\n{indent}{closing}"


def answers_json(judgment: tv.Judgment) -> str:
    """A judgment's answers and usage as `tv.judgment_to_json` writes them, whole and
    indented, numbers rounded for reading (the diagnostics, with the prompts, left out)."""
    written = json.loads(tv.judgment_to_json(judgment))
    return _json({key: written[key] for key in ("answers", "usage")})


async def run(model: str) -> None:
    print(f"Starting the embedded llama.cpp server ({tv.LOCAL_MODELS[model].title})...")
    started = time.monotonic()
    async with tv.Session.local(model, max_concurrency=4) as session:
        await session.probe()
        print(f"ready in {time.monotonic() - started:.1f} s\n")
        print(f"{LEGEND}\n")
        for ticket in TICKETS:
            judgment = await session.judge(ticket, QUESTIONS, timeout=120)
            print("\n".join(judgment_lines(ticket, judgment)) + "\n")
    print("The last judgment's answers as JSON (tv.judgment_to_json; numbers rounded here):")
    print(answers_json(judgment))
    print(f"\n{len(TICKETS)} tickets judged in {time.monotonic() - started:.1f} s in all.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="typevet-async-demo",
        description="Judge five support tickets with three typed questions on the embedded "
        "llama.cpp server.",
    )
    parser.add_argument(
        "--model",
        choices=sorted(tv.LOCAL_MODELS),
        default=DEFAULT_MODEL,
        help="the local model (default: %(default)s, a real instruction model; gemma3-270m: "
        "the small base model the test suite runs on, fast, answers near chance)",
    )
    anyio.run(run, parser.parse_args(argv).model)


if __name__ == "__main__":
    main()
