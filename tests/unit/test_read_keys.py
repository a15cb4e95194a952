"""The read cache's pure parts: the key covers everything that decides a read's bytes (and
nothing that only interprets it), and a stored value decodes strictly against its request (a
corrupt, oversized or foreign value is a miss, never another read)."""

from __future__ import annotations

from typing import Any

import attrs
import orjson
import pytest

import typevet_async as tv
from typevet_async._backends.base import server_of
from typevet_async._core.prompts.controls import UPPERCASE
from typevet_async._core.prompts.framing import PromptFrame
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.prompts.scoring import plan_question
from typevet_async._core.reading.read_keys import canonical, probe_digest, read_key
from typevet_async._core.reading.read_values import (
    MAX_VALUE_BYTES,
    READ_VALUE_FORMAT,
    decode_read,
    encode_read,
)

IDS = {letter: 100 + index for index, letter in enumerate(UPPERCASE)}
PROBE = tv.Probe(tv.TemplateFamily.GEMMA3, "rendered", IDS, 262_144, ("gemma.gguf",))
PNG = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 24, "image/png")
OTHER_PNG = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\1" * 24, "image/png")


def request(state: str = "I was charged twice.", **changes: Any) -> tv.ScoringRequest:
    question = tv.Choice(["billing", "shipping", "technical"], instructions="Which team?")
    planned = plan_question(
        "route", question, state, family=tv.TemplateFamily.GEMMA3, control_ids=IDS
    )
    return attrs.evolve(planned, **changes) if changes else planned


def key(req: tv.ScoringRequest, identity: str = "llama", probe: str | None = None) -> str:
    return read_key(identity, probe if probe is not None else probe_digest(PROBE), req)


# -- the key -------------------------------------------------------------------------------


def test_identical_requests_have_one_key_and_it_is_a_sha256() -> None:
    first, again = key(request()), key(request())
    assert first == again
    assert len(first) == 64
    assert int(first, 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "another prompt"},
        {"prompt": None},
        {"messages": (Message("user", "other content"),)},
        {"messages": (Message("system", "I was charged twice."),)},
        {"messages": (Message("user", "x", (PNG,)),)},
        {"answer_prefill": "<think></think>"},
        {"lead": (7,)},
        {"token_ids": (100, 101, 103)},
        {"option_groups": ((100, 200), (101,), (102,))},
        {"read_ids": (100, 101, 102, 200)},
        {"codes": ((100, 300), (100, 301), (101, 300))},
    ],
    ids=lambda change: next(iter(change)),
)
def test_every_ingredient_of_the_request_changes_the_key(change: dict[str, Any]) -> None:
    assert key(request(**change)) != key(request())


def test_an_image_is_keyed_by_its_sha256_not_its_object() -> None:
    def with_image(image: tv.Image) -> tv.ScoringRequest:
        return request(messages=(Message("user", "x", (image,)),))

    same = tv.Image.from_bytes(PNG.data, "image/png")
    assert key(with_image(PNG)) == key(with_image(same))
    assert key(with_image(PNG)) != key(with_image(OTHER_PNG))
    assert PNG.sha256 == same.sha256 != OTHER_PNG.sha256


def test_what_only_interprets_a_read_is_not_in_the_key() -> None:
    # The judgment's number, the rotation's order and the question's labels are applied to a
    # stored read as to a fresh one: the same prompt and candidates are the same read.
    other_question = tv.Choice(["x", "y", "z"], instructions="Other")
    assert key(request(judgment=7, order=(2, 0, 1), question=other_question)) == key(request())


def test_the_state_changes_the_key() -> None:
    assert key(request("I was charged twice.")) != key(request("I was charged twice!"))


