"""Controls read the way the model writes them, on real servers, beyond Gemma.

The Mistral-vocabulary model (scripts/build_mistral_model.py: random weights over Mistral 7B
Instruct v0.3's real SentencePiece vocabulary, ``add_space_prefix`` on, Mistral v0.3's template)
is the family a bare tokenization reads wrong: ``"0"`` alone is ``▁`` then ``0``, and the model
writes that ``▁`` first. Each test asks the served tokenizer, or mistral-common's own encoder,
outside the SDK and checks the SDK read the token the model would write, after the lead where
it needs one, and that every answer is exactly the softmax of an independent read there.

Also here: the frame renders what the template renders (whitespace, empty and multi-line
states, on Gemma, Qwen and Mistral templates), a template that requires alternating roles
refuses the ``split`` layout at the probe, and a turn marker that is an ordinary token (llama.cpp's
built-in ``monarch`` template on Gemma) is not native.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import typevet_async as tv

from .conftest import MISTRAL_MODEL_ID, _start
from .helpers import TICKET, assert_exact_softmax, post_json, softmax

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

#: Mistral v3's ids (mistral-common): "▁A" 1098, "▁B" 1133, "▁" 29473, "▁▁" 1027, "0" 29502.
SPACE, DOUBLE_SPACE, A, B, ZERO, ONE = 29473, 1027, 1098, 1133, 29502, 29508
VOCABULARY = 32_768
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "route": tv.Choice(
        {"billing": "charges", "shipping": "parcels", "technical": "the app"},
        instructions="Which team should handle this?",
    ),
}


def session(backend: tuple[str, str], **settings: Any) -> tv.Session:
    name, url = backend
    if name == "vllm":
        return tv.Session.vllm(url, model=MISTRAL_MODEL_ID, **settings)
    return tv.Session.llama_cpp(url, **settings)


def mistral_common_answer(answer: str) -> list[int]:
    """What Mistral's own encoder (the one its models were trained with) writes for an
    assistant answer after ``[/INST]``."""
    import mistral_common
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    data = Path(mistral_common.__file__).parent / "data"
    tokenizer = MistralTokenizer.from_file(str(data / "mistral_instruct_tokenizer_240323.model.v3"))
    return list(tokenizer.instruct_tokenizer.tokenizer.encode(answer, bos=False, eos=False))


def vllm_chat_tokens(url: str, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
    body = {"model": MISTRAL_MODEL_ID, "messages": messages, "add_generation_prompt": True}
    return list(post_json(url, "/tokenize", {**body, **extra})["tokens"])


def independent_read(
    backend: tuple[str, str], prompt: str, lead: tuple[int, ...], ids: tuple[int, ...]
) -> dict[int, float]:
    """The candidates' logprobs at the answer position after the lead, outside the SDK: on
    llama.cpp from a whole-vocabulary read of the text prompt and the lead's ids; on vLLM from
    the template's own rendering (``/tokenize``), the lead appended, on ``/v1/completions``."""
    name, url = backend
    if name == "llama_cpp":
        body = {"prompt": [prompt, *lead], "n_predict": 0, "n_probs": VOCABULARY,
                "cache_prompt": False}  # fmt: skip
        top = post_json(url, "/completion", body)["completion_probabilities"][0]["top_logprobs"]
        assert len(top) == VOCABULARY
        entries = {int(entry["id"]): float(entry["logprob"]) for entry in top}
        return {token: entries[token] for token in ids}
    tokens = vllm_chat_tokens(url, [{"role": "user", "content": prompt}])
    body = {
        "model": MISTRAL_MODEL_ID,
        "prompt": [*tokens, *lead],
        "max_tokens": 1,
        "logprobs": 0,
        "logprob_token_ids": list(ids),
        "return_tokens_as_token_ids": True,
    }
    position = post_json(url, "/v1/completions", body)["choices"][0]["logprobs"]["top_logprobs"][0]
    return {int(key.split(":", 1)[1]): float(value) for key, value in position.items()}


