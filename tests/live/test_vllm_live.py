"""Judgments against a real vLLM server (CPU) serving the same model, dequantised to fp32."""

from __future__ import annotations

import math

import pytest

import typevet_async as tv
from typevet_async._backends.vllm import AsyncVllm
from typevet_async._core.readings import softmax
from typevet_async._core.scoring import ScoringRequest

from .conftest import InFlightCounter, vllm_candidate_read
from .servers import VLLM_MODEL_ID
from .test_llama_cpp_live import TICKET, assert_exact_softmax, questions

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: Largest gap in candidate probability between the two backends for the same judgments,
#: measured on this model (benchmarks/measure_vllm.py: median 0.027, largest 0.055 over 24
#: answers; see the README): the GGUF is Q4_K_M, and
#: llama.cpp multiplies Q4 weights by Q8-quantised activations, while vLLM runs the same
#: weights dequantised to fp32 in fp32. The agreement bound is twice the largest gap seen.
CROSS_BACKEND_TOLERANCE = 0.10


def vllm_session(url: str, **settings: object) -> tv.Session:
    return tv.Session.vllm(url, model=VLLM_MODEL_ID, **settings)  # type: ignore[arg-type]


async def test_all_three_types(vllm_url: str) -> None:
    async with vllm_session(vllm_url, max_concurrency=4) as session:
        judgment = await session.judge(TICKET, questions())
        probe = await session.probe()
    assert probe.family is tv.TemplateFamily.GEMMA3  # rendered through the server's /tokenize
    assert probe.max_candidates == 128
    assert list(judgment) == ["refund", "route", "urgency"]
    assert isinstance(judgment["refund"], tv.NoulAnswer)
    assert isinstance(judgment["route"], tv.ChoiceAnswer)
    assert isinstance(judgment["urgency"], tv.ScoreAnswer)
    assert_exact_softmax(judgment)
    for question_id in judgment:
        diagnostics = judgment.diagnostics[question_id]
        assert diagnostics.prompt.startswith(TICKET + "\n\nQuestion: ")  # plain user content
        assert "<start_of_turn>" not in diagnostics.prompt
        assert diagnostics.token_ids[:2] == (236771, 236770)
        assert diagnostics.off_menu_mass is not None
        total = sum(math.exp(lp) for lp in diagnostics.logprobs)
        assert diagnostics.off_menu_mass == pytest.approx(1.0 - total, abs=1e-12)
    assert judgment.usage.prompt_tokens > 3 * 20


async def test_logprobs_equal_a_direct_read_of_the_same_messages(vllm_url: str) -> None:
    # Same conditions: one request at a time, and each prompt read once before either side
    # reads it, so both the SDK and the direct read meet the same prefix-cache state.
    async with vllm_session(vllm_url, max_concurrency=1) as session:
        warm = await session.judge({"ticket": TICKET}, questions())
        for diagnostics in warm.diagnostics.values():
            vllm_candidate_read(vllm_url, diagnostics.prompt, diagnostics.token_ids)
        judgment = await session.judge({"ticket": TICKET}, questions())
    for question_id in judgment:
        diagnostics = judgment.diagnostics[question_id]
        direct = vllm_candidate_read(vllm_url, diagnostics.prompt, diagnostics.token_ids)
        expected = [direct[token_id] for token_id in diagnostics.token_ids]
        assert diagnostics.logprobs == pytest.approx(expected, abs=1e-6)
        assert judgment[question_id].probabilities.values() == pytest.approx(
            softmax(expected), abs=1e-6
        )
        assert diagnostics.off_menu_mass == pytest.approx(
            1.0 - sum(math.exp(lp) for lp in expected), abs=1e-6
        )


