"""`Session.openai_compatible` against llama.cpp's own ``/v1/chat/completions`` (the embedded
server, Gemma 3 270M), directly and behind `OpenAIShapedProxy`, which makes it behave as other
OpenAI-compatible servers do (a ``top_logprobs`` cap of 20, refused ``chat_template_kwargs``,
no ``logprobs``, no ``/tokenize``) while every reply stays the real server's.

Answers are compared with `Session.llama_cpp` on the same server, under the same layout
(``fused``, ``split``: the server renders the same messages in its template for both), one
read at a time and under the same conditions: llama.cpp's chat endpoint always reuses its
prompt cache, which moves a read (measured here: up to 0.012 in probability on the Qwen model
against an uncached read of the same prompt), so each prompt is read once first and both
sessions then read it cached (`both_cached`). The tolerance, `TOLERANCE`, is read noise:
measured, the two agree to the last bit on the Qwen model and within 2.2e-5 on Gemma.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig

from .faults import OpenAIShapedProxy
from .helpers import TICKET, post_json, questions, ready_gateway
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: Read noise between two cached reads of one prompt through the two endpoints (module
#: docstring).
TOLERANCE = 1e-3
ROUTE = {"route": questions()["route"]}


def assert_same_answers(judged: tv.Judgment, reference: tv.Judgment) -> None:
    for question_id, answer in reference.answers.items():
        diagnostics = judged.diagnostics[question_id]
        assert not diagnostics.truncated, question_id
        assert diagnostics.clamped == 0
        assert diagnostics.token_ids == reference.diagnostics[question_id].token_ids
        got = list(judged[question_id].probabilities.values())
        want = list(answer.probabilities.values())
        assert got == pytest.approx(want, abs=TOLERANCE), question_id
        off_menu, expected = diagnostics.off_menu_mass, reference.diagnostics[question_id]
        assert off_menu is not None
        assert expected.off_menu_mass is not None
        assert off_menu == pytest.approx(expected.off_menu_mass, abs=TOLERANCE)


async def both_cached(
    generic: tv.Session, exact: tv.Session, state: str, asked: dict[str, tv.Question]
) -> tuple[tv.Judgment, tv.Judgment]:
    """The two sessions' answers under the same conditions: llama.cpp's chat endpoint always
    reuses its prompt cache, so the prompt is read once first (cached), then by each."""
    await generic.judge(state, asked)
    reference = await exact.judge(state, asked)
    return await generic.judge(state, asked), reference


async def generic_answers(url: str, **options: object) -> tv.Judgment:
    async with tv.Session.openai_compatible(
        f"{url}/v1", on_missing="exact", max_concurrency=1, **options
    ) as session:
        return await session.judge(TICKET, questions())


async def test_the_probe_learns_llama_cpps_chat_server(gemma3_url: str) -> None:
    async with tv.Session.openai_compatible(f"{gemma3_url}/v1") as session:
        probe = await session.probe()
    server = probe.chat_server
    assert server is not None
    assert (server.top_logprobs_cap, server.thinking_switch, server.tokenize) == (None, True, True)
    assert server.refused == ()
    assert {"A", "B", "C", "Yes", "No"} <= set(server.whole_controls)
    for control in ("A", " A", "Yes"):  # the controls' real ids, from the server's tokenizer
        tokens = post_json(gemma3_url, "/tokenize", {"content": control, "add_special": False})
        assert probe.control_ids[control] == tokens["tokens"][0]
    assert probe.model_ids
    assert probe.model_ids[0].endswith(".gguf")


@pytest.mark.parametrize("layout", ["fused", "split"])
async def test_answers_equal_the_llama_cpp_sessions(gemma3_url: str, layout: str) -> None:
    async with (
        tv.Session.llama_cpp(gemma3_url, layout=layout, max_concurrency=1) as exact,
        tv.Session.openai_compatible(
            f"{gemma3_url}/v1", layout=layout, on_missing="exact", max_concurrency=1
        ) as generic,
    ):
        judged, reference = await both_cached(generic, exact, TICKET, questions())
    assert_same_answers(judged, reference)
    # Read from the top 20, widened where an option was outside it (the base model puts
    # most of its mass off the menu).
    assert all(d.top_k >= 20 for d in judged.diagnostics.values())


async def test_a_server_capped_at_20_answers_under_clamp_flagged(gemma3_url: str) -> None:
    async with (
        OpenAIShapedProxy(gemma3_url, cap=20) as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1", max_concurrency=1) as session,
    ):
        probe = await session.probe()
        probed = len(proxy.chats)
        judgment = await session.judge(TICKET, ROUTE)
    server = probe.chat_server
    assert server is not None
    assert server.top_logprobs_cap == 20
    assert server.refused == ("top_logprobs above 20",)
    assert proxy.chats[0][1] == 400
    assert proxy.asked()[:2] == [4096, 20]
    assert proxy.asked()[probed:] == [20]  # one read, never above the cap
    diagnostics = judgment.diagnostics["route"]
    # On this model one of the route's letters is outside the top 20 (as read by
    # `test_exact_at_a_cap_of_20_names_it`): clamped to the lowest logprob returned.
    entries = json.loads(proxy.last_reply)["choices"][0]["logprobs"]["content"][0]
    floor = min(entry["logprob"] for entry in entries["top_logprobs"])
    assert len(entries["top_logprobs"]) == 20
    assert diagnostics.truncated
    assert diagnostics.clamped >= 1
    assert diagnostics.logprobs.count(floor) >= diagnostics.clamped
    assert diagnostics.off_menu_mass is None  # filled-in values are no measurement
    assert diagnostics.policy == "clamp"
    assert diagnostics.top_k == 20


async def test_exact_at_a_cap_of_20_names_it(gemma3_url: str) -> None:
    async with (
        OpenAIShapedProxy(gemma3_url, cap=20) as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1", on_missing="exact") as session,
    ):
        with pytest.raises(tv.CandidateMissingError, match="the server's cap of 20") as info:
            await session.judge(TICKET, ROUTE)
    assert info.value.question_id == "route"
    assert info.value.missing


async def test_exact_widens_up_to_the_cap(gemma3_url: str) -> None:
    await generic_answers(gemma3_url)  # cached, as every read below (`both_cached`)
    async with (
        OpenAIShapedProxy(gemma3_url, cap=700) as proxy,
        tv.Session.openai_compatible(
            f"{proxy.url}/v1", on_missing="exact", max_concurrency=1
        ) as session,
    ):
        probe = await session.probe()
        probed = len(proxy.chats)
        judgment = await session.judge(TICKET, ROUTE)
    assert probe.chat_server is not None
    assert probe.chat_server.top_logprobs_cap == 700
    assert proxy.asked()[probed:] == [20, 640]  # widened by 32, within the cap
    assert judgment.diagnostics["route"].top_k == 640
    uncapped = await generic_answers(gemma3_url)
    assert judgment["route"].probabilities == pytest.approx(
        uncapped["route"].probabilities, abs=TOLERANCE
    )


async def test_a_refusal_naming_no_limit_steps_the_window_down(gemma3_url: str) -> None:
    async with (
        OpenAIShapedProxy(gemma3_url, cap=20, name_limit=False) as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1") as session,
    ):
        probe = await session.probe()
    server = probe.chat_server
    assert server is not None
    # First taken for the thinking switch's refusal, then the window stepped down; the switch
    # is tried again at the window found, and kept.
    assert proxy.asked()[:8] == [4096, 4096, 1024, 256, 128, 64, 20, 20]
    assert ["chat_template_kwargs" in body for body, _ in proxy.chats[:3]] == [True, False, False]
    assert (server.top_logprobs_cap, server.thinking_switch) == (20, True)
    assert server.refused == ("top_logprobs above 20",)


async def test_a_server_refusing_chat_template_kwargs(gemma3_url: str) -> None:
    await generic_answers(gemma3_url)  # cached, as every read below (`both_cached`)
    async with (
        OpenAIShapedProxy(gemma3_url, refuse_kwargs=True) as proxy,
        tv.Session.openai_compatible(
            f"{proxy.url}/v1", on_missing="exact", max_concurrency=1
        ) as session,
    ):
        probe = await session.probe()
        probed = len(proxy.chats)
        judgment = await session.judge(TICKET, questions())
    assert probe.chat_server is not None
    assert not probe.chat_server.thinking_switch
    assert probe.chat_server.refused == ("chat_template_kwargs",)
    sent = proxy.chats[probed:]
    assert sent
    assert all("chat_template_kwargs" not in body for body, _ in sent)
    assert all(status == 200 for _, status in sent)
    direct = await generic_answers(gemma3_url)
    assert_same_answers(judgment, direct)  # Gemma's template has no thinking to turn off


async def test_a_server_without_logprobs_is_refused_before_any_question(gemma3_url: str) -> None:
    async with (
        OpenAIShapedProxy(gemma3_url, strip_logprobs=True) as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1") as session,
    ):
        with pytest.raises(tv.LogprobsUnavailableError, match="returns no logprobs"):
            await session.judge(TICKET, questions())
    assert len(proxy.chats) == 1  # the probe's read, and nothing after it


async def test_without_tokenize_the_controls_are_matched_by_text(gemma3_url: str) -> None:
    await generic_answers(gemma3_url)  # cached, as every read below (`both_cached`)
    async with (
        OpenAIShapedProxy(gemma3_url, no_tokenize=True) as proxy,
        tv.Session.openai_compatible(
            f"{proxy.url}/v1", on_missing="exact", max_concurrency=1
        ) as session,
    ):
        probe = await session.probe()
        judgment = await session.judge(TICKET, questions())
    assert probe.chat_server is not None
    assert not probe.chat_server.tokenize
    assert probe.chat_server.refused == ("/tokenize",)
    assert {"A", " A", "z", "Yes", "No"} <= set(probe.control_ids)
    assert "0" not in probe.control_ids  # digits: not one token in every vocabulary
    direct = await generic_answers(gemma3_url)
    for question_id, answer in direct.answers.items():
        got = list(judgment[question_id].probabilities.values())
        assert got == pytest.approx(list(answer.probabilities.values()), abs=TOLERANCE)


async def test_letters_that_never_come_back_whole_are_refused(gemma3_url: str) -> None:
    async with (
        OpenAIShapedProxy(gemma3_url, no_tokenize=True, mangle_texts=True) as proxy,
        tv.Session.openai_compatible(f"{proxy.url}/v1") as session,
    ):
        with pytest.raises(tv.ControlTokenError, match="single letter"):
            await session.judge(TICKET, questions())
    assert len(proxy.chats) == 2  # the probe's two reads


async def test_schema_bound_generation(gemma3_url: str) -> None:
    schema = {
        "type": "object",
        "properties": {"team": {"enum": ["billing", "shipping"]}},
        "required": ["team"],
        "additionalProperties": False,
    }
    async with tv.Session.openai_compatible(f"{gemma3_url}/v1") as session:
        generation = await session.generate(f"Route this ticket: {TICKET}", schema=schema)
    assert generation.value["team"] in ("billing", "shipping")


async def test_vllm_chat_completions_answer_as_the_vllm_session(vllm_url: str) -> None:
    """vLLM's ``/v1/chat/completions`` with ``top_logprobs`` (no ``logprob_token_ids``): its
    cap is its ``--max-logprobs`` (128 here), named in its refusal; where the window holds
    every option the answers are `Session.vllm`'s (the same server renders the same messages;
    the two reads of a prompt run the same fp32 forward pass)."""
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID, max_concurrency=1) as exact:
        reference = await exact.judge(TICKET, questions())
    async with tv.Session.openai_compatible(f"{vllm_url}/v1", max_concurrency=1) as session:
        probe = await session.probe()
        judged = await session.judge(TICKET, questions())
    server = probe.chat_server
    assert server is not None
    assert server.top_logprobs_cap == 128
    assert server.tokenize
    assert server.thinking_switch
    assert probe.model_ids == (VLLM_MODEL_ID,)
    whole = [q for q, d in judged.diagnostics.items() if not d.truncated]
    assert whole  # at least one question's options all in the top 128 (seen: every one)
    for question_id in whole:
        got = list(judged[question_id].probabilities.values())
        want = list(reference[question_id].probabilities.values())
        assert got == pytest.approx(want, abs=TOLERANCE), question_id


async def test_the_command_line_judges_through_it(gemma3_url: str) -> None:
    """``--backend openai_compatible`` (what ``judge``, ``batch``, ``serve`` and ``mcp`` take),
    the real command in a child process."""
    command = [
        sys.executable,
        "-m",
        "typevet_async._apps.cli",
        "judge",
        TICKET,
        "--choice",
        "route=Which team?:billing,shipping,technical",
        "--backend",
        "openai_compatible",
        "--base-url",
        f"{gemma3_url}/v1",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
    judged = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=300, check=True, env=env
    )
    answer = json.loads(judged.stdout)["answers"]["route"]
    assert answer["choice"] in ("billing", "shipping", "technical")
    assert sum(answer["probabilities"].values()) == pytest.approx(1.0)


#: (ticket, team): clear cases of the real model's measured set (test_real_model_live.py).
REAL_TICKETS = [
    (
        "I was charged twice for the same order this morning. Please refund the extra charge.",
        "billing",
    ),
    ("My parcel has been stuck in transit for three weeks. Where is it?", "shipping"),
    ("The app crashes every time I open the settings page on Android.", "technical"),
]
REAL_ROUTE = {
    "route": tv.Choice(
        {
            "billing": "charges, invoices, payments, refunds",
            "shipping": "deliveries, parcels, tracking",
            "technical": "the app or the website not working",
        },
        instructions="Which team should handle the ticket?",
    )
}


async def test_a_real_instruction_model_answers_exactly_from_the_top_20(
    real_model_url: str,
) -> None:
    """On a real instruction model (Qwen2.5 Coder 1.5B Instruct, its own ChatML template) the
    options are near the top: the default read (top 20, clamp) holds every one, so the answers
    are exact, known off-menu mass and all, and right; under the same layout they are
    `Session.llama_cpp`'s."""
    async with tv.Session.openai_compatible(f"{real_model_url}/v1", max_concurrency=1) as session:
        for ticket, team in REAL_TICKETS:
            judged = await session.judge(ticket, REAL_ROUTE)
            diagnostics = judged.diagnostics["route"]
            assert (diagnostics.top_k, diagnostics.reads, diagnostics.truncated) == (20, 1, False)
            assert diagnostics.off_menu_mass is not None
            assert diagnostics.off_menu_mass < 0.1  # measured: 0.025 to 0.053
            answer = judged["route"]
            assert isinstance(answer, tv.ChoiceAnswer)
            assert answer.choice == team, (ticket, answer.probabilities)
    async with (
        tv.Session.llama_cpp(real_model_url, layout="fused", max_concurrency=1) as exact,
        tv.Session.openai_compatible(
            f"{real_model_url}/v1", layout="fused", max_concurrency=1
        ) as generic,
    ):
        for ticket, _ in REAL_TICKETS:
            judged, reference = await both_cached(generic, exact, ticket, REAL_ROUTE)
            assert_same_answers(judged, reference)


