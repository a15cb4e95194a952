"""The pure parts of `Session.openai_compatible`: which returned entry counts for which
control, the truncation policies' arithmetic, the probe's reading of a server's refusals, and
the decoder on real replies of llama.cpp's ``/v1/chat/completions`` (recorded by
scripts/record_replies.py --only openai_compatible)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import cattrs
import pytest

import typevet_async as tv
from typevet_async._backends.openai_compatible import AsyncOpenAICompatible
from typevet_async._backends.openai_compatible_wire import (
    decode_model_ids,
    decode_scoring,
    decode_tokens,
    scoring_body,
)
from typevet_async._core.prompts.framing import TemplateFamily
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.chat_reads import (
    ChatEntry,
    ChatServer,
    after_refusal,
    limit_from_error,
    match_options,
    normalised,
    settle_options,
    text_control_ids,
    whole_controls,
    wider,
    window_limit,
)
from typevet_async._core.reading.read_keys import canonical, probe_digest
from typevet_async._core.reading.read_values import decode_read, encode_read
from typevet_async._core.reading.readings import CandidateRead

#: OpenAI's refusal of a window above its cap (its API's wording, as its docs and errors
#: show it; no OpenAI server can be run here).
OPENAI_CAP = (
    "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got "
    "{asked} instead."
)
REPLIES = Path(__file__).resolve().parents[1] / "fixtures" / "replies" / "openai_compatible"
CONTROLS = {0: "A", 1: "B", 2: " A", 3: " B"}


def recorded(name: str) -> bytes:
    requests = json.loads((REPLIES / "requests.json").read_text())
    return (REPLIES / requests[name]["file"]).read_bytes()


def entries(*pairs: tuple[str, float]) -> tuple[ChatEntry, ...]:
    return tuple(ChatEntry(text, logprob) for text, logprob in pairs)


# -- which entry counts for which control ---------------------------------------------------


def test_an_entry_counts_with_or_without_leading_whitespace_the_likelier_kept() -> None:
    read = entries(("Hello", -0.5), (" A", -1.0), ("A", -2.0), ("\nB", -3.0), ("AB", -0.1))
    assert match_options(read, [(0,), (1,)], CONTROLS, None) == [-1.0, -3.0]


def test_undecoded_word_start_markers_count_as_whitespace() -> None:
    assert normalised("\u0120A") == normalised("\u2581A") == normalised("  A") == "A"
    read = entries(("\u2581B", -2.5))
    assert match_options(read, [(0,), (1,)], CONTROLS, None) == [None, -2.5]


def test_a_missing_option_is_none_never_zero() -> None:
    assert match_options(entries(("x", -0.1)), [(0,), (1,)], CONTROLS, None) == [None, None]


def test_ids_decide_where_the_probe_learnt_them() -> None:
    accepted = {0: frozenset({10, 12}), 1: frozenset({11})}
    read = (
        ChatEntry("A", -1.0, token_id=99),  # the text of A, another token: not A
        ChatEntry(" A", -2.0, token_id=12),
        ChatEntry("B", -3.0, token_id=11),
    )
    assert match_options(read, [(0,), (1,)], CONTROLS, accepted) == [-2.0, -3.0]
    # An entry without an id falls back to its text.
    assert match_options(entries(("A", -4.0)), [(0,)], CONTROLS, accepted) == [-4.0]


# -- the policies ---------------------------------------------------------------------------


def test_clamp_fills_a_missing_option_with_the_lowest_logprob_and_counts_it() -> None:
    read = entries(("A", -1.0), ("x", -2.0), ("y", -7.5))
    settled = settle_options([-1.0, None, None], [(0,), (1,), (5,)], read, "clamp", 20, "cap")
    assert settled.token_ids == (0, 1, 5)
    assert settled.logprobs == (-1.0, -7.5, -7.5)
    assert settled.clamped == 2


def test_every_option_present_is_exact_under_every_policy() -> None:
    for policy in ("exact", "clamp", "error"):
        settled = settle_options([-1.0, -2.0], [(0, 2), (1,)], (), policy, 20, "cap")
        assert (settled.token_ids, settled.logprobs, settled.clamped) == ((0, 1), (-1.0, -2.0), 0)


@pytest.mark.parametrize("policy", ["exact", "error"])
def test_exact_and_error_name_what_stopped_the_window(policy: Any) -> None:
    limit = window_limit(policy, 20, 20, 20, 20)
    with pytest.raises(tv.CandidateMissingError, match="top 20") as info:
        settle_options([-1.0, None], [(0,), (1, 3)], entries(("A", -1.0)), policy, 20, limit)
    assert info.value.missing == (1,)
    expected = "the server's cap of 20" if policy == "exact" else "on_missing='error'"
    assert expected in str(info.value)


def test_clamp_with_nothing_returned_is_refused() -> None:
    with pytest.raises(tv.InvalidLogprobsError, match="no logprobs"):
        settle_options([None], [(0,)], (), "clamp", 20, "cap")


def test_the_window_widens_by_32_up_to_the_ceiling() -> None:
    assert wider(20, 20, 4096) == 640
    assert wider(640, 640, 4096) == 4096
    assert wider(4096, 4096, 4096) is None
    assert wider(20, 20, 20) is None  # capped at 20
    assert wider(640, 640, None) == 20480  # exact on a server without a cap
    assert wider(20480, 9000, None) is None  # fewer returned: all it has


def test_window_limits_in_words() -> None:
    assert window_limit("exact", None, None, 262144, 262144) == "all it returns: 262144 entries"
    assert window_limit("clamp", None, 4096, 4096, 4096) == "the widest read, 4096"


# -- the probe's reading of refusals and replies --------------------------------------------


@pytest.mark.parametrize(
    ("message", "asked", "limit"),
    [
        (  # OpenAI's own wording
            "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but "
            "got 4096 instead.",
            4096,
            20,
        ),
        ("Requested sample logprobs of 4096, which is greater than max allowed: 128", 4096, 128),
        ("top_logprobs must be between 0 and 5", 4096, 5),
        ("invalid request", 4096, None),  # names no limit
        ("Unrecognized request argument supplied: chat_template_kwargs", 4096, None),
        ("logprobs are not supported", 4096, None),
        ("Expected a value <= 20", 4096, None),  # not about logprobs
        ('{"error": "HTTP 400 on top_logprobs 4096, request 123"}', 4096, None),  # no limit
        ("top_logprobs: Expected a value <= 4096, but got 5000", 4096, None),  # not below
    ],
)
def test_a_refusal_names_a_limit_or_none(message: str, asked: int, limit: int | None) -> None:
    assert limit_from_error(message, asked) == limit


def test_the_probe_steps_after_a_refusal() -> None:
    openai = json.dumps({"error": {"message": OPENAI_CAP.format(asked=4096)}})
    assert after_refusal(openai, 4096, True) == (20, True)  # the named limit, switch kept
    # A refusal naming no limit: the switch is dropped first, then the window steps down.
    assert after_refusal("invalid request", 4096, True) == (4096, False)
    assert after_refusal("invalid request", 4096, False) == (1024, False)
    assert after_refusal("invalid request", 20, False) == (10, False)
    assert after_refusal("invalid request", 1, False) is None  # refuses logprobs
    # llama.cpp's own refusal (recorded): names no limit.
    body = recorded("chat_top_logprobs_alone").decode()
    assert after_refusal(body, 20, True) == (20, False)


def test_text_controls_are_letters_and_the_words_only_when_they_came_back_whole() -> None:
    letters = text_control_ids(words=False)
    assert {"A", " A", "z", " z"} <= set(letters)
    assert "Yes" not in letters
    assert not {"0", "9"} & set(letters)  # digits: not one token in every vocabulary
    assert {"Yes", " Yes", "No", " No"} <= set(text_control_ids(words=True))
    assert len(set(letters.values())) == len(letters)


def test_recorded_probe_reads_return_letters_and_words_whole() -> None:
    letters = decode_scoring(recorded("probe_letters")).entries
    words = decode_scoring(recorded("probe_words")).entries
    assert letters is not None
    assert words is not None
    assert len(letters) == len(words) == 64
    assert {"A", "B"} <= set(whole_controls(letters))  # in the top 64 of this base model
    assert {"Yes", "No"} <= set(whole_controls(words))


def test_a_recorded_read_decodes_with_ids_and_its_texts_from_bytes() -> None:
    read = decode_scoring(recorded("chat_top20"))
    assert read.entries is not None
    assert len(read.entries) == 20
    assert all(entry.token_id is not None for entry in read.entries)
    assert read.prompt_tokens > 0
    raw = json.loads(recorded("chat_top20"))["choices"][0]["logprobs"]["content"][0]
    by_text = {entry["token"]: entry["logprob"] for entry in raw["top_logprobs"]}
    values = match_options(read.entries, [(0,), (1,)], CONTROLS, None)
    for value, letter in zip(values, "AB", strict=True):
        expected = max((lp for t, lp in by_text.items() if t.strip() == letter), default=None)
        assert value == expected


@pytest.mark.parametrize("name", ["chat_no_logprobs", "chat_no_top_logprobs"])
def test_a_reply_without_logprobs_has_no_entries(name: str) -> None:
    assert decode_scoring(recorded(name)).entries is None


def test_a_partial_character_keeps_the_token_text() -> None:
    reply = {
        "choices": [
            {
                "logprobs": {
                    "content": [
                        {
                            "token": "x",
                            "logprob": -1.0,
                            "top_logprobs": [
                                {"token": "\ufffd", "bytes": [226, 150], "logprob": -1.0},
                                {"token": "?", "bytes": [65], "logprob": -2.0},
                            ],
                        }
                    ]
                }
            }
        ]
    }
    read = decode_scoring(json.dumps(reply).encode())
    assert read.entries is not None
    assert [entry.text for entry in read.entries] == ["\ufffd", "A"]


def test_vllms_token_ids_are_read_as_ids() -> None:
    reply = {
        "choices": [
            {
                "logprobs": {
                    "content": [
                        {
                            "top_logprobs": [
                                {"token": "token_id:236776", "logprob": -1.0, "bytes": [65]},
                                {"token": "token_id:562", "logprob": -2.0},
                                {"token": "token_id:x1", "logprob": -3.0},
                            ]
                        }
                    ]
                }
            }
        ]
    }
    read = decode_scoring(json.dumps(reply).encode())
    assert read.entries == (
        ChatEntry("A", -1.0, 236776),
        ChatEntry("", -2.0, 562),
        ChatEntry("token_id:x1", -3.0),
    )


@pytest.mark.parametrize(
    "top",
    [
        {"token": "A", "logprob": "-1"},
        {"token": "A", "logprob": -1, "bytes": [256]},
        {"token": "A", "logprob": -1, "id": -3},
        {"logprob": -1},
    ],
)
def test_a_malformed_entry_is_a_protocol_error(top: dict[str, Any]) -> None:
    reply = {"choices": [{"logprobs": {"content": [{"top_logprobs": [top]}]}}]}
    with pytest.raises(tv.ProtocolError):
        decode_scoring(json.dumps(reply).encode())


def test_recorded_models_and_tokenize() -> None:
    assert decode_model_ids(recorded("models"))[0].endswith(".gguf")
    assert decode_tokens(recorded("tokenize")) == [562]  # " A" on Gemma 3


def test_the_scoring_body() -> None:
    body = scoring_body("m", [Message("user", "hi")], 20, thinking_switch=True)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 20,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert "chat_template_kwargs" not in scoring_body("m", [], 5, thinking_switch=False)


# -- configuration, the environment, the read cache -----------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base_url": "not a url"}, "base_url"),
        ({"base_url": "http://h/v1", "top_logprobs": 0}, "top_logprobs"),
        ({"base_url": "http://h/v1", "on_missing": "maybe"}, "on_missing"),
        ({"base_url": "http://h/v1", "model": ""}, "model"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_sent(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(tv.ConfigurationError, match=message):
        tv.OpenAICompatibleConfig(**options)


def test_the_factory_and_the_environment_build_the_backend() -> None:
    session = tv.Session.openai_compatible("http://127.0.0.1:9/v1", top_logprobs=5)
    assert isinstance(session._backend, AsyncOpenAICompatible)
    assert session._backend.config.top_logprobs == 5
    backend = tv.Session.from_env(
        {"TYPEVET_BACKEND": "openai_compatible", "TYPEVET_BASE_URL": "http://h/v1"}
    ).backend
    assert isinstance(backend, AsyncOpenAICompatible)
    assert backend.config.on_missing == "clamp"  # the default: a server capped at 20 answers
    with pytest.raises(tv.ConfigurationError, match="TYPEVET_BASE_URL"):
        tv.Session.from_env({"TYPEVET_BACKEND": "openai_compatible"})


def test_a_clamped_count_survives_the_read_cache() -> None:
    question = tv.Choice({"a": None, "b": None, "c": None}, instructions="Which?")
    request = ScoringRequest(
        "q", question, (Message("user", "x"),), None, ("A", "B", "C"), (0, 1, 2)
    )
    read = CandidateRead(
        (0, 1, 2), (-1.0, -5.0, -5.0), 20, policy="clamp", truncated=True, clamped=2
    )
    hit = decode_read(encode_read(read), request)
    assert hit is not None
    assert (hit.truncated, hit.clamped) == (True, 2)
    assert math.isclose(hit.logprobs[1], -5.0)


def test_a_probe_without_a_chat_server_keeps_its_digest() -> None:
    probe = tv.Probe(TemplateFamily.GEMMA3, "r", {"A": 1}, 10)
    with_server = tv.Probe(
        TemplateFamily.GEMMA3, "r", {"A": 1}, 10, chat_server=ChatServer(20, True, False)
    )
    assert probe_digest(probe) != probe_digest(with_server)
    # The other backends' read keys are as they were before probes had a chat server.
    learnt = cattrs.Converter().unstructure(probe)
    del learnt["slots"], learnt["context_tokens"], learnt["chat_server"]
    assert probe_digest(probe) == hashlib.sha256(canonical(learnt)).hexdigest()
