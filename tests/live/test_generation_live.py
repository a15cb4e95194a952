"""Schema-bound generation against both real servers (llama.cpp and vLLM, same model)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
import pytest_asyncio

import typevet_async as tv

from .helpers import InFlightCounter, make_session, png
from .servers import VLLM_MODEL_ID

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

COLOUR = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}
PROMPT = 'Reply in JSON like {"colour": "red"}. The car is red.'


@pytest_asyncio.fixture
async def counted(backend: tuple[str, str]) -> AsyncIterator[tuple[tv.Session, InFlightCounter]]:
    counter = InFlightCounter("/v1/chat/completions")
    async with make_session(
        backend, max_concurrency=3, http=tv.HttpSettings(trace_configs=[counter.config])
    ) as session:
        yield session, counter


async def test_enum_and_small_object(counted: tuple[tv.Session, InFlightCounter]) -> None:
    session, _ = counted
    result = await session.generate(PROMPT, schema=COLOUR, max_tokens=40)
    assert result.value == {"colour": "red"}
    assert '"colour"' in result.raw
    assert result.finish_reason == "stop"
    enum = await session.generate(PROMPT, schema={"enum": ["red", "green", "blue"]}, max_tokens=10)
    assert enum.value in ("red", "green", "blue")


async def test_malformed_schema_fails_before_any_request(
    counted: tuple[tv.Session, InFlightCounter],
) -> None:
    session, counter = counted
    with pytest.raises(tv.SchemaError, match="meta-schema"):
        await session.generate(PROMPT, schema={"type": "object", "required": "colour"})
    with pytest.raises(tv.SchemaError, match="never fetched"):
        await session.generate(PROMPT, schema={"$ref": "https://example.com/colour.json"})
    assert counter.started == 0


async def test_token_limit_cut_is_a_typed_error_with_the_payload(
    counted: tuple[tv.Session, InFlightCounter],
) -> None:
    session, _ = counted
    with pytest.raises(tv.TruncatedOutputError) as caught:
        await session.generate(PROMPT, schema=COLOUR, max_tokens=3)
    assert caught.value.raw  # what the server returned before the cut
    assert caught.value.prompt_index == 0
    assert caught.value.question_id is None
    assert str(caught.value).startswith("prompt 0: ")
    # In a batch, each failure carries its own prompt's index.
    prompts = [PROMPT, 'Reply in JSON like {"colour": "blue"}. The sky is blue.']
    settled = await session.generate_many(
        prompts, schema=COLOUR, max_tokens=3, return_exceptions=True
    )
    assert [type(item) for item in settled] == [tv.TruncatedOutputError] * 2
    assert [getattr(item, "prompt_index", None) for item in settled] == [0, 1]
    # Failing fast, the first failure raises and cancels the rest: one at a time, prompt 0's.
    with pytest.raises(tv.TruncatedOutputError) as first:
        await session.generate_many(prompts, schema=COLOUR, max_tokens=3, max_in_flight=1)
    assert first.value.prompt_index == 0


async def test_generate_many_in_request_order_under_the_cap(
    counted: tuple[tv.Session, InFlightCounter],
) -> None:
    session, counter = counted
    colours = ["red", "green", "blue", "red", "blue", "green", "red", "green"]
    prompts = [f'Reply in JSON like {{"colour": "{c}"}}. The car is {c}.' for c in colours]
    results = await session.generate_many(prompts, schema=COLOUR, max_tokens=40, max_in_flight=8)
    assert len(results) == len(prompts)
    for result in results:
        assert isinstance(result, tv.Generation)
        assert result.value["colour"] in ("red", "green", "blue")
    # Concurrent single generations share the same session cap.
    async with anyio.create_task_group() as group:
        for prompt in prompts:
            group.start_soon(lambda p=prompt: session.generate(p, schema=COLOUR, max_tokens=40))
    assert counter.started == 2 * len(prompts)
    assert counter.peak == 3  # the session cap (3), honoured exactly, not the call's 8


async def test_llama_cpp_refuses_images_before_any_request(gemma3_url: str) -> None:
    # llama.cpp's chat endpoint declares no generation images (capability
    # generation_images=False): the pipeline refuses them before the probe and any request.
    counter = InFlightCounter("/v1/chat/completions")
    probe = InFlightCounter("/apply-template")
    async with tv.Session.llama_cpp(
        gemma3_url, http=tv.HttpSettings(trace_configs=[counter.config, probe.config])
    ) as session:
        with pytest.raises(tv.InvalidInputError, match="does not take images") as caught:
            await session.generate(PROMPT, schema=COLOUR, images=[png()])
        with pytest.raises(tv.InvalidInputError, match="does not take images"):
            await session.generate_many([PROMPT, PROMPT], schema=COLOUR, images=png())
    assert caught.value.prompt_index is None  # the call was refused, not one prompt
    assert counter.started == probe.started == 0


async def test_image_caps_apply_to_generation_before_any_request(
    backend: tuple[str, str],
) -> None:
    # The same caps as a judgment's (max_images, max_image_bytes), checked first on both
    # backends: on vLLM nothing else would stop the request.
    image = png(64)  # 72 bytes
    counter = InFlightCounter("/v1/chat/completions")
    async with make_session(
        backend,
        max_images=1,
        max_image_bytes=40,
        http=tv.HttpSettings(trace_configs=[counter.config]),
    ) as session:
        with pytest.raises(tv.InvalidInputError, match="at most 1"):
            await session.generate(PROMPT, schema=COLOUR, images=[image, image])
        with pytest.raises(tv.InvalidInputError, match="40-byte cap"):
            await session.generate(PROMPT, schema=COLOUR, images=[image])
        with pytest.raises(tv.InvalidInputError, match="40-byte cap"):
            await session.generate_many([PROMPT], schema=COLOUR, images=[image])
    assert counter.started == 0


async def test_llama_cpp_drops_grammars_it_cannot_build_and_the_client_catches_it(
    gemma3_url: str,
) -> None:
    # llama.cpp turns a schema it cannot convert ("not" here) into no grammar at all and
    # generates free text: the client-side parse and validation is the guard.
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "not": {"required": ["n"]},
    }
    async with tv.Session.llama_cpp(gemma3_url) as session:
        with pytest.raises(tv.GenerationError) as caught:
            await session.generate("Reply in JSON.", schema=schema, max_tokens=30)
    assert caught.value.raw
    assert caught.value.prompt_index == 0


async def test_vllm_output_that_fails_the_schema_raises_with_path_and_payload(
    vllm_url: str,
) -> None:
    # xgrammar ignores "not", so the grammar admits {"n": 1}, which the schema forbids.
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "not": {"required": ["n"]},
    }
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID) as session:
        with pytest.raises(tv.OutputValidationError) as caught:
            await session.generate("Reply in JSON. The car cost 1 dollar.", schema=schema)
    assert caught.value.path == "$"
    assert isinstance(caught.value.value, dict)
    assert "n" in caught.value.value
    assert caught.value.raw.strip().startswith("{")


async def test_vllm_sends_images_as_data_uris_and_a_text_only_model_refuses_them(
    vllm_url: str,
) -> None:
    async with tv.Session.vllm(vllm_url, model=VLLM_MODEL_ID) as session:
        with pytest.raises(tv.ServerError) as caught:
            await session.generate(PROMPT, schema=COLOUR, images=[png()])
    assert caught.value.status == 400
    assert caught.value.prompt_index == 0