async def test_llama_cpps_clamp_counts_what_it_filled_in(gemma3_url: str) -> None:
    """`Diagnostics.clamped` on the llama.cpp backend too: a top-2 read of a three-option
    question clamps at least one option."""
    async with tv.Session.llama_cpp(gemma3_url, on_missing="clamp", top_k=2) as session:
        judgment = await session.judge(TICKET, ROUTE)
    diagnostics = judgment.diagnostics["route"]
    assert diagnostics.truncated
    assert 1 <= diagnostics.clamped <= 3
    assert diagnostics.logprobs.count(min(diagnostics.logprobs)) >= diagnostics.clamped


async def test_a_fleet_of_endpoints(gemma3_url: str) -> None:
    """Two endpoints of one model (the server, and the same server through a pass-through
    proxy) as one session: each probed, the reads spread over both."""
    async with (
        OpenAIShapedProxy(gemma3_url) as proxy,
        tv.Session.openai_compatible(
            [f"{gemma3_url}/v1", f"{proxy.url}/v1"], max_concurrency=4
        ) as session,
    ):
        judgments = [await session.judge(f"{TICKET} ({n})", ROUTE) for n in range(4)]
    endpoints = {j.diagnostics["route"].endpoint for j in judgments}
    assert len(endpoints) == 2
    for judgment in judgments:
        assert sum(judgment["route"].probabilities.values()) == pytest.approx(1.0)