@pytest.mark.parametrize(
    "change",
    [
        {"family": tv.TemplateFamily.GEMMA4},
        {"rendered_template": "another rendering"},
        {"control_ids": {**IDS, "A": 999}},
        {"vocab_size": 262_145},
        {"model_ids": ("other.gguf",)},
        {"vision": True},
        {"frame": PromptFrame("<start>", "<end>")},
        {"control_leads": {"A": (5,)}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_changed_probe_misses(change: dict[str, Any]) -> None:
    changed = probe_digest(attrs.evolve(PROBE, **change))
    assert changed != probe_digest(PROBE)
    assert key(request(), probe=changed) != key(request())


def test_the_servers_slots_do_not_change_the_probe_digest() -> None:
    # How many reads run at once decides how many are sent, not what one reads.
    assert probe_digest(attrs.evolve(PROBE, slots=8)) == probe_digest(PROBE)


def test_the_backend_identity_changes_the_key() -> None:
    assert key(request(), identity="a") != key(request(), identity="b")


def test_the_canonical_encoding_is_unambiguous_and_ignores_dict_order() -> None:
    assert canonical(("ab", "c")) != canonical(("a", "bc"))
    assert canonical([1, [2]]) != canonical([[1], 2])
    assert canonical(1) != canonical(1.0) != canonical(True)
    assert canonical(None) != canonical("") != canonical(b"")
    assert canonical({"a": 1, "b": 2}) == canonical({"b": 2, "a": 1})
    assert canonical("\ud800") != canonical("\ud801")  # lone surrogates still encode
    with pytest.raises(TypeError):
        canonical(object())


def test_the_backends_read_identities() -> None:
    def llama(**config: Any) -> str | None:
        options = {"base_url": "http://127.0.0.1:8080", **config}
        return tv.AsyncLlamaCpp(tv.LlamaCppConfig(**options)).read_identity()

    base = llama()
    assert isinstance(base, str)
    for change in (
        {"base_url": "http://127.0.0.1:8081"},
        {"model": "gemma"},
        {"top_k": 64},
        {"on_missing": "clamp"},
        {"reproducible": True},
    ):
        assert llama(**change) != base, change
    # The URL's credentials decide who may read, not what is read, and are never shown.
    with_user = llama(base_url="http://user:secret@127.0.0.1:8080")
    assert with_user == base
    assert server_of("http://user:pw@host:1/x") == "http://host:1/x"
    assert "secret" not in (with_user or "")
    # The embedded server's identity is known once it has started (its port never counts).
    assert tv.AsyncLlamaCpp(tv.LlamaCppConfig(server=tv.ServerOptions())).read_identity() is None

    def vllm(**config: Any) -> str:
        options = {"base_url": "http://127.0.0.1:8000", "model": "m", **config}
        return tv.AsyncVllm(tv.VllmConfig(**options)).read_identity()

    assert vllm() != vllm(model="n")
    assert vllm() != vllm(logprobs_mode="raw_logits")
    assert not isinstance(tv.AsyncSystemOne(tv.SystemOneConfig(base_url="http://h:1")),
                          tv.ReadIdentifying)  # fmt: skip


def test_a_fleet_is_identified_by_all_its_endpoints_in_any_order() -> None:
    def fleet(*urls: str) -> str | None:
        return tv.Session.llama_cpp(list(urls)).backend.read_identity()  # type: ignore[attr-defined]

    one = fleet("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert one == fleet("http://127.0.0.1:2", "http://127.0.0.1:1")
    assert one != fleet("http://127.0.0.1:1", "http://127.0.0.1:3")
    assert isinstance(tv.Session.llama_cpp("http://127.0.0.1:1").backend, tv.ReadIdentifying)


def test_an_embedded_servers_identity_is_its_model_and_options_not_its_port() -> None:
    def identity(**options: Any) -> dict[str, Any]:
        server = tv.EmbeddedServer(tv.ServerOptions(**options))
        from typevet_async._backends.embedded import _read_identity

        return _read_identity(server.options, tv.cache_dir() / "unused.gguf")

    base = identity()
    assert identity(port=9999) == base
    assert identity(n_ctx=4096) != base
    assert identity(chat_template="gemma") != base
    assert base["model"]["sha256"] == tv.LOCAL_MODELS["gemma3-270m"].sha256


# -- the stored value ----------------------------------------------------------------------


def read_of(req: tv.ScoringRequest, **changes: Any) -> tv.CandidateRead:
    fields: dict[str, Any] = {
        "token_ids": req.token_ids,
        "logprobs": (-0.5, -1.25, -3.0),
        "top_k": 128,
        "reads": 2,
        "prompt_tokens": 40,
        "cached_tokens": 12,
        "prompt": req.prompt or "",
        "attempts": 3,
        "endpoint": "http://a",
    }
    return tv.CandidateRead(**{**fields, **changes})


def as_hit(read: tv.CandidateRead) -> tv.CandidateRead:
    return attrs.evolve(
        read, reads=0, prompt_tokens=0, cached_tokens=0, attempts=0, cache="hit",
        after=tuple(as_hit(after) for after in read.after),
    )  # fmt: skip


def test_a_read_round_trips_bit_for_bit_and_a_hit_costs_nothing() -> None:
    req = request()
    read = read_of(req, logprobs=(-1 / 3, -2.0000000000000004, -745.1332191019411))
    decoded = decode_read(encode_read(read), req)
    assert decoded == as_hit(read)
    assert decoded is not None
    assert decoded.logprobs == read.logprobs  # exact floats, not rounded
    assert (decoded.reads, decoded.attempts, decoded.prompt_tokens) == (0, 0, 0)


def test_clamped_and_logit_reads_round_trip() -> None:
    req = request()
    clamped = read_of(req, policy="clamp", truncated=True, endpoint=None)
    assert decode_read(encode_read(clamped), req) == as_hit(clamped)
    logits = read_of(req, logprobs=(3.5, 1.0, -2.0), off_menu_known=False)
    assert decode_read(encode_read(logits), req) == as_hit(logits)


def test_a_code_questions_reads_round_trip_with_their_after_reads() -> None:
    codes = ((100, 300), (100, 301), (101, 300))
    req = request(token_ids=(100, 101), option_groups=((100,), (101,)), read_ids=(100, 101),
                  codes=codes)  # fmt: skip
    after = (read_of(req, token_ids=(300, 301), logprobs=(-0.2, -2.0), endpoint=None),
             read_of(req, token_ids=(300,), logprobs=(-0.01,), endpoint=None))  # fmt: skip
    read = read_of(req, token_ids=(100, 101), logprobs=(-0.3, -1.5), after=after)
    assert decode_read(encode_read(read), req) == as_hit(read)
    # The same value is no answer to the request without codes, nor that one's to this.
    assert decode_read(encode_read(read), request()) is None
    assert decode_read(encode_read(read_of(request())), req) is None


def stored(req: tv.ScoringRequest, **changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = orjson.loads(encode_read(read_of(req)))
    value["read"].update(changes)
    return value


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"not json",
        b'{"format": "typevet_async.read-value/1", "read": ',  # cut short
        b"[]",
        orjson.dumps({"format": "typevet_async.read-value/0", "read": {}}),
        orjson.dumps({"format": READ_VALUE_FORMAT}),
        orjson.dumps({"format": READ_VALUE_FORMAT, "read": None}),
        b'{"format": "typevet_async.read-value/1", "read": {"logprobs": [NaN]}}',
    ],
)
def test_a_corrupt_value_is_a_miss(value: bytes) -> None:
    assert decode_read(value, request()) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"top_k": "128"},
        {"top_k": True},
        {"top_k": 128.0},
        {"top_k": 0},
        {"token_ids": [100, "101", 102]},
        {"token_ids": [100, 101, -1]},
        {"logprobs": [-0.5, -1, -3.0]},
        {"logprobs": [-0.5, -1.25]},  # not one per id
        {"logprobs": [-0.5, -1.25, 1e309]},
        {"off_menu_known": 1},
        {"policy": "guess"},
        {"prompt": None},
        {"endpoint": 5},
        {"after": [{}]},
        {"extra": 1},
    ],
    ids=repr,
)
def test_a_value_of_wrong_types_or_shape_is_a_miss(changes: dict[str, Any]) -> None:
    req = request()
    assert decode_read(orjson.dumps(stored(req, **changes)), req) is None


