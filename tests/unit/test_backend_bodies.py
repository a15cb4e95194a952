"""Request bodies and reply decoding of both backends: pure functions, no server.

The named escapes of issue 12 (malformed replies that used to come out as raw AttributeError,
TypeError, ValueError or KeyError) each have a test here; tests/unit/test_wire.py mutates real
recorded replies at random.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import typevet_async as tv
from typevet_async._backends import llama_cpp, vllm_wire
from typevet_async._backends import llama_cpp_wire as llama_wire
from typevet_async._backends.openai_chat import decode_chat_output, user_message
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.reading.readings import read_entries, validated_logprobs

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 24
WEBP = b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 16


def test_llama_cpp_scoring_body() -> None:
    assert llama_wire.completion_body("P", 4096, cache_prompt=True) == {
        "prompt": "P",
        "n_predict": 0,
        "n_probs": 4096,
        "post_sampling_probs": False,
        "cache_prompt": True,
        "return_tokens": False,
        # Only the top-level fields the decoder reads (the nested two come back unnested).
        "response_fields": [
            "completion_probabilities",
            "tokens_evaluated",
            "timings/cache_n",
            "generation_settings/n_probs",
        ],
    }


def test_a_trimmed_completion_reply_decodes_like_a_full_one() -> None:
    entries = [{"id": 7, "token": "a", "bytes": [97], "logprob": -0.5}]
    position = {"id": 7, "token": "a", "bytes": [97], "logprob": -0.5, "top_logprobs": entries}
    full = {
        "completion_probabilities": [position],
        "tokens_evaluated": 10,
        "timings": {"cache_n": 9, "prompt_ms": 1.0},
        "generation_settings": {"n_probs": 1, "temperature": 0.8},
        "content": "",
        "prompt": "P",
    }
    # As llama.cpp answers when the request names `response_fields` (seen on build 11549).
    trimmed = {
        "completion_probabilities": [position],
        "tokens_evaluated": 10,
        "timings/cache_n": 9,
        "generation_settings/n_probs": 1,
    }
    decoded = [llama_wire.decode_completion(json.dumps(r).encode(), 1) for r in (full, trimmed)]
    assert decoded[0] == decoded[1]
    assert (decoded[0].prompt_tokens, decoded[0].cached_tokens) == (10, 9)
    wrong_echo = {**trimmed, "generation_settings/n_probs": 2}
    with pytest.raises(tv.ProtocolError, match="server echoed 2"):
        llama_wire.decode_completion(json.dumps(wrong_echo).encode(), 1)


def test_llama_cpp_escalation_never_goes_below_the_exact_floor() -> None:
    assert llama_cpp.next_top_k(1, 262_144) == 4096
    assert llama_cpp.next_top_k(4096, 262_144) == 131_072
    assert llama_cpp.next_top_k(131_072, 262_144) == 262_144


def test_llama_cpp_generation_body() -> None:
    body = llama_wire.generation_body(tv.GenerationRequest("Extract", {"type": "object"}, (), 64))
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
    body = vllm_wire.scoring_body("m", [Message("user", "content")], [11, 12])
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
    body = vllm_wire.generation_body(
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


def encode(payload: Any) -> bytes:
    """JSON bytes of ``payload`` (bytes are sent as they are)."""
    return payload if isinstance(payload, bytes) else json.dumps(payload).encode()


def vllm_payload(entries: list[tuple[str, float]], sampled: str = "token_id:5") -> dict[str, Any]:
    top = [{"token": token, "logprob": logprob} for token, logprob in entries]
    return {
        "choices": [{"logprobs": {"content": [{"token": sampled, "top_logprobs": top}]}}],
        "usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 16}},
    }


def test_vllm_decode_keeps_candidates_and_tolerates_the_sampled_token() -> None:
    payload = vllm_payload([("token_id:11", -1.0), ("token_id:5", -0.1), ("token_id:12", -2.0)])
    reply = vllm_wire.decode_scoring(encode(payload), [11, 12])
    assert tuple(reply.top.pairs()) == ((11, -1.0), (12, -2.0))
    assert (reply.prompt_tokens, reply.cached_tokens) == (40, 16)


def test_vllm_decode_accepts_null_usage_details() -> None:
    payload = vllm_payload([("token_id:11", -1.0), ("token_id:12", -2.0)])
    payload["usage"]["prompt_tokens_details"] = None
    reply = vllm_wire.decode_scoring(encode(payload), [11, 12])
    assert (reply.prompt_tokens, reply.cached_tokens) == (40, 0)


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (vllm_payload([("token_id:11", -1.0), ("token_id:99", -1.0)]), tv.InvalidLogprobsError,
         "unexpected token ids"),
        (vllm_payload([("eleven", -1.0)]), tv.ProtocolError, "token_id:N"),
        (vllm_payload([("token_id:-11", -1.0)]), tv.ProtocolError, "token_id:N"),
        (vllm_payload([("token_id: 11", -1.0)]), tv.ProtocolError, "token_id:N"),
        (vllm_payload([("token_id:1_1", -1.0)]), tv.ProtocolError, "token_id:N"),
        (vllm_payload([("token_id:\u0661\u0661", -1.0)]), tv.ProtocolError, "token_id:N"),
        (vllm_payload([("token_id:11", "-1.0")]), tv.ProtocolError, "Expected `float`"),
        (vllm_payload([], sampled="5"), tv.ProtocolError, "token_id:N"),
        ({"choices": []}, tv.ProtocolError, "no choices"),
        ({"choices": [{"logprobs": None}]}, tv.ProtocolError, "got `null`"),
        ({"choices": [{"logprobs": {"content": []}}]}, tv.ProtocolError, "content"),
        ({**vllm_payload([]), "usage": "40"}, tv.ProtocolError, "usage"),
        ({**vllm_payload([]), "usage": [40]}, tv.ProtocolError, "usage"),
        ({**vllm_payload([]), "usage": {"prompt_tokens": "40"}}, tv.ProtocolError,
         "prompt_tokens"),
        ({**vllm_payload([]), "usage": {"prompt_tokens": -1}}, tv.ProtocolError,
         "prompt_tokens"),
        ({**vllm_payload([]), "usage": {"prompt_tokens_details": {"cached_tokens": 1.5}}},
         tv.ProtocolError, "cached_tokens"),
    ],
)  # fmt: skip
def test_vllm_decode_failures(payload: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        vllm_wire.decode_scoring(encode(payload), [11, 12])


def test_vllm_repeated_ids_are_left_to_the_one_entries_check() -> None:
    payload = vllm_payload([("token_id:11", -1.0), ("token_id:11", -1.5)])
    reply = vllm_wire.decode_scoring(encode(payload), [11, 12])
    assert tuple(reply.top.pairs()) == ((11, -1.0), (11, -1.5))
    with pytest.raises(tv.InvalidLogprobsError, match="appears twice"):
        validated_logprobs(reply.top)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"tokens": ["abc"]}, r"Expected `int`, got `str` - at `\$.tokens\[0\]`"),
        ({"tokens": [None]}, "got `null`"),
        ({"tokens": [100.9]}, "got `float`"),
        ({"tokens": [True]}, "got `bool`"),
        ({"tokens": [-1]}, ">= 0"),
        ({"tokens": "1"}, "Expected `array`"),
        ({"token_strs": []}, "missing required field `tokens`"),
    ],
)
def test_vllm_tokenize_failures(payload: Any, message: str) -> None:
    with pytest.raises(tv.ProtocolError, match=message):
        vllm_wire.decode_tokens(encode(payload))


def test_vllm_tokenize_and_render_and_models() -> None:
    assert vllm_wire.decode_tokens(b'{"count": 1, "tokens": [236771], "token_strs": null}') == [
        236771
    ]
    rendered = {"tokens": [2, 3], "token_strs": ["<start_of_turn>", "user"]}
    assert vllm_wire.decode_rendered(encode(rendered)) == "<start_of_turn>user"
    with pytest.raises(tv.ProtocolError, match="no token_strs"):
        vllm_wire.decode_rendered(b'{"tokens": [2], "token_strs": null}')
    with pytest.raises(tv.ProtocolError, match="Expected `str`"):
        vllm_wire.decode_rendered(b'{"tokens": [2], "token_strs": [2]}')
    models = {"object": "list", "data": [{"id": "gemma3-270m", "max_model_len": 2048}]}
    assert vllm_wire.decode_model_ids(encode(models)) == ("gemma3-270m",)
    with pytest.raises(tv.ProtocolError, match="data"):
        vllm_wire.decode_model_ids(b'{"data": {"id": "x"}}')
    with pytest.raises(tv.ProtocolError, match="id"):
        vllm_wire.decode_model_ids(b'{"data": [{"id": 7}]}')


def completion(**fields: Any) -> dict[str, Any]:
    """A llama.cpp /completion reply (top 2), with ``fields`` replaced."""
    top = [{"id": 10, "token": "0", "bytes": [48], "logprob": -0.5},
           {"id": 11, "token": "1", "bytes": [49], "logprob": -1.5}]  # fmt: skip
    payload: dict[str, Any] = {
        "completion_probabilities": [{"id": 10, "logprob": -0.5, "top_logprobs": top}],
        "generation_settings": {"n_probs": 2, "temperature": 0.8},
        "tokens_evaluated": 7,
        "timings": {"cache_n": 3, "prompt_n": 4},
    }
    payload.update(fields)
    return payload


def test_llama_cpp_decode_completion() -> None:
    reply = llama_wire.decode_completion(encode(completion()), 2)
    assert tuple(reply.top.pairs()) == ((10, -0.5), (11, -1.5))
    assert (reply.top.requested, reply.prompt_tokens, reply.cached_tokens) == (2, 7, 3)
    minimal = {"completion_probabilities": [{"top_logprobs": []}]}
    reply = llama_wire.decode_completion(encode(minimal), 2)
    assert (tuple(reply.top.pairs()), reply.prompt_tokens, reply.cached_tokens) == ((), 0, 0)


def test_llama_cpp_repeated_ids_are_named_by_the_one_entries_check() -> None:
    top = [{"id": 10, "logprob": -0.5}, {"id": 12, "logprob": -0.9}, {"id": 10, "logprob": -2.0}]
    payload = completion(
        completion_probabilities=[{"top_logprobs": top}], generation_settings={"n_probs": 3}
    )
    reply = llama_wire.decode_completion(encode(payload), 3)
    assert reply.top.returned == 3
    assert len(reply.top.logprobs) == 2
    assert tuple(reply.top.pairs()) == ((10, -0.5), (12, -0.9), (10, -2.0))
    with pytest.raises(tv.InvalidLogprobsError, match="token id 10 appears twice"):
        read_entries(reply.top, 100)


def test_llama_cpp_decode_checks_the_n_probs_echo() -> None:
    with pytest.raises(tv.ProtocolError, match="echoed 8") as caught:
        llama_wire.decode_completion(encode(completion(generation_settings={"n_probs": 8})), 2)
    assert isinstance(caught.value.payload, str)


def entry(value: Any) -> dict[str, Any]:
    """A completion whose first entry's id is ``value``."""
    payload = completion()
    payload["completion_probabilities"][0]["top_logprobs"][0]["id"] = value
    return payload


