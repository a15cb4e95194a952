"""The README's main job: judge a handful of support tickets on the embedded llama.cpp server.

The bundled model is Gemma 3 270M, a small *base* model: the answers show the SDK working end
to end (real logprobs, real probabilities), not accurate judgments.
"""

from __future__ import annotations

import time

import anyio

import typevet_async as tv

TICKETS = [
    "I was charged twice for my order and need a refund today.",
    "My parcel has been stuck in transit for three weeks. Where is it?",
    "The app crashes every time I open the settings page on Android.",
    "Thanks, the replacement arrived and works perfectly!",
    {"subject": "Invoice", "body": "Please send a VAT invoice for order 1182.", "plan": "pro"},
]

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "route": tv.Choice(
        {"billing": "Money matters", "shipping": "Parcels and delivery", "technical": "Bugs"},
        instructions="Which team should handle this?",
    ),
    "urgency": tv.Score(
        ["can wait", "this week", "today", "right now"], instructions="How urgent is this?"
    ),
}


def describe(answer: tv.Answer) -> str:
    if isinstance(answer, tv.NoulAnswer):
        return f"P(true)={answer.noul:.3f}"
    if isinstance(answer, tv.ChoiceAnswer):
        spread = " ".join(f"{k}={p:.2f}" for k, p in answer.probabilities.items())
        return f"{answer.choice!r} ({spread})"
    level = answer.legend[round(answer.score)]
    return f"{answer.score:.2f} ~ {level!r}"


async def run() -> None:
    print("Starting the embedded llama.cpp server (Gemma 3 270M, a small base model)...")
    started = time.monotonic()
    async with tv.Session.local(max_concurrency=4) as session:
        await session.probe()
        print(f"ready in {time.monotonic() - started:.1f} s\n")
        for ticket in TICKETS:
            judgment = await session.judge(ticket, QUESTIONS, timeout=60)
            print(f"ticket: {ticket}")
            for question_id, answer in judgment.items():
                off_menu = judgment.diagnostics[question_id].off_menu_mass
                print(
                    f"  {question_id:8} {describe(answer):60} "
                    f"confidence={answer.confidence:.3f} off-menu={off_menu:.3f}"
                )
            print(f"  usage: {judgment.usage}\n")
        last = tv.judgment_to_json(judgment).decode()
    print(f"The last judgment as JSON:\n{last[:400]}...")


def main() -> None:
    anyio.run(run)


if __name__ == "__main__":
    main()