async def test_the_gateway_serves_in_front_of_it(gemma3_url: str) -> None:
    """``typevet-async serve``'s gateway over an OpenAI-compatible session: a System One
    client's judgment read through the server's ``/v1/chat/completions``."""
    key = "openai-compatible-gateway-key"
    async with (
        ready_gateway(
            tv.Session.openai_compatible(f"{gemma3_url}/v1"), GatewayConfig(keys=(key,))
        ) as url,
        tv.Session.system_one(url, http=tv.HttpSettings(api_key=key)) as client,
    ):
        judgment = await client.judge(TICKET, ROUTE)
    answer = judgment["route"]
    assert isinstance(answer, tv.ChoiceAnswer)
    assert sum(answer.probabilities.values()) == pytest.approx(1.0, abs=1e-6)


async def test_the_read_cache_keeps_its_reads(gemma3_url: str) -> None:
    async with tv.Session.openai_compatible(
        f"{gemma3_url}/v1", cache=tv.MemoryReadCache()
    ) as session:
        first = await session.judge(TICKET, ROUTE)
        again = await session.judge(TICKET, ROUTE)
    assert first.diagnostics["route"].cache == "miss"
    assert again.diagnostics["route"].cache == "hit"
    assert again["route"].probabilities == first["route"].probabilities
    assert again.diagnostics["route"].clamped == first.diagnostics["route"].clamped