def logprob(value: Any) -> dict[str, Any]:
    """A completion whose first entry's logprob is ``value``."""
    payload = completion()
    payload["completion_probabilities"][0]["top_logprobs"][0]["logprob"] = value
    return payload


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (completion(generation_settings="n_probs=2"), "generation_settings"),
        (completion(generation_settings={"n_probs": "2"}), "n_probs"),
        (completion(timings=[3]), "timings"),
        (completion(timings=None), "timings"),
        (completion(timings={"cache_n": -3}), "cache_n"),
        (completion(tokens_evaluated="abc"), "tokens_evaluated"),
        (completion(tokens_evaluated=7.5), "tokens_evaluated"),
        (completion(completion_probabilities=[]), "no completion_probabilities"),
        (completion(completion_probabilities={"top_logprobs": []}), "completion_probabilities"),
        (completion(completion_probabilities=[{"top_logprobs": None}]), "top_logprobs"),
        (completion(completion_probabilities=[{"top_logprobs": [[10, -0.5]]}]), "top_logprobs"),
        (entry(100.9), "got `float`"),
        (entry(100.0), "got `float`"),
        (entry("100"), "got `str`"),
        (entry(True), "got `bool`"),
        (entry(None), "got `null`"),
        (entry(-1), ">= 0"),
        (logprob("-0.5"), "got `str`"),
        (logprob(None), "got `null`"),
        (json.dumps(logprob(-0.5)).replace("-0.5", "-1e400").encode(), "out of range"),
        (json.dumps(logprob(-0.5)).replace("-0.5", "NaN").encode(), "not valid JSON"),
        (json.dumps(completion())[:-5].encode(), "not valid JSON"),
        ("[]", "Expected `object`"),
    ],
)
def test_llama_cpp_malformed_completions_are_protocol_errors(payload: Any, message: str) -> None:
    with pytest.raises(tv.ProtocolError, match=message) as caught:
        llama_wire.decode_completion(encode(payload), 2)
    assert type(caught.value) is tv.ProtocolError
    assert isinstance(caught.value.payload, str)


