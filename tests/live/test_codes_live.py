"""255 options read exactly (issue 33 part 1): past the tokenizer's single-token controls, each
option gets a two-token code, and its probability is P(first) x P(second | first).

On each backend, the SDK's answer to a 255-option Choice is checked against the same product
computed here from independent reads made by raw HTTP, with the codes' tokens found here by
the server's own tokenizer:
- llama.cpp (reproducible mode: no prompt cache, one read at a time): reads of the top 4,096
  (the whole vocabulary where a code's token is not among them). The size of a read does not
  change an answer (its common shift cancels); the comparison against whole-vocabulary reads,
  26 MB each, is `benchmarks/real_answers/measure_codes.py`;
- vLLM: its logprobs API caps a top-K read at 128 entries (``--max-logprobs``), so the reads
  name their tokens (``logprob_token_ids`` on ``/v1/completions`` over the rendered chat's
  tokens): each value is still the token's full-vocabulary logprob.
Probabilities agree within 1e-6, sum to 1, the answer is their argmax, and the off-menu mass
is 1 minus the codes' summed joint probability (within 1e-4: the size of a llama.cpp read
shifts its normalising sum a little, `check_answer`).
"""

from __future__ import annotations

import json
import math
import urllib.request
from typing import Any

import pytest

import typevet_async as tv

from .faults import FaultInjectingProxy
from .helpers import InFlightCounter, png
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

LABELS = [f"label{index}" for index in range(255)]
QUESTION = tv.Choice(LABELS, instructions="Which label names the ticket's topic?")
STATE = {"ticket": "The parcel for order label17 arrived broken; the box was crushed."}
GEMMA_VOCABULARY = 262_144
#: The independent reads' size on llama.cpp: every code's token sits far above it here.
REFERENCE_TOP_K = 4096


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def product(
    codes: list[tuple[int, int]], first: dict[int, float], after: dict[int, dict[int, float]]
) -> tuple[list[float], float]:
    """Each code's probability among the codes, and the mass off them."""
    joint = [first[head] + after[head][second] for head, second in codes]
    top = max(joint)
    weights = [math.exp(value - top) for value in joint]
    total = math.fsum(weights)
    return [weight / total for weight in weights], 1.0 - math.fsum(map(math.exp, joint))


def check_answer(
    answer: tv.ChoiceAnswer,
    diagnostics: tv.Diagnostics,
    codes: list[tuple[int, int]],
    first: dict[int, float],
    after: dict[int, dict[int, float]],
) -> None:
    expected, off_menu = product(codes, first, after)
    probabilities = list(answer.probabilities.values())
    assert list(answer.probabilities) == LABELS
    assert max(abs(a - b) for a, b in zip(probabilities, expected, strict=True)) < 1e-6
    assert math.fsum(probabilities) == pytest.approx(1.0, abs=1e-9)
    assert answer.choice == LABELS[probabilities.index(max(probabilities))]
    assert diagnostics.off_menu_mass is not None
    # llama.cpp's normalising sum moves with the read's size (the SDK's top-K against this
    # test's): a shift common to one read's logprobs, which cancels in the probabilities but
    # not in the off-menu mass (up to 3.6e-5 between K=64 and K=4,096,
    # benchmarks/real_answers/measure_top_k.py; 1.1e-6 seen here against whole-vocabulary reads).
    assert diagnostics.off_menu_mass == pytest.approx(off_menu, abs=1e-4)
    assert diagnostics.reads >= 1 + len(after)  # one read, then one after each first token


#: What one read without the prompt cache of the ~2,000-token 255-option prompt may take on a
#: busy 2-core machine: about 5 s alone, up to 70 s seen at a load of 9.
SECONDS_PER_READ = 100


# The SDK's six reads, then six here, and 256 tokenizations (a few seconds).
@pytest.mark.timeout(SECONDS_PER_READ * 12)
async def test_255_options_on_llama_cpp_equal_the_product_of_independent_reads(
    gemma3_long_url: str,
) -> None:
    async with tv.Session.llama_cpp(gemma3_long_url, reproducible=True) as session:
        judgment = await session.judge(STATE, {"topic": QUESTION})
    answer, diagnostics = judgment["topic"], judgment.diagnostics["topic"]
    assert isinstance(answer, tv.ChoiceAnswer)
    prompt = diagnostics.prompt
    assert diagnostics.controls[:2] == ("0A", "0B")
    assert diagnostics.controls[-1] == "4u"
    # The codes' tokens, found here: the prompt tokenized with and without each code.
    base = post(gemma3_long_url, "/tokenize", {"content": prompt})["tokens"]
    codes: list[tuple[int, int]] = []
    for code in diagnostics.controls:
        tokens = post(gemma3_long_url, "/tokenize", {"content": prompt + code})["tokens"]
        assert tokens[: len(base)] == base, code
        assert len(tokens) == len(base) + 2, code
        codes.append((tokens[-2], tokens[-1]))
    assert diagnostics.codes == tuple(codes)
    firsts = list(dict.fromkeys(head for head, _ in codes))
    assert len(firsts) == 5  # 52 codes per digit: 0A..4u

    def independent(prompt_value: Any, wanted: set[int]) -> dict[int, float]:
        for top_k in (REFERENCE_TOP_K, GEMMA_VOCABULARY):
            body = {
                "prompt": prompt_value, "n_predict": 0, "n_probs": top_k,
                "cache_prompt": False, "post_sampling_probs": False,
            }  # fmt: skip
            entries = post(gemma3_long_url, "/completion", body)["completion_probabilities"][0]
            read = {entry["id"]: entry["logprob"] for entry in entries["top_logprobs"]}
            assert len(read) == top_k
            if wanted <= set(read):
                break
        assert wanted <= set(read)
        return read

    first = independent(prompt, set(firsts))
    after = {
        head: independent([prompt, head], {second for lead, second in codes if lead == head})
        for head in firsts
    }
    check_answer(answer, diagnostics, codes, first, after)


