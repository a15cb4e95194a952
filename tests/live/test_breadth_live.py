"""Letters beyond ten options, Jev layouts, truncation policies, the off-menu guard, " A"
variants and image refusals, against both real servers."""

from __future__ import annotations

import pytest

import typevet_async as tv
from typevet_async._core.prompts.scoring import plan_question

from .helpers import (
    TICKET,
    InFlightCounter,
    assert_exact_softmax,
    assert_same_read,
    make_session,
    png,
    questions,
    top_logprobs,
    whole_vocabulary_logprobs,
)
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

FUSED_BYTES = (
    '{"evidence":"red green blue","criterion":"pick a colour","options":'
    '[{"letter":"A","description":"the colour red"},'
    '{"letter":"B","description":"the colour green"}]}'
)
COLOUR = tv.Choice(
    {"red": "the colour red", "green": "the colour green"}, instructions="pick a colour"
)
A_IDS = (236776, 562)  # "A" and " A" on Gemma's tokenizer


async def test_twenty_options_use_twenty_letters(backend: tuple[str, str]) -> None:
    labels = {f"team {n}": None for n in range(20)}
    exact = {"reproducible": True} if backend[0] == "llama_cpp" else {"max_concurrency": 1}
    async with make_session(backend, **exact) as session:
        judgment = await session.judge(TICKET, {"team": tv.Choice(labels, instructions="Who?")})
    diagnostics = judgment.diagnostics["team"]
    assert diagnostics.controls == tuple("ABCDEFGHIJKLMNOPQRST")
    assert "\nT. team 19\nAnswer with one letter." in diagnostics.prompt
    assert len(judgment["team"].probabilities) == 20
    assert_exact_softmax(judgment)
    if backend[0] == "llama_cpp":
        independent = whole_vocabulary_logprobs(backend[1], diagnostics.prompt, cache_prompt=False)
        expected = [independent[t] for t in diagnostics.token_ids]
        assert_same_read(diagnostics.logprobs, expected)


async def test_more_options_than_the_tokenizer_has_controls(backend: tuple[str, str]) -> None:
    # 62 single controls (0-9, A-Z, a-z: each one token on Gemma's), then two-token codes: there
    # are 520, so 521 options is one too many, refused before any request.
    labels = {f"l{n}": None for n in range(521)}
    async with make_session(backend) as session:
        refused = r"521 options, and a question takes at most 520 .* refused before any request"
        with pytest.raises(tv.TooManyOptionsError, match=refused):
            await session.judge(TICKET, {"big": tv.Choice(labels, instructions="Which?")})


async def test_fused_layout_sends_jev_bytes(backend: tuple[str, str]) -> None:
    async with make_session(backend, layout="fused") as session:
        judgment = await session.judge("red green blue", {"colour": COLOUR})
    prompt = judgment.diagnostics["colour"].prompt
    if backend[0] == "vllm":
        assert prompt == FUSED_BYTES  # the user content, byte for byte
    else:  # rendered through the served template, ending at the answer
        assert prompt == (
            f"<start_of_turn>user\n{tv.JEV_SYSTEM_PROMPT}\n\n{FUSED_BYTES}<end_of_turn>\n"
            "<start_of_turn>model\n"
        )
    assert judgment.diagnostics["colour"].controls == ("A", "B")
    assert_exact_softmax(judgment)


async def test_split_layout_shares_the_evidence_message(backend: tuple[str, str]) -> None:
    async with make_session(backend, layout="split") as session:
        judgment = await session.judge("red green blue", {"colour": COLOUR, "rude": tv.Noul(
            instructions="Is it rude?")})  # fmt: skip
    for question_id in judgment:
        prompt = judgment.diagnostics[question_id].prompt
        evidence = '{"evidence":"red green blue"}'
        if backend[0] == "vllm":
            assert prompt.startswith(evidence + '\n\n{"criterion":')
        else:
            assert prompt.startswith(f"<start_of_turn>user\n{tv.JEV_SYSTEM_PROMPT}\n\n{evidence}")
            assert prompt.endswith("<start_of_turn>model\n")
    rude = judgment.diagnostics["rude"].prompt
    assert (
        '"options":[{"letter":"A","description":"No"},{"letter":"B","description":"Yes"}]' in rude
    )
    assert_exact_softmax(judgment)


async def test_space_variants_count_as_the_same_letter(backend: tuple[str, str]) -> None:
    async with make_session(backend, layout="fused") as session:
        judgment = await session.judge("red green blue", {"colour": COLOUR})
    diagnostics = judgment.diagnostics["colour"]
    read = dict(diagnostics.candidates)
    assert set(A_IDS) <= set(read)
    chosen_a = diagnostics.token_ids[0]
    assert chosen_a in A_IDS
    assert read[chosen_a] == max(read[A_IDS[0]], read[A_IDS[1]])  # the more probable variant
    assert diagnostics.logprobs[0] == read[chosen_a]