def test_a_protocol_error_keeps_a_bounded_excerpt_of_the_body() -> None:
    payload = completion(tokens_evaluated="abc")
    payload["filler"] = "x" * 100_000
    with pytest.raises(tv.ProtocolError) as caught:
        llama_wire.decode_completion(encode(payload), 2)
    assert isinstance(caught.value.payload, str)
    assert len(caught.value.payload.encode()) <= 2048


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"tokens": ["abc"]}, "got `str`"),
        ({"tokens": [None]}, "got `null`"),
        ({"tokens": [{"id": "1", "piece": "1"}]}, "got `str`"),
        ({"tokens": [{"piece": "1"}]}, "missing required field `id`"),
        ({"tokens": None}, "got `null`"),
        ({}, "missing required field `tokens`"),
    ],
)
def test_llama_cpp_tokenize_failures(payload: Any, message: str) -> None:
    with pytest.raises(tv.ProtocolError, match=message):
        llama_wire.decode_tokens(encode(payload))


def test_llama_cpp_tokenize_takes_ids_and_pieces() -> None:
    assert llama_wire.decode_tokens(b'{"tokens": [236771]}') == [236771]
    assert llama_wire.decode_tokens(b'{"tokens": [{"id": 562, "piece": " A"}]}') == [562]


def test_llama_cpp_pieces_are_text_or_bytes() -> None:
    raw = b'{"tokens": [{"id": 200, "piece": "<b>"}, {"id": 437, "piece": [199]}]}'
    assert llama_wire.decode_pieces(raw) == [(200, b"<b>"), (437, b"\xc7")]
    body = llama_wire.tokenize_body("<b>", parse_special=False, with_pieces=True)
    assert body == {
        "content": "<b>",
        "add_special": False,
        "parse_special": False,
        "with_pieces": True,
    }