async def test_logprobs_are_full_vocabulary_so_off_menu_mass_is_exact(vllm_url: str) -> None:
    # An independent read of the natural top 128: with raw_logprobs these are log-softmax
    # values over the whole vocabulary, so they sum to at most 1, and a candidate that is
    # among them has the value the SDK read.
    async with vllm_session(vllm_url, max_concurrency=1) as session:
        judgment = await session.judge(TICKET, {"route": questions()["route"]})
    diagnostics = judgment.diagnostics["route"]
    top = vllm_candidate_read(vllm_url, diagnostics.prompt, (), top_logprobs=128)
    assert sum(math.exp(lp) for lp in top.values()) <= 1.0 + 1e-5
    assert max(top.values()) <= 0.0
    shared = [t for t in diagnostics.token_ids if t in top]
    assert shared, "the digits should be among the top 128 on this prompt"
    for token_id in shared:
        index = diagnostics.token_ids.index(token_id)
        assert diagnostics.logprobs[index] == pytest.approx(top[token_id], abs=1e-4)


async def test_more_than_128_candidates_fail_before_any_request(vllm_url: str) -> None:
    counter = InFlightCounter("/v1/chat/completions")
    async with vllm_session(vllm_url, trace_configs=[counter.config]) as session:
        backend = session.backend
        assert isinstance(backend, AsyncVllm)
        request = ScoringRequest("big", tv.Noul(instructions="x"), (), "p", (), tuple(range(129)))
        with pytest.raises(
            tv.InvalidInputError, match="129 candidates, but vLLM reads at most 128"
        ):
            await backend.read(request, 0)
    assert counter.started == 0


async def test_model_id_mismatch_fails_before_any_request(vllm_url: str) -> None:
    counter = InFlightCounter("/v1/chat/completions")
    async with vllm_session(vllm_url, trace_configs=[counter.config]) as session:
        with pytest.raises(tv.ConfigurationError, match="pinned to model 'gemma3-270m'"):
            await session.judge(TICKET, questions(), model="gemma-4-e4b")
        with pytest.raises(tv.ConfigurationError, match="pinned"):
            await session.generate("x", schema={"type": "string"}, model="gemma-4-e4b")
    async with tv.Session.vllm(
        vllm_url, model="not-served", trace_configs=[counter.config]
    ) as session:
        with pytest.raises(tv.ConfigurationError, match="serves \\['gemma3-270m'\\]"):
            await session.judge(TICKET, questions())
    assert counter.started == 0


async def test_logits_mode_reports_unknown_off_menu_mass(vllm_url: str) -> None:
    # The server runs raw_logprobs; a session told the server returns logits must not claim
    # an off-menu mass, while its probabilities stay the softmax of what was read.
    async with vllm_session(vllm_url, logprobs_mode="raw_logits") as session:
        judgment = await session.judge(TICKET, questions())
    for question_id in judgment:
        assert judgment.diagnostics[question_id].off_menu_mass is None
    assert_exact_softmax(judgment)


async def test_backends_agree(gemma3_url: str, vllm_url: str) -> None:
    """The same model on both servers (Q4_K_M on llama.cpp, dequantised fp32 on vLLM)."""
    states = [
        TICKET,
        "My parcel has been stuck in transit for three weeks. Where is it?",
        "The app crashes every time I open the settings page on Android.",
        {"subject": "Invoice", "body": "Please send a VAT invoice for order 1182."},
    ]
    gaps: list[float] = []
    async with (
        tv.Session.llama_cpp(gemma3_url, reproducible=True) as llama,
        vllm_session(vllm_url, max_concurrency=1) as vllm,
    ):
        for state in states:
            on_llama = await llama.judge(state, questions())
            on_vllm = await vllm.judge(state, questions())
            for question_id in on_llama:
                a = list(on_llama[question_id].probabilities.values())
                b = list(on_vllm[question_id].probabilities.values())
                gaps.append(max(abs(x - y) for x, y in zip(a, b, strict=True)))
                # Same prompt tokens on both sides: the server's template equals our framing.
                assert on_llama.diagnostics[question_id].token_ids == (
                    on_vllm.diagnostics[question_id].token_ids
                )
            assert on_llama.usage.prompt_tokens == on_vllm.usage.prompt_tokens
    print(f"cross-backend largest probability gap over {len(gaps)} answers: {max(gaps):.4f}")
    assert max(gaps) <= CROSS_BACKEND_TOLERANCE
