"""Real answers: Qwen2.5 Coder 1.5B Instruct (the ``qwen`` extra's real instruction model) on the
embedded llama.cpp server, at the SDK's defaults.

Unlike every other live test, these assert what the model answers. The tickets below were
written for this test, each with one obvious team and an obvious refund verdict, and are not
in the shipped labelled set. The bars come from measurement (README, "Real answers"): see
each test for the figure measured and the margin left for the logprob noise of a busy server.
"""

from __future__ import annotations

import pytest

import typevet_async as tv

from .helpers import assert_exact_softmax, assert_same_read, whole_vocabulary_logprobs

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

ROUTE = tv.Choice(
    {
        "billing": "charges, invoices, payments, refunds",
        "shipping": "deliveries, parcels, tracking",
        "technical": "the app or the website not working",
    },
    instructions="Which team should handle the ticket?",
)
REFUND = tv.Noul(instructions="Does the customer ask for their money back?")

#: (ticket, team, asks for a refund)
TICKETS = [
    ("I was charged twice for the same order this morning. Please refund the extra charge.",
     "billing", True),
    ("Please send me a VAT invoice for my last payment, my accountant needs it.",
     "billing", False),
    ("My card was billed for a plan I never signed up for. I want that money back.",
     "billing", True),
    ("Why does my latest invoice show a late fee? I paid on time.", "billing", False),
    ("My parcel has been stuck in transit for three weeks. Where is it?", "shipping", False),
    ("The courier left my package at the wrong address and it is gone. Refund me please.",
     "shipping", True),
    ("Can you change the delivery address for the order that ships tomorrow?", "shipping",
     False),
    ("The tracking number you emailed me does not show any delivery updates.", "shipping",
     False),
    ("The app crashes every time I open the settings page on Android.", "technical", False),
    ("Your website shows a blank page after I press the login button, in every browser.",
     "technical", False),
    ("The app has not synced my data for a week, even after reinstalling it. Please fix it.",
     "technical", False),
    ("Every time I upload a photo the page shows error 500.", "technical", False),
]  # fmt: skip

#: Measured (2026-12-03, a busy 2-core machine): 12 of 12 routes and 12 of 12 refund verdicts
#: right at the defaults; the closest calls were a route at 0.57 (the courier's lost parcel:
#: shipping, billing 0.34) and a refund verdict at 0.416 (the VAT invoice). The bar leaves room
#: for one wrong answer per question. (A ticket asking a refund for a broken app went to
#: billing, 0.49 against technical's 0.23, and was dropped as ambiguous: billing's description
#: names refunds.)
MIN_RIGHT = 11
#: Measured: mean off-menu mass 0.040 (route) and 0.028 (refund) over these tickets; the bound
#: leaves room for a busier server.
MAX_MEAN_OFF_MENU = 0.10


async def test_the_real_model_answers_unambiguous_tickets_right(real_model_url: str) -> None:
    questions: dict[str, tv.Question] = {"route": ROUTE, "refund": REFUND}
    async with tv.Session.llama_cpp(real_model_url) as session:
        probe = await session.probe()
        judgments = [
            item.judgment
            async for item in session.judge_many([t for t, _, _ in TICKETS], questions)
        ]
    assert probe.family is tv.TemplateFamily.CHATML
    routes = [j.answers["route"] for j in judgments if j is not None]
    refunds = [j.answers["refund"] for j in judgments if j is not None]
    assert len(routes) == len(TICKETS)
    right_routes = sum(
        isinstance(a, tv.ChoiceAnswer) and a.choice == team
        for a, (_, team, _) in zip(routes, TICKETS, strict=True)
    )
    right_refunds = sum(
        isinstance(a, tv.NoulAnswer) and (a.noul > 0.5) == refund
        for a, (_, _, refund) in zip(refunds, TICKETS, strict=True)
    )
    masses = {
        qid: [j.diagnostics[qid].off_menu_mass or 0.0 for j in judgments if j is not None]
        for qid in questions
    }
    print(
        f"real model: routes {right_routes}/{len(TICKETS)}, refunds {right_refunds}/"
        f"{len(TICKETS)}, mean off-menu "
        + ", ".join(f"{qid} {sum(m) / len(m):.4f}" for qid, m in masses.items())
    )
    assert right_routes >= MIN_RIGHT, [a.choice for a in routes if isinstance(a, tv.ChoiceAnswer)]
    assert right_refunds >= MIN_RIGHT, [
        round(a.noul, 3) for a in refunds if isinstance(a, tv.NoulAnswer)
    ]
    for question_id in questions:
        masses = [j.diagnostics[question_id].off_menu_mass for j in judgments if j is not None]
        assert all(m is not None for m in masses)
        mean = sum(m for m in masses if m is not None) / len(masses)
        assert mean < MAX_MEAN_OFF_MENU, (question_id, mean)


async def test_real_answers_are_exact(real_model_url: str) -> None:
    """The answer is the softmax of the controls' logprobs, as an independent
    whole-vocabulary read of the same prompt gives them (prompt cache off)."""
    async with tv.Session.llama_cpp(real_model_url, reproducible=True) as session:
        judgment = await session.judge(TICKETS[0][0], {"route": ROUTE})
    diagnostics = judgment.diagnostics["route"]
    independent = whole_vocabulary_logprobs(real_model_url, diagnostics.prompt, cache_prompt=False)
    assert_same_read(diagnostics.logprobs, [independent[t] for t in diagnostics.token_ids])
    assert_exact_softmax(judgment)
    answer = judgment.answers["route"]
    assert isinstance(answer, tv.ChoiceAnswer)
    assert answer.choice == "billing"