@pytest.mark.parametrize(
    "payload",
    [
        {"tokens": [236771]},
        {"tokens": [{"id": 1}]},
        {"tokens": [{"id": 1, "piece": [256]}]},
        {"tokens": [{"id": 1, "piece": None}]},
    ],
)
def test_llama_cpp_pieces_failures(payload: Any) -> None:
    with pytest.raises(tv.ProtocolError):
        llama_wire.decode_pieces(encode(payload))


def models(**meta: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "gemma"}],
        "object": "list",
        "data": [{"id": "gemma", "aliases": ["g"], "meta": {"n_vocab": 262_144, **meta}}],
    }


def test_llama_cpp_models() -> None:
    assert llama_wire.decode_models(encode(models())) == (262_144, ("gemma", "g"))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (models(n_vocab="262144"), "n_vocab"),
        (models(n_vocab=2.5), "n_vocab"),
        (models(n_vocab=0), "n_vocab"),
        (models(n_vocab=None), "n_vocab"),
        ({"data": []}, "no data"),
        ({"data": [{"id": "gemma"}]}, "no data"),
        ({"data": [{"id": "gemma", "meta": "x"}]}, "meta"),
        ({"data": [{"id": 5, "meta": {"n_vocab": 5}}]}, "id"),
        ({"data": [{"id": "g", "aliases": "g", "meta": {"n_vocab": 5}}]}, "aliases"),
        ({"data": "gemma"}, "data"),
    ],
)
def test_llama_cpp_models_failures(payload: Any, message: str) -> None:
    with pytest.raises(tv.ProtocolError, match=message):
        llama_wire.decode_models(encode(payload))


