"""Request bodies and response parsing of both backends: pure functions, no server."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

import typevet_async as tv
from typevet_async._backends import llama_cpp, vllm
from typevet_async._backends.openai_chat import parse_chat_output, user_message
from typevet_async._core.layouts import Message
from typevet_async._core.readings import validated_entries

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 24
WEBP = b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 16


def test_llama_cpp_scoring_body() -> None:
    assert llama_cpp.completion_body("P", 4096, cache_prompt=True) == {
        "prompt": "P",
        "n_predict": 0,
        "n_probs": 4096,
        "post_sampling_probs": False,
        "cache_prompt": True,
        "return_tokens": False,
    }


def test_llama_cpp_escalation_never_goes_below_the_exact_floor() -> None:
    assert llama_cpp.next_top_k(1, 262_144) == 4096
    assert llama_cpp.next_top_k(4096, 262_144) == 131_072
    assert llama_cpp.next_top_k(131_072, 262_144) == 262_144


def test_llama_cpp_generation_body() -> None:
    body = llama_cpp.generation_body(tv.GenerationRequest("Extract", {"type": "object"}, (), 64))
    assert body == {
        "messages": [{"role": "user", "content": "Extract"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": {"type": "object"}},
        },
        "temperature": 0.0,
        "max_tokens": 64,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_vllm_scoring_body() -> None:
    body = vllm.scoring_body("m", [Message("user", "content")], [11, 12])
    assert body["model"] == "m"
    assert body["messages"] == [{"role": "user", "content": "content"}]
    assert body["max_tokens"] == 1
    assert body["logprobs"] is True
    assert body["logprob_token_ids"] == [11, 12]
    assert body["return_tokens_as_token_ids"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "top_logprobs" not in body  # vLLM refuses a top_logprobs that differs from the ids


def test_vllm_generation_body_puts_images_before_the_text() -> None:
    image = tv.Image.from_bytes(PNG, "image/png")
    body = vllm.generation_body(
        "m", tv.GenerationRequest("Describe", {"type": "string"}, (image,), 32)
    )
    assert body["structured_outputs"] == {"json": {"type": "string"}}
    content = body["messages"][0]["content"]
    assert content[0]["type"] == "image_url"
    url = content[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == PNG
    assert content[1] == {"type": "text", "text": "Describe"}
    assert user_message("t") == {"role": "user", "content": "t"}


def vllm_payload(entries: list[tuple[str, float]], sampled: str = "token_id:5") -> dict[str, Any]:
    top = [{"token": token, "logprob": logprob} for token, logprob in entries]
    return {
        "choices": [{"logprobs": {"content": [{"token": sampled, "top_logprobs": top}]}}],
        "usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 16}},
    }


def test_vllm_parse_keeps_candidates_and_tolerates_the_sampled_token() -> None:
    payload = vllm_payload([("token_id:11", -1.0), ("token_id:5", -0.1), ("token_id:12", -2.0)])
    top, prompt_tokens, cached = vllm.parse_scoring_response(payload, [11, 12])
    assert top.entries == ((11, -1.0), (12, -2.0))
    assert (prompt_tokens, cached) == (40, 16)


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (vllm_payload([("token_id:11", -1.0), ("token_id:99", -1.0)]), tv.InvalidLogprobsError,
         "unexpected token ids"),
        (vllm_payload([("eleven", -1.0)]), tv.ProtocolError, "token_id:N"),
        ({"choices": []}, tv.ProtocolError, "top_logprobs"),
    ],
)  # fmt: skip
def test_vllm_parse_failures(payload: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        vllm.parse_scoring_response(payload, [11, 12])


def test_vllm_repeated_ids_are_left_to_the_one_entries_check() -> None:
    payload = vllm_payload([("token_id:11", -1.0), ("token_id:11", -1.5)])
    top, _, _ = vllm.parse_scoring_response(payload, [11, 12])
    assert top.entries == ((11, -1.0), (11, -1.5))
    with pytest.raises(tv.InvalidLogprobsError, match="appears twice"):
        validated_entries(top.entries)


def test_llama_cpp_parse_checks_the_n_probs_echo() -> None:
    payload = {
        "completion_probabilities": [{"top_logprobs": [{"id": 1, "logprob": -0.5}]}],
        "generation_settings": {"n_probs": 8},
    }
    with pytest.raises(tv.ProtocolError, match="echoed 8"):
        llama_cpp.parse_completion(payload, 1)


def test_chat_output_parsing() -> None:
    payload = {
        "choices": [{"message": {"content": '{"a": 1}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    output = parse_chat_output(payload)
    assert (output.content, output.finish_reason, output.prompt_tokens) == ('{"a": 1}', "stop", 9)
    assert parse_chat_output({"choices": [{"message": {"content": None}}]}).content == ""
    with pytest.raises(tv.ProtocolError):
        parse_chat_output({"error": "x"})


@pytest.mark.parametrize(
    ("data", "mime"), [(PNG, "image/png"), (JPEG, "image/jpeg"), (WEBP, "image/webp")]
)
def test_images_by_their_bytes(data: bytes, mime: str, tmp_path: Path) -> None:
    assert tv.Image.from_bytes(data, mime).mime_type == mime
    path = tmp_path / "picture.bin"
    path.write_bytes(data)
    assert tv.Image.from_path(path).mime_type == mime
    assert "bytes" in repr(tv.Image.from_bytes(data, mime))


@pytest.mark.parametrize(
    ("data", "mime", "message"),
    [
        (PNG, "image/jpeg", "not image/jpeg"),
        (b"GIF89a" + b"\0" * 10, "image/gif", "not supported"),
        (b"hello", "image/png", "not a supported image"),
        (PNG * 100, "image/png", "exceeds the 100-byte cap"),
    ],
)
def test_bad_images_are_refused(data: bytes, mime: str, message: str) -> None:
    with pytest.raises(tv.InvalidInputError, match=message):
        tv.Image.from_bytes(data, mime, max_bytes=100)


def test_llama_cpp_multimodal_completion_body() -> None:
    image = tv.Image.from_bytes(PNG, "image/png")
    body = llama_cpp.completion_body("<m>\nP", 4096, cache_prompt=True, images=[image, image])
    assert body["prompt"] == {
        "prompt_string": "<m>\nP",
        "multimodal_data": [base64.b64encode(PNG).decode()] * 2,
    }


def test_llama_cpp_template_body_turns_thinking_off() -> None:
    body = llama_cpp.template_body([Message("system", "S"), Message("user", "U")])
    assert body == {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_vllm_scoring_body_carries_images_and_roles() -> None:
    image = tv.Image.from_bytes(PNG, "image/png")
    body = vllm.scoring_body(
        "m", [Message("system", "S"), Message("user", "E", (image,)), Message("user", "Q")], [1]
    )
    system, evidence, question = body["messages"]
    assert system == {"role": "system", "content": "S"}
    assert evidence["content"][0]["type"] == "image_url"
    assert evidence["content"][1] == {"type": "text", "text": "E"}
    assert question == {"role": "user", "content": "Q"}