async def test_the_sentencepiece_prefix_family_reads_the_tokens_the_model_writes(
    mistral_backend: tuple[str, str],
) -> None:
    name, url = mistral_backend
    # The Noul lettered too (not in words, the default): its controls are the alphabet's.
    async with session(mistral_backend, noul_controls="letters") as letters, session(
        mistral_backend, controls="digits", noul_controls="letters"
    ) as digits:  # fmt: skip
        probe = await letters.probe()
        by_letter = await letters.judge(TICKET, QUESTIONS)
        by_digit = await digits.judge(TICKET, QUESTIONS)
    # Before, the probe refused this tokenizer: "0" alone is two tokens (a ControlTokenError).
    assert probe.family is tv.TemplateFamily.OTHER
    if name == "llama_cpp":
        # The ids Mistral's own encoder writes after [/INST]: "▁A" alone, "▁" then "0".
        assert mistral_common_answer("A") == [A]
        assert mistral_common_answer("0") == [SPACE, ZERO]
        assert (probe.control_ids["A"], probe.control_leads.get("A")) == (A, None)
        assert (probe.control_ids["0"], probe.control_leads["0"]) == (ZERO, (SPACE,))
    else:
        # The template answers " " + content and vLLM's tokenizer reads "[/INST] A" as
        # "▁", "▁A": the served rendering, asked outside the SDK, is what the probe found.
        user = [{"role": "user", "content": "typevet-probe"}]
        base = vllm_chat_tokens(url, user)
        for control, lead, token in (("A", SPACE, A), ("0", DOUBLE_SPACE, ZERO)):
            continued = vllm_chat_tokens(
                url, [*user, {"role": "assistant", "content": control}],
                add_generation_prompt=False, continue_final_message=True,
            )  # fmt: skip
            assert continued == [*base, lead, token]
            assert (probe.control_ids[control], probe.control_leads[control]) == (token, (lead,))
    for judgment, ids in ((by_letter, (A, B)), (by_digit, (ZERO, ONE))):
        assert_exact_softmax(judgment)
        refund = judgment.diagnostics["refund"]
        assert refund.token_ids == ids
        lead = probe.control_leads.get(refund.controls[0], ())
        for question_id, diagnostics in judgment.diagnostics.items():
            # llama.cpp's diagnostics hold the whole prefix; vLLM's the user content it sent.
            read = independent_read(
                mistral_backend, diagnostics.prompt, lead, diagnostics.token_ids
            )
            expected = softmax([read[token] for token in diagnostics.token_ids])
            assert tuple(judgment[question_id].probabilities.values()) == pytest.approx(
                expected, abs=1e-5
            )


async def test_a_template_that_requires_alternating_roles_refuses_the_split_layout(
    mistral_backend: tuple[str, str],
) -> None:
    async with session(mistral_backend, layout="split") as split:
        probe = await split.probe()
        with pytest.raises(tv.UnsupportedTemplateError, match=r"split layout .* alternating roles"):
            await split.judge(TICKET, QUESTIONS)
    assert probe.consecutive_user_turns is False
    async with session(mistral_backend, layout="fused") as fused:  # one user message: judged
        judgment = await fused.judge(TICKET, QUESTIONS)
    assert_exact_softmax(judgment)
    assert judgment.diagnostics["route"].token_ids[:2] == (A, B)


STATES = ["\n  a ticket with whitespace around it  \n", "", "line one\n\nline three\n\n"]


@pytest.mark.parametrize("family", ["gemma3", "qwen3", "mistral"])
async def test_the_frame_renders_what_the_template_renders(
    family: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(
        {"gemma3": "gemma3_url", "qwen3": "qwen_llama_url", "mistral": "mistral_llama_url"}[family]
    )
    question = {"refund": tv.Noul(instructions="Is a refund requested?")}
    async with tv.Session.llama_cpp(url) as sdk:
        probe = await sdk.probe()
        frame = probe.prompt_frame
        assert frame is not None
        assert frame.trim is (family == "gemma3")  # Gemma's template trims; these two do not
        for state in STATES:
            judgment = await sdk.judge(state, question)
            prompt = judgment.diagnostics["refund"].prompt
            content = f"{state}\n\nIs a refund requested?\nAnswer Yes or No."  # words: the default
            body = {"messages": [{"role": "user", "content": content}],
                    "add_generation_prompt": True,
                    "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
            rendered = post_json(url, "/apply-template", body)["prompt"]
            # The server adds BOS itself: its text is not part of the SDK's prefix.
            rendered = rendered.removeprefix("<s>")
            assert prompt == rendered, (family, state)


async def test_an_ordinary_token_as_turn_marker_is_not_native() -> None:
    # llama.cpp's built-in monarch template writes <s>user\n...</s>: on Gemma, <s> is one
    # ordinary token, so a state could forge a turn with it.
    server = _start(tv.ServerOptions(chat_template="monarch", n_ctx=1024, n_parallel=1), "monarch")
    url = next(server)
    try:
        async with tv.Session.llama_cpp(url) as sdk:
            probe = await sdk.probe()
            with pytest.raises(tv.UnsupportedTemplateError, match="degraded"):
                await sdk.judge(TICKET, QUESTIONS)
        assert probe.family is tv.TemplateFamily.DEGRADED
    finally:
        server.close()


async def test_qwen_controls_in_context_are_its_own_tokens(qwen_llama_url: str) -> None:
    async with tv.Session.llama_cpp(qwen_llama_url) as sdk:
        probe = await sdk.probe()
    assert probe.control_leads == {}
    assert [probe.control_ids[c] for c in "AB0"] == [32, 33, 15]