async def test_255_options_on_vllm_equal_the_product_of_independent_reads(vllm_url: str) -> None:
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID) as session:
        judgment = await session.judge(STATE, {"topic": QUESTION})
    answer, diagnostics = judgment["topic"], judgment.diagnostics["topic"]
    assert isinstance(answer, tv.ChoiceAnswer)
    messages = [{"role": "user", "content": diagnostics.prompt}]
    rendered = post(
        vllm_url,
        "/tokenize",
        {
            "model": VLLM_MODEL_ID, "messages": messages, "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )["tokens"]  # fmt: skip
    # The codes' tokens, found here: the rendered prompt with each code as the answer.
    codes: list[tuple[int, int]] = []
    for code in diagnostics.controls:
        continued = post(
            vllm_url,
            "/tokenize",
            {
                "model": VLLM_MODEL_ID,
                "messages": [*messages, {"role": "assistant", "content": code}],
                "continue_final_message": True, "add_generation_prompt": False,
                "chat_template_kwargs": {"enable_thinking": False},
            },
        )["tokens"]  # fmt: skip
        assert continued[: len(rendered)] == rendered
        assert len(continued) == len(rendered) + 2
        codes.append((continued[-2], continued[-1]))
    assert diagnostics.codes == tuple(codes)

    def named(prompt_tokens: list[int], token_ids: list[int]) -> dict[int, float]:
        body = {
            "model": VLLM_MODEL_ID, "prompt": prompt_tokens, "max_tokens": 1,
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 0,
            "logprob_token_ids": token_ids, "return_tokens_as_token_ids": True,
        }  # fmt: skip
        top = post(vllm_url, "/v1/completions", body)["choices"][0]["logprobs"]["top_logprobs"]
        read = {int(key.split(":")[1]): value for key, value in top[0].items()}
        assert set(token_ids) <= set(read)
        return read

    firsts = list(dict.fromkeys(head for head, _ in codes))
    first = named(rendered, firsts)
    after = {
        head: named([*rendered, head], [second for lead, second in codes if lead == head])
        for head in firsts
    }
    check_answer(answer, diagnostics, codes, first, after)


# Issue 43.1: a code's second read must end in its first token, and neither server's image
# prompt can (llama.cpp's multimodal prompt is a string; vLLM's token prompt carries no image).
# Before the fix llama.cpp's follow-up bodies dropped the first token, so each P(second | first)
# was read at the answer position. Neither test server has a vision model, so llama.cpp's
# /props is rewritten on its way back to declare vision (the fault proxy), as a vision server's
# would; vLLM declares nothing and lets a text-only model refuse images itself.
WIDE = tv.Choice([f"label{index}" for index in range(70)], instructions="Which label fits?")


async def test_codes_with_images_on_llama_cpp_are_refused_before_any_read(gemma3_url: str) -> None:
    async with FaultInjectingProxy(gemma3_url, path="/props") as proxy:
        proxy.script = ["vision_props"]
        async with tv.Session.llama_cpp(proxy.url) as session:
            assert (await session.probe()).vision
            with pytest.raises(tv.QuestionError, match="two-token codes") as refused:
                await session.judge(STATE, {"fine": tv.Noul("Fine?"), "route": WIDE},
                                    images=[png()])  # fmt: skip
            sent_before = proxy.paths.count("/completion")
            judged = await session.judge(STATE, {"route": WIDE})  # without images: read
    assert refused.value.question_id == "route"
    assert sent_before == 0  # not even the other question's read
    assert judged.diagnostics["route"].reads >= 2  # the first read, then one after it at least


async def test_codes_with_images_on_vllm_are_refused_before_any_read(vllm_url: str) -> None:
    chats, tokens = InFlightCounter("/v1/chat/completions"), InFlightCounter("/v1/completions")
    async with tv.Session.vllm(
        vllm_url,
        model=VLLM_MODEL_ID,
        http=tv.HttpSettings(trace_configs=[chats.config, tokens.config]),
    ) as session:
        with pytest.raises(tv.QuestionError, match="two-token codes") as refused:
            await session.judge(STATE, {"route": WIDE}, images=[png()])
    assert refused.value.question_id == "route"
    assert chats.started == tokens.started == 0