def test_llama_cpp_props_and_template() -> None:
    props = {"modalities": {"vision": True, "audio": False}, "media_marker": "<__media__>"}
    assert llama_wire.decode_props(encode(props)) == llama_wire.Props(True, "<__media__>", None)
    assert llama_wire.decode_props(b'{"total_slots": 4}') == llama_wire.Props(False, None, 4)
    assert llama_wire.decode_props(b'{"media_marker": ""}') == llama_wire.Props(False, None, None)
    assert llama_wire.decode_rendered(b'{"prompt": "<start_of_turn>user"}') == "<start_of_turn>user"


@pytest.mark.parametrize(
    ("decoder", "payload", "message"),
    [
        (llama_wire.decode_props, {"modalities": ["vision"]}, "modalities"),
        (llama_wire.decode_props, {"modalities": "vision"}, "modalities"),
        (llama_wire.decode_props, {"modalities": {"vision": "yes"}}, "vision"),
        (llama_wire.decode_props, {"modalities": {"vision": 1}}, "vision"),
        (llama_wire.decode_props, {"media_marker": 5}, "media_marker"),
        (llama_wire.decode_props, {"total_slots": 0}, "total_slots"),
        (llama_wire.decode_props, {"total_slots": "4"}, "total_slots"),
        (llama_wire.decode_props, [], "object"),
        (llama_wire.decode_rendered, {"prompt": ["x"]}, "prompt"),
        (llama_wire.decode_rendered, {"prompt": None}, "prompt"),
        (llama_wire.decode_rendered, {}, "prompt"),
    ],
)
def test_llama_cpp_props_and_template_failures(
    decoder: Callable[[bytes], Any], payload: Any, message: str
) -> None:
    with pytest.raises(tv.ProtocolError, match=message):
        decoder(encode(payload))


def test_chat_output_decoding() -> None:
    payload = {
        "choices": [{"message": {"content": '{"a": 1}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    output = decode_chat_output(encode(payload))
    assert (output.content, output.finish_reason, output.prompt_tokens) == ('{"a": 1}', "stop", 9)
    assert output.completion_tokens == 4
    empty = decode_chat_output(b'{"choices": [{"message": {"content": null}}], "usage": null}')
    assert (empty.content, empty.finish_reason, empty.prompt_tokens) == ("", "", 0)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"error": "x"}, "missing required field `choices`"),
        ({"choices": []}, "no choices"),
        ({"choices": [{}]}, "message"),
        ({"choices": [{"message": "hi"}]}, "message"),
        ({"choices": [{"message": {"content": 5}}]}, "content"),
        ({"choices": [{"message": {"content": "x"}, "finish_reason": 1}]}, "finish_reason"),
        ({"choices": [{"message": {}}], "usage": "9"}, "usage"),
        ({"choices": [{"message": {}}], "usage": [9]}, "usage"),
        ({"choices": [{"message": {}}], "usage": {"prompt_tokens": "9"}}, "prompt_tokens"),
        ({"choices": [{"message": {}}], "usage": {"completion_tokens": 1.5}},
         "completion_tokens"),
    ],
)  # fmt: skip
def test_chat_output_failures(payload: Any, message: str) -> None:
    with pytest.raises(tv.ProtocolError, match=message):
        decode_chat_output(encode(payload))


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
    body = llama_wire.completion_body("<m>\nP", 4096, cache_prompt=True, images=[image, image])
    assert body["prompt"] == {
        "prompt_string": "<m>\nP",
        "multimodal_data": [base64.b64encode(PNG).decode()] * 2,
    }


def test_llama_cpp_template_body_turns_thinking_off() -> None:
    body = llama_wire.template_body([Message("system", "S"), Message("user", "U")])
    assert body == {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_vllm_scoring_body_carries_images_and_roles() -> None:
    image = tv.Image.from_bytes(PNG, "image/png")
    body = vllm_wire.scoring_body(
        "m", [Message("system", "S"), Message("user", "E", (image,)), Message("user", "Q")], [1]
    )
    system, evidence, question = body["messages"]
    assert system == {"role": "system", "content": "S"}
    assert evidence["content"][0]["type"] == "image_url"
    assert evidence["content"][1] == {"type": "text", "text": "E"}
    assert question == {"role": "user", "content": "Q"}
