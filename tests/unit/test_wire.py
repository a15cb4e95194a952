"""Every reply decoder against real recorded replies of both servers, mutated at random.

The replies in tests/fixtures/replies/ were recorded from the real servers by
scripts/record_replies.py (llama.cpp through xllamacpp and vLLM on CPU, Gemma 3 270M, the
request bodies the SDK builds). Hypothesis changes the type or value of a field at a random
path, deletes fields, adds fields, duplicates and swaps list entries, swaps token ids and
truncates the bytes. Each mutated reply must decode to exactly what a plain-Python reading of
the same JSON under the protocol's rules gives (`Reference`), and to the original's result
when the mutation touched nothing the SDK reads; or it must raise a `tv.TypevetError`, and
then the reference must refuse it too. Any other exception fails the test.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import typevet_async as tv
from typevet_async._backends import llama_cpp_wire, system_one_wire, vllm_wire
from typevet_async._backends.openai_chat import decode_chat_output
from typevet_async._core.prompts.questions import Choice, Noul
from typevet_async._core.reading.readings import LOGPROB_SLACK, read_entries, validated_logprobs
from typevet_async._core.wires.system_one import SYSTEM_ONE_SLACK, questions_from_system_one

REPLIES = Path(__file__).resolve().parents[1] / "fixtures" / "replies"
VOCAB = 262_144
EXAMPLES = 2000

Path_ = tuple[str | int, ...]


def recorded(server: str, name: str) -> bytes:
    requests = json.loads((REPLIES / server / "requests.json").read_text())
    data = (REPLIES / server / requests[name]["file"]).read_bytes()
    return gzip.decompress(data) if requests[name]["file"].endswith(".gz") else data


def request_body(server: str, name: str) -> Any:
    return json.loads((REPLIES / server / "requests.json").read_text())[name]["body"]


# -- a plain-Python reading of each reply, rule by rule ------------------------------------


class Refused(Exception):
    """The reference refuses the reply."""


def strict_json(raw: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise Refused(constant)

    try:
        return json.loads(raw, parse_constant=refuse)
    except (ValueError, RecursionError) as error:
        raise Refused(str(error)) from None


def obj(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Refused("not an object")
    return value


def array(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise Refused("not an array")
    return value


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise Refused("not a string")
    return value


def integer(value: Any, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise Refused("not an integer in range")
    return value


def number(value: Any) -> float:
    if type(value) not in (int, float):
        raise Refused("not a number")
    try:
        result = float(value)
    except OverflowError:
        raise Refused("out of range") from None
    if not math.isfinite(result):
        raise Refused("out of range")
    return result


def boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise Refused("not a boolean")
    return value


def field(doc: dict[str, Any], key: str, read: Callable[[Any], Any], default: Any) -> Any:
    """An optional field: ``default`` when absent, else ``read`` of its value."""
    return read(doc[key]) if key in doc else default


def required(doc: dict[str, Any], key: str, read: Callable[[Any], Any]) -> Any:
    if key not in doc:
        raise Refused(f"no {key}")
    return read(doc[key])


def nullable(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else read(value)


def entries_by_id(entries: list[tuple[int, float]], vocab: int | None) -> dict[int, float]:
    out: dict[int, float] = {}
    for token_id, logprob in entries:
        if token_id in out or (vocab is not None and token_id >= vocab):
            raise Refused("repeated id, or outside the vocabulary")
        if logprob > LOGPROB_SLACK:
            raise Refused("positive logprob")
        out[token_id] = logprob
    return out


def ref_completion(raw: bytes) -> Any:
    requested = request_body("llama_cpp", "completion_top64")["n_probs"]
    doc = obj(strict_json(raw))

    def entry(value: Any) -> tuple[int, float]:
        item = obj(value)
        return required(item, "id", integer), required(item, "logprob", number)

    def position(value: Any) -> list[tuple[int, float]]:
        return [entry(item) for item in required(obj(value), "top_logprobs", array)]

    positions = [position(item) for item in required(doc, "completion_probabilities", array)]
    settings_ = field(doc, "generation_settings", obj, {})
    echoed = field(settings_, "n_probs", nullable(integer), None)
    prompt_tokens = field(doc, "tokens_evaluated", integer, 0)
    cached = field(field(doc, "timings", obj, {}), "cache_n", integer, 0)
    if (echoed is not None and echoed != requested) or not positions:
        raise Refused("echo, or no position")
    if len(positions[0]) != min(requested, VOCAB):
        raise Refused("not the entries asked for")
    return entries_by_id(positions[0], VOCAB), prompt_tokens, cached


def ref_llama_tokens(raw: bytes) -> Any:
    def token(value: Any) -> int:
        return required(value, "id", integer) if isinstance(value, dict) else integer(value)

    return [token(item) for item in required(obj(strict_json(raw)), "tokens", array)]


def ref_llama_pieces(raw: bytes) -> Any:
    def byte(value: Any) -> int:
        if integer(value) > 255:
            raise Refused("not a byte")
        return int(value)

    def piece(value: Any) -> bytes:
        return value.encode() if isinstance(value, str) else bytes(map(byte, array(value)))

    def token(value: Any) -> tuple[int, bytes]:
        item = obj(value)
        return required(item, "id", integer), required(item, "piece", piece)

    return [token(item) for item in required(obj(strict_json(raw)), "tokens", array)]


def ref_llama_rendered(raw: bytes) -> Any:
    return required(obj(strict_json(raw)), "prompt", string)


def ref_llama_models(raw: bytes) -> Any:
    def model(value: Any) -> tuple[list[str], int | None]:
        item = obj(value)
        names = [field(item, "id", string, ""), *field(item, "aliases", strings, [])]
        meta = field(item, "meta", nullable(obj), None)
        vocab = None if meta is None else required(meta, "n_vocab", lambda v: integer(v, 1))
        return names, vocab

    models = [model(item) for item in required(obj(strict_json(raw)), "data", array)]
    if not models or models[0][1] is None:
        raise Refused("no n_vocab")
    return models[0][1], tuple(name for names, _ in models for name in names if name)


def strings(value: Any) -> list[str]:
    return [string(item) for item in array(value)]


def ref_llama_props(raw: bytes) -> Any:
    doc = obj(strict_json(raw))
    vision = field(field(doc, "modalities", obj, {}), "vision", boolean, False)
    marker = field(doc, "media_marker", nullable(string), None)
    slots = field(doc, "total_slots", nullable(lambda value: integer(value, 1)), None)
    template = field(doc, "chat_template", string, "")
    bos = field(doc, "bos_token", nullable(string), None)
    slot = field(doc, "default_generation_settings", obj, {})
    context = field(slot, "n_ctx", nullable(lambda value: integer(value, 1)), None)
    return llama_cpp_wire.Props(vision, marker or None, slots, template, bos or None, context)


def ref_chat_output(raw: bytes) -> Any:
    doc = obj(strict_json(raw))

    def choice(value: Any) -> tuple[str, str]:
        item = obj(value)
        message = required(item, "message", obj)
        content = field(message, "content", nullable(string), None)
        return content or "", field(item, "finish_reason", nullable(string), None) or ""

    choices = [choice(item) for item in required(doc, "choices", array)]
    usage = field(doc, "usage", nullable(obj), None) or {}
    counts = (
        field(usage, "prompt_tokens", integer, 0),
        field(usage, "completion_tokens", integer, 0),
    )
    if not choices:
        raise Refused("no choices")
    return tv.ChatOutput(*choices[0], *counts)


def token_id(value: Any) -> int:
    text = string(value)
    digits = text.removeprefix("token_id:")
    if digits == text or not digits or any(c not in "0123456789" for c in digits):
        raise Refused("not token_id:N")
    return int(digits)


def ref_vllm_scoring(raw: bytes) -> Any:
    ids = request_body("vllm", "chat_scoring")["logprob_token_ids"]
    doc = obj(strict_json(raw))

    def top(value: Any) -> tuple[str, float]:
        item = obj(value)
        return required(item, "token", string), required(item, "logprob", number)

    def position(value: Any) -> tuple[str, list[tuple[str, float]]]:
        item = obj(value)
        return required(item, "token", string), [
            top(e) for e in required(item, "top_logprobs", array)
        ]

    def choice(value: Any) -> list[Any]:
        logprobs = required(obj(value), "logprobs", obj)
        return [position(item) for item in required(logprobs, "content", array)]

    choices = [choice(item) for item in required(doc, "choices", array)]
    usage = field(doc, "usage", nullable(obj), None) or {}
    prompt_tokens = field(usage, "prompt_tokens", integer, 0)
    details = field(usage, "prompt_tokens_details", nullable(obj), None) or {}
    cached = field(details, "cached_tokens", nullable(integer), None) or 0
    if not choices or not choices[0]:
        raise Refused("no position")
    sampled_token, entries = choices[0][0]
    sampled = token_id(sampled_token)
    parsed = [(token_id(token), logprob) for token, logprob in entries]
    if any(tid not in ids and tid != sampled for tid, _ in parsed):
        raise Refused("an id neither asked for nor sampled")
    kept = [(tid, logprob) for tid, logprob in parsed if tid in ids]
    return entries_by_id(kept, None), prompt_tokens, cached


def ref_vllm_tokens(raw: bytes) -> Any:
    return [integer(item) for item in required(obj(strict_json(raw)), "tokens", array)]


def ref_vllm_rendered(raw: bytes) -> Any:
    pieces = field(obj(strict_json(raw)), "token_strs", nullable(strings), None)
    if pieces is None:
        raise Refused("no token_strs")
    return "".join(pieces)


def sdk_vllm_models(raw: bytes) -> Any:
    """The served ids, and the recorded model's ``max_model_len`` (the probe's context)."""
    return vllm_wire.decode_model_ids(raw), vllm_wire.decode_max_model_len(raw, "gemma3-270m")


def ref_vllm_models(raw: bytes) -> Any:
    models = [obj(item) for item in required(obj(strict_json(raw)), "data", array)]
    found = [
        (
            required(item, "id", string),
            field(item, "max_model_len", nullable(lambda value: integer(value, 1)), None),
        )
        for item in models
    ]
    context = next((length for name, length in found if name == "gemma3-270m"), None)
    return tuple(name for name, _ in found), context


def system_one_questions() -> list[tuple[str, tv.Question]]:
    return list(questions_from_system_one(request_body("system_one", "judgment")).items())


def probability(value: Any) -> float:
    result = number(value)
    if not 0.0 <= result <= 1.0:
        raise Refused("not a probability")
    return result


def ref_system_one(raw: bytes) -> Any:
    """The answers' probabilities in option order, and the input tokens (the gateway's
    extension stripped: `without_extension`)."""
    doc = obj(strict_json(raw))
    sent = required(doc, "answers", obj)
    tokens = required(required(doc, "usage", obj), "input_tokens", integer)
    kinds = {"noul", "choice", "score"}
    readings: dict[str, tuple[str, dict[str, float], Any]] = {}
    for question_id, answer in sent.items():
        answer = obj(answer)
        kind = required(answer, "type", string)
        if kind not in kinds:
            raise Refused("an answer type System One does not have")
        if kind == "noul":
            p = required(answer, "noul", probability)
            readings[question_id] = (kind, {"false": 1.0 - p, "true": p}, None, None)
            continue
        named = required(
            answer,
            "choice" if kind == "choice" else "score",
            (string if kind == "choice" else number),
        )
        confidence = required(answer, "confidence", probability)
        probabilities = {
            k: probability(v) for k, v in required(answer, "probabilities", obj).items()
        }
        readings[question_id] = (kind, probabilities, named, confidence)
    questions = system_one_questions()
    if set(readings) - {question_id for question_id, _ in questions}:
        raise Refused("answers to questions not asked")
    result = {}
    for question_id, question in questions:
        if question_id not in readings:
            raise Refused("an answer missing")
        kind, probabilities, named, confidence = readings[question_id]
        if isinstance(question, Noul):
            keys, wanted = ["false", "true"], "noul"
        elif isinstance(question, Choice):
            keys, wanted = list(question.labels), "choice"
        else:
            keys, wanted = [str(n) for n in range(len(question.levels))], "score"
        if kind != wanted or set(probabilities) != set(keys):
            raise Refused("another type, or other options")
        values = tuple(probabilities[key] for key in keys)
        # rounded to d decimals (2 <= d <= 6): each value may be off by half of 10^-d
        rounded = next(
            (0.5 / 10**d for d in range(2, 7) if all(abs(v - round(v, d)) < 1e-7 for v in values)),
            0.0,
        )
        total = math.fsum(values)
        if abs(total - 1.0) > SYSTEM_ONE_SLACK + len(values) * rounded:
            raise Refused("not a distribution")
        top = max(values)
        if kind == "choice" and probabilities.get(named, -1.0) < top - SYSTEM_ONE_SLACK - rounded:
            raise Refused("the choice is not the most probable label")
        expected = math.fsum(level * p for level, p in enumerate(values))
        allowed = SYSTEM_ONE_SLACK + rounded * (1 + len(values) * (len(values) - 1) / 2)
        if kind == "score" and abs(named - expected) > allowed:
            raise Refused("the score is not the expected level")
        if abs(total - 1.0) > 1e-9:
            values = tuple(v / total for v in values)
        if confidence is None:  # a Noul's: the reference formula, (max - 1/2) / (1 - 1/2)
            confidence = min(1.0, max(0.0, (max(values) - 0.5) / 0.5))
        result[question_id] = (values, confidence)
    return result, tokens


def ref_system_one_models(raw: bytes) -> Any:
    models = required(obj(strict_json(raw)), "models", array)
    return tuple(required(obj(item), "name", string) for item in models)


# -- the SDK's decoding of each reply (the decoder, then the value rules the backend applies)


def sdk_completion(raw: bytes) -> Any:
    reply = llama_cpp_wire.decode_completion(raw, 64)
    return read_entries(reply.top, VOCAB), reply.prompt_tokens, reply.cached_tokens


def sdk_system_one(raw: bytes) -> Any:
    judgment = system_one_wire.decode_judgment(raw, system_one_questions())
    answers = {
        qid: (tuple(answer.probabilities.values()), answer.confidence)
        for qid, answer in judgment.items()
    }
    return answers, judgment.usage.prompt_tokens


def without_extension(raw: bytes) -> bytes:
    """The gateway's reply as any System One server would send it: no ``x_typevet`` field (nor
    ``typevet``, as the gateway that was recorded named it; its own test:
    tests/unit/test_system_one_backend.py)."""
    doc = json.loads(raw)
    doc.pop("x_typevet", None)
    doc.pop("typevet", None)
    return json.dumps(doc).encode()


def sdk_vllm_scoring(raw: bytes) -> Any:
    ids = request_body("vllm", "chat_scoring")["logprob_token_ids"]
    reply = vllm_wire.decode_scoring(raw, ids)
    return validated_logprobs(reply.top), reply.prompt_tokens, reply.cached_tokens


@attrs.frozen
class Endpoint:
    server: str
    name: str
    decode: Callable[[bytes], Any]
    reference: Callable[[bytes], Any]
    #: The paths the SDK reads ("*": any list index); a mutation elsewhere is irrelevant.
    used: tuple[Path_, ...]
    #: The recorded reply as the test mutates it.
    prepare: Callable[[bytes], bytes] = bytes

    @property
    def raw(self) -> bytes:
        return self.prepare(recorded(self.server, self.name))


CHAT_USED: tuple[Path_, ...] = (
    ("choices", "*", "message", "content"),
    ("choices", "*", "finish_reason"),
    ("usage", "prompt_tokens"),
    ("usage", "completion_tokens"),
)
ENDPOINTS = [
    Endpoint(
        "llama_cpp",
        "completion_top64",
        sdk_completion,
        ref_completion,
        (
            ("completion_probabilities", "*", "top_logprobs", "*", "id"),
            ("completion_probabilities", "*", "top_logprobs", "*", "logprob"),
            ("generation_settings", "n_probs"),
            ("tokens_evaluated",),
            ("timings", "cache_n"),
        ),
    ),
    Endpoint(
        "llama_cpp", "tokenize", llama_cpp_wire.decode_tokens, ref_llama_tokens,
        (("tokens", "*", "id"),),
    ),
    Endpoint(
        "llama_cpp", "tokenize_pieces", llama_cpp_wire.decode_pieces, ref_llama_pieces,
        (("tokens", "*", "id"), ("tokens", "*", "piece")),
    ),
    Endpoint(
        "llama_cpp", "apply_template", llama_cpp_wire.decode_rendered, ref_llama_rendered,
        (("prompt",),),
    ),
    Endpoint(
        "llama_cpp", "models", llama_cpp_wire.decode_models, ref_llama_models,
        (("data", "*", "id"), ("data", "*", "aliases", "*"), ("data", "*", "meta", "n_vocab")),
    ),
    Endpoint(
        "llama_cpp", "props", llama_cpp_wire.decode_props, ref_llama_props,
        (("modalities", "vision"), ("media_marker",), ("total_slots",), ("chat_template",),
         ("bos_token",), ("default_generation_settings", "n_ctx")),
    ),
    Endpoint("llama_cpp", "chat_generation", decode_chat_output, ref_chat_output, CHAT_USED),
    Endpoint(
        "vllm",
        "chat_scoring",
        sdk_vllm_scoring,
        ref_vllm_scoring,
        (
            ("choices", "*", "logprobs", "content", "*", "token"),
            ("choices", "*", "logprobs", "content", "*", "top_logprobs", "*", "token"),
            ("choices", "*", "logprobs", "content", "*", "top_logprobs", "*", "logprob"),
            ("usage", "prompt_tokens"),
            ("usage", "prompt_tokens_details", "cached_tokens"),
        ),
    ),
    Endpoint("vllm", "chat_generation", decode_chat_output, ref_chat_output, CHAT_USED),
    Endpoint(
        "vllm", "tokenize_prompt", vllm_wire.decode_tokens, ref_vllm_tokens, (("tokens", "*"),)
    ),
    Endpoint(
        "vllm", "tokenize_messages", vllm_wire.decode_rendered, ref_vllm_rendered,
        (("token_strs", "*"),),
    ),
    Endpoint(
        "vllm", "models", sdk_vllm_models, ref_vllm_models,
        (("data", "*", "id"), ("data", "*", "max_model_len")),
    ),
    Endpoint(
        "system_one", "judgment", sdk_system_one, ref_system_one,
        (
            ("answers",),
            ("usage", "input_tokens"),
        ),
        without_extension,
    ),
    Endpoint(
        "system_one", "models", system_one_wire.decode_model_names, ref_system_one_models,
        (("models", "*", "name"),),
    ),
]  # fmt: skip
BY_ID = {f"{e.server}/{e.name}": e for e in ENDPOINTS}


def relevant(path: Path_, used: tuple[Path_, ...]) -> bool:
    """Whether a change at ``path`` can change what the SDK reads: ``path`` lies on a used
    path, or under one."""

    def matches(a: Path_, pattern: Path_) -> bool:
        pairs = zip(a, pattern, strict=False)  # a shorter path lies on the pattern
        return all((p == "*" and isinstance(x, int)) or p == x for x, p in pairs)

    return any(matches(path, pattern) for pattern in used)


def paths(value: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    yield prefix, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def at(doc: Any, path: Path_) -> Any:
    for key in path:
        doc = doc[key]
    return doc


# -- mutations --------------------------------------------------------------------------------

#: Values a server could plausibly send in the wrong place, beside random JSON.
SPECIAL = st.sampled_from(
    [100.9, 100.0, "100", True, False, None, -1, 0, 1, 2**63, 2**70, -0.0, 1e308, 1e-320,
     0.5, 3e-7, -1e9, "", "abc", "token_id:5", "token_id:-1", "token_id:236771", [], {}, [1],
     {"id": 1}, VOCAB, VOCAB - 1, 64, 4096]
)  # fmt: skip
#: No lone surrogates: they are not Unicode, and a strict decoder refuses them anywhere.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_VALUES = (
    SPECIAL
    | SCALARS
    | st.lists(SCALARS, max_size=3)
    | st.dictionaries(TEXT, SCALARS | st.lists(SCALARS, max_size=2), max_size=2)
)


@attrs.frozen
class Mutated:
    raw: bytes
    #: Where the change was; None for a change that may touch anything (truncation).
    path: Path_ | None
    description: str

    @property
    def kind(self) -> str:
        return self.description.split()[0]


def nudged(value: Any) -> list[Any]:
    """Nearby values of another type or range: what a server bug would send instead."""
    if isinstance(value, bool):
        return [not value, int(value), str(value).lower()]
    if isinstance(value, int):
        return [value + 1, value - 1, -value - 1, float(value), value + 0.9, str(value),
                value + VOCAB, value > 0]  # fmt: skip
    if isinstance(value, float):
        return [-value, value + 1.0, value / 2, value * 2, int(value), str(value), abs(value)]
    if isinstance(value, str):
        return [value + "x", value[:-1], value.upper(), int(value) if value.isdigit() else 0]
    return [None]


@attrs.frozen
class Shape:
    """Where a recorded reply can be mutated: computed once per endpoint."""

    raw: bytes
    #: Every path but the root, and those on or under a path the SDK reads.
    every: tuple[Path_, ...]
    read: tuple[Path_, ...]
    #: The paths on or under each path the SDK reads (one group per used path).
    read_groups: tuple[tuple[Path_, ...], ...]
    objects: tuple[Path_, ...]
    #: Non-empty containers; lists of two or more objects (whose fields can be swapped).
    containers: tuple[Path_, ...]
    records: tuple[Path_, ...]
    names: tuple[str, ...]

    @classmethod
    def of(cls, endpoint: Endpoint) -> Shape:
        raw = endpoint.raw
        found = [(path, value) for path, value in paths(json.loads(raw)) if path]
        every = tuple(path for path, _ in found)
        return cls(
            raw,
            every,
            tuple(path for path in every if relevant(path, endpoint.used)) or every,
            tuple(
                group
                for pattern in endpoint.used
                if (group := tuple(path for path in every if relevant(path, (pattern,))))
            ),
            ((), *(p for p, v in found if isinstance(v, dict))),
            ((), *(p for p, v in found if isinstance(v, dict | list) and v)),
            tuple(
                p for p, v in found
                if isinstance(v, list) and len(v) > 1 and all(isinstance(e, dict) for e in v)
            ),
            tuple(sorted({key for path in every for key in path if isinstance(key, str)})),
        )  # fmt: skip


SHAPES: dict[str, Shape] = {}


def shape(endpoint: Endpoint) -> Shape:
    key = f"{endpoint.server}/{endpoint.name}"
    if key not in SHAPES:
        SHAPES[key] = Shape.of(endpoint)
    return SHAPES[key]


KINDS = ["replace", "nudge", "delete", "add", "duplicate", "swap", "swap_fields", "truncate"]


@st.composite
def mutations(draw: st.DrawFn, endpoint: Endpoint) -> Mutated:
    where = shape(endpoint)
    raw = where.raw
    kind = draw(st.sampled_from([k for k in KINDS if k != "swap_fields" or where.records]))
    if kind == "truncate":
        cut = draw(st.integers(min_value=0, max_value=len(raw) - 1))
        return Mutated(raw[:cut], None, f"truncate to {cut} bytes")
    doc = json.loads(raw)  # a fresh copy to change
    # Half the time on or under a path the SDK reads (each such path equally often, however
    # many entries it has), else anywhere.
    pool = draw(st.sampled_from(where.read_groups)) if draw(st.booleans()) else where.every
    if kind in ("replace", "nudge"):
        if draw(st.integers(0, 49)) == 0:
            new = draw(JSON_VALUES)
            return Mutated(json.dumps(new).encode(), (), f"{kind} the whole body by {new!r}")
        path = draw(st.sampled_from(pool))
        parent = at(doc, path[:-1])
        value = parent[path[-1]]
        new = draw(st.sampled_from(nudged(value))) if kind == "nudge" else draw(JSON_VALUES)
        parent[path[-1]] = new
        return Mutated(json.dumps(doc).encode(), path, f"{kind} {path} = {new!r}")
    if kind == "delete":
        path = draw(st.sampled_from(pool))
        del at(doc, path[:-1])[path[-1]]
        return Mutated(json.dumps(doc).encode(), path, f"delete {path}")
    if kind == "add":
        path = draw(st.sampled_from(where.objects))
        key = draw(st.sampled_from(where.names) | TEXT)
        at(doc, path)[key] = draw(JSON_VALUES)
        return Mutated(json.dumps(doc).encode(), (*path, key), f"add {(*path, key)}")
    lists = [p for p in where.containers if isinstance(at(doc, p), list)]
    if kind == "swap_fields":
        lists = list(where.records)
    if not lists:  # a reply with no list to change: change a field instead
        path = draw(st.sampled_from(pool))
        at(doc, path[:-1])[path[-1]] = draw(JSON_VALUES)
        return Mutated(json.dumps(doc).encode(), path, f"replace {path}")
    read_lists = [p for p in lists if p in where.read]
    path = draw(st.sampled_from(read_lists if read_lists and draw(st.booleans()) else lists))
    target = at(doc, path)
    i = draw(st.integers(min_value=0, max_value=len(target) - 1))
    j = draw(st.integers(min_value=0, max_value=len(target) - 1))
    if kind == "duplicate":
        target.insert(j, json.loads(json.dumps(target[i])))
        return Mutated(json.dumps(doc).encode(), (*path, min(i, j)), f"duplicate {path}[{i}]")
    if kind == "swap":
        target[i], target[j] = target[j], target[i]
        return Mutated(json.dumps(doc).encode(), (*path, min(i, j)), f"swap {path}[{i}, {j}]")
    # swap_fields: exchange one field between two entries (their ids, tokens or logprobs)
    first, second = target[i], target[j]
    shared = sorted(set(first) & set(second))
    if not shared:
        return Mutated(raw, (), "unchanged")
    key = draw(st.sampled_from(shared))
    first[key], second[key] = second[key], first[key]
    return Mutated(json.dumps(doc).encode(), (*path, min(i, j), key), f"swap_fields {path}.{key}")


def outcome(decode: Callable[[bytes], Any], raw: bytes) -> Any:
    """The decoded result, or the `TypevetError` class; anything else fails the test."""
    failure: tv.TypevetError | None = None
    try:
        return decode(raw)
    except tv.TypevetError as error:
        failure = error
    assert isinstance(failure, tv.ProtocolError), repr(failure)  # InvalidLogprobsError is one
    assert failure.payload is None or len(failure.payload) <= 2048
    return tv.TypevetError


def expected(reference: Callable[[bytes], Any], raw: bytes) -> Any:
    try:
        return reference(raw)
    except Refused:
        return tv.TypevetError


def check(endpoint: Endpoint, mutated: Mutated) -> None:
    result = outcome(endpoint.decode, mutated.raw)
    assert result == expected(endpoint.reference, mutated.raw), mutated.description
    irrelevant = mutated.path not in (None, ()) and not relevant(mutated.path, endpoint.used)
    if irrelevant:
        baseline = endpoint.decode(endpoint.raw)
        assert result == baseline, f"irrelevant mutation changed the result: {mutated}"
    verdict = "refused" if result is tv.TypevetError else "decoded"
    event(f"{'irrelevant' if irrelevant else 'relevant'} {mutated.kind}: {verdict}")


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=list(BY_ID))
def test_each_recorded_reply_decodes_to_its_reference_reading(endpoint: Endpoint) -> None:
    result = endpoint.decode(endpoint.raw)
    assert result == endpoint.reference(endpoint.raw)


def test_the_recorded_top_4096_read_decodes_like_a_plain_json_reading() -> None:
    raw = recorded("llama_cpp", "completion_top4096")
    reply = llama_cpp_wire.decode_completion(raw, 4096)
    payload = json.loads(raw)
    top = payload["completion_probabilities"][0]["top_logprobs"]
    assert tuple(reply.top.pairs()) == tuple((item["id"], item["logprob"]) for item in top)
    assert (reply.prompt_tokens, reply.cached_tokens) == (
        payload["tokens_evaluated"],
        payload["timings"]["cache_n"],
    )
    assert len(read_entries(reply.top, VOCAB)) == 4096


def mutation_test(key: str, examples: int = EXAMPLES) -> Callable[[], None]:
    endpoint = BY_ID[key]

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutations(endpoint))
    def test(mutated: Mutated) -> None:
        check(endpoint, mutated)

    test.__name__ = f"test_mutated_{key.replace('/', '_')}_decodes_exactly_or_is_refused"
    return test


#: Replies of one to four fields: fewer cases cover every path many times over.
FEW = EXAMPLES // 2

test_mutated_llama_cpp_completion = mutation_test("llama_cpp/completion_top64")
test_mutated_llama_cpp_tokenize = mutation_test("llama_cpp/tokenize", FEW)
test_mutated_llama_cpp_apply_template = mutation_test("llama_cpp/apply_template", FEW)
test_mutated_llama_cpp_models = mutation_test("llama_cpp/models")
test_mutated_llama_cpp_props = mutation_test("llama_cpp/props")
test_mutated_llama_cpp_chat_generation = mutation_test("llama_cpp/chat_generation")
test_mutated_vllm_chat_scoring = mutation_test("vllm/chat_scoring")
test_mutated_vllm_chat_generation = mutation_test("vllm/chat_generation")
test_mutated_vllm_tokenize_prompt = mutation_test("vllm/tokenize_prompt", FEW)
test_mutated_vllm_tokenize_messages = mutation_test("vllm/tokenize_messages")
test_mutated_vllm_models = mutation_test("vllm/models")
test_mutated_system_one_judgment = mutation_test("system_one/judgment")
test_mutated_system_one_models = mutation_test("system_one/models", FEW)