def test_a_missing_field_is_a_miss() -> None:
    req = request()
    value = stored(req)
    del value["read"]["policy"]
    assert decode_read(orjson.dumps(value), req) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"token_ids": [100, 101, 999]},  # an id the request did not ask for
        {"token_ids": [100, 100, 102]},  # an id twice
        {"token_ids": [100, 101], "logprobs": [-0.5, -1.0]},  # an option missing
        {"logprobs": [-0.5, 0.25, -3.0]},  # a positive logprob
        {"logprobs": [-0.01, -0.02, -0.03]},  # the candidates' mass past 1
    ],
    ids=repr,
)
def test_a_foreign_or_invalid_read_is_a_miss_never_an_answer(changes: dict[str, Any]) -> None:
    req = request()
    assert decode_read(orjson.dumps(stored(req, **changes)), req) is None


def test_another_requests_read_is_a_miss() -> None:
    other = request(token_ids=(200, 201, 202), option_groups=((200,), (201,), (202,)),
                    read_ids=(200, 201, 202))  # fmt: skip
    assert decode_read(encode_read(read_of(other)), request()) is None


def test_an_oversized_value_is_a_miss() -> None:
    req = request()
    big = read_of(req, prompt="x" * MAX_VALUE_BYTES)
    value = encode_read(big)
    assert len(value) > MAX_VALUE_BYTES
    assert decode_read(value, req) is None
    assert decode_read(bytearray(encode_read(read_of(req))), req) is None  # type: ignore[arg-type]