async def test_truncation_policies_on_llama_cpp(gemma3_url: str) -> None:
    # Each clamped read is compared with an independent top-2 read of the same prompt under
    # the same conditions (no prompt cache, one read at a time). No content-free prior: its
    # reads would meet the policy first, and its division is not the read's softmax.
    async with tv.Session.llama_cpp(
        gemma3_url, on_missing="clamp", top_k=2, reproducible=True, content_free="off"
    ) as session:
        clamped = await session.judge(TICKET, questions())
    outside_top2: dict[str, set[int]] = {}
    for question_id, diagnostics in clamped.diagnostics.items():
        assert diagnostics.policy == "clamp"
        assert diagnostics.top_k == 2
        assert diagnostics.reads == 1
        top2 = top_logprobs(gemma3_url, diagnostics.prompt, 2, cache_prompt=False)
        floor = min(top2.values())
        missing = outside_top2[question_id] = set(diagnostics.token_ids) - set(top2)
        assert diagnostics.truncated == bool(missing)
        # Depends on this base model's token ranks: its two likeliest next tokens here are
        # not digits, so every question has an option filled in.
        assert missing
        for token, logprob in zip(diagnostics.token_ids, diagnostics.logprobs, strict=True):
            assert logprob == top2.get(token, floor)
    assert_exact_softmax(clamped)
    async with tv.Session.llama_cpp(
        gemma3_url, on_missing="error", top_k=2, reproducible=True, content_free="off"
    ) as session:
        with pytest.raises(tv.CandidateMissingError) as caught:
            await session.judge(TICKET, questions())
    assert caught.value.question_id == "refund"  # the first question, in question order
    assert set(caught.value.missing) == outside_top2["refund"]
    async with tv.Session.llama_cpp(gemma3_url) as session:
        exact = await session.judge(TICKET, questions())
    assert all(d.policy == "exact" and not d.truncated for d in exact.diagnostics.values())


async def test_truncation_never_fires_on_vllm(vllm_url: str) -> None:
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID) as session:
        judgment = await session.judge(TICKET, questions())
    assert all(d.policy == "exact" and not d.truncated for d in judgment.diagnostics.values())


async def test_off_menu_guard(backend: tuple[str, str]) -> None:
    # Depends on this base model: it puts about 0.95 of the next-token mass off the menu, so
    # every question is over a 0.5 threshold (checked below on the masses the reads reported).
    async with make_session(backend, off_menu_threshold=0.5) as session:
        flagged = await session.judge(TICKET, questions())
        unflagged = await session.judge(TICKET, questions(), off_menu_threshold=None)
        with pytest.raises(tv.OffMenuError) as caught:
            await session.judge(TICKET, questions(), raise_off_menu=True)
    for diagnostics in flagged.diagnostics.values():
        assert diagnostics.off_menu_mass is not None
        assert diagnostics.off_menu_mass > 0.5
        assert diagnostics.off_menu_flagged
    assert not any(d.off_menu_flagged for d in unflagged.diagnostics.values())
    assert caught.value.off_menu_mass > 0.5
    assert caught.value.threshold == 0.5
    assert caught.value.question_id == "refund"


async def test_llama_cpp_refuses_images_when_props_declare_no_vision(gemma3_url: str) -> None:
    counter = InFlightCounter("/completion")
    image = png()
    async with tv.Session.llama_cpp(
        gemma3_url, http=tv.HttpSettings(trace_configs=[counter.config])
    ) as session:
        with pytest.raises(tv.InvalidInputError, match="does not declare vision"):
            await session.judge(TICKET, questions(), images=[image])
    assert counter.started == 0


async def test_vllm_sends_judgment_images_and_a_text_only_model_refuses(vllm_url: str) -> None:
    image = png()
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID) as session:
        with pytest.raises(tv.ServerError) as caught:
            await session.judge(TICKET, {"r": tv.Noul(instructions="Refund?")}, images=[image])
    assert caught.value.status == 400
    assert caught.value.question_id == "r"


async def test_image_caps_are_enforced_before_any_request(gemma3_url: str) -> None:
    image = png(64)  # 72 bytes
    counter = InFlightCounter("/completion")
    async with tv.Session.llama_cpp(
        gemma3_url,
        max_images=1,
        max_image_bytes=40,
        http=tv.HttpSettings(trace_configs=[counter.config]),
    ) as session:
        with pytest.raises(tv.InvalidInputError, match="at most 1"):
            await session.judge(TICKET, questions(), images=[image, image])
        with pytest.raises(tv.InvalidInputError, match="40-byte cap"):
            await session.judge(TICKET, questions(), images=[image])
    assert counter.started == 0


async def test_llama_cpp_multimodal_body_is_the_shape_the_server_parses(gemma3_url: str) -> None:
    # Past the pipeline's vision check, straight to the backend: the real (text-only) server
    # recognises {"prompt_string", "multimodal_data"} and refuses only for lack of a vision
    # model, which is as far as a machine without a vision model can verify it.
    image = png()
    async with tv.Session.llama_cpp(gemma3_url) as session:
        probe = await session.probe()
        assert probe.media_marker
        assert probe.media_marker.startswith("<__media")
        assert probe.vision is False
        request = plan_question(
            "q",
            tv.Noul(instructions="Is it red?"),
            "a picture",
            family=probe.family,
            control_ids=probe.control_ids,
            images=[image],
            media_marker=probe.media_marker,
        )
        assert request.prompt is not None
        assert request.prompt.startswith(f"<start_of_turn>user\n{probe.media_marker}\na picture")
        with pytest.raises(tv.ServerError, match="Multimodal data provided") as caught:
            await session.backend.read(request, probe, max_retries=tv.UNSET)
    assert caught.value.status == 400
