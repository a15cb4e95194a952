"""llama.cpp's HTTP server: template probe, control tokenization and exact top-K scoring reads.

Pure functions build each request body and interpret each response; `AsyncLlamaCpp` only
awaits between them. A scoring read asks for the top K logprobs at the answer position
(``n_predict: 0``, pre-sampling probabilities, so they are full-vocabulary log-softmax values).
If every candidate is among them the read is exact; otherwise it reads again with a larger K,
up to the whole vocabulary. A missing candidate is never estimated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from typevet_async.backends.http import HttpClient
from typevet_async.backends.openai_chat import (
    NO_THINKING,
    json_schema_response_format,
    parse_chat_output,
    user_message,
)
from typevet_async.core.controls import DIGITS, control_token_ids
from typevet_async.core.framing import PROBE_MESSAGE, classify_template
from typevet_async.core.generation import ChatOutput
from typevet_async.core.readings import CandidateRead, TopLogprobs, find_candidates
from typevet_async.core.scoring import Probe, ScoringRequest
from typevet_async.errors import InvalidInputError, ProtocolError
from typevet_async.fanout import gather_in_order
from typevet_async.images import Image

__all__ = [
    "DEFAULT_TOP_K",
    "AsyncLlamaCpp",
    "completion_body",
    "next_top_k",
    "parse_completion",
]

#: llama.cpp sums the softmax normaliser in float32 in an order that depends on n_probs, so a
#: small-K read's logprobs differ from a whole-vocabulary read's (measured: up to 3e-4 at
#: K=256, 1e-4 at 2048). From K=4096 they were bit-identical on every prompt we measured,
#: for about 30 ms more than K=64 per read (whole vocabulary: about 3 s). See the README.
DEFAULT_TOP_K = 4096
#: Each escalation asks for this many times more entries (capped at the vocabulary).
ESCALATION_FACTOR = 32


def completion_body(prompt: str, top_k: int, *, cache_prompt: bool) -> dict[str, Any]:
    """A one-position read: no tokens generated, the top-K full-vocabulary logprobs returned."""
    return {
        "prompt": prompt,
        "n_predict": 0,
        "n_probs": top_k,
        "post_sampling_probs": False,
        "cache_prompt": cache_prompt,
        "return_tokens": False,
    }


def _field(payload: Any, *path: str | int) -> Any:
    value = payload
    for key in path:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            dotted = ".".join(str(part) for part in path)
            raise ProtocolError(f"response has no {dotted}", payload=payload) from None
    return value


def parse_completion(payload: Any, requested: int) -> tuple[TopLogprobs, int, int]:
    """The top logprobs at the first position, prompt tokens and cached prompt tokens."""
    echoed = (
        payload.get("generation_settings", {}).get("n_probs") if isinstance(payload, dict) else None
    )
    if echoed is not None and echoed != requested:
        raise ProtocolError(f"asked for n_probs {requested}, server echoed {echoed}")
    top = _field(payload, "completion_probabilities", 0, "top_logprobs")
    if not isinstance(top, list):
        raise ProtocolError("top_logprobs is not a list", payload=payload)
    try:
        entries = tuple((int(item["id"]), float(item["logprob"])) for item in top)
    except (KeyError, TypeError, ValueError) as error:
        raise ProtocolError(f"malformed top_logprobs entry: {error}") from None
    prompt_tokens = int(payload.get("tokens_evaluated", 0))
    cached = int(payload.get("timings", {}).get("cache_n", 0))
    return TopLogprobs(entries, requested), prompt_tokens, cached


def next_top_k(top_k: int, vocab_size: int) -> int:
    """The next, larger read: never below DEFAULT_TOP_K, so an escalated read is exact too."""
    return min(max(top_k * ESCALATION_FACTOR, DEFAULT_TOP_K), vocab_size)


def generation_body(prompt: str, schema: Any, max_tokens: int) -> dict[str, Any]:
    """Schema-bound chat completion: llama.cpp compiles the schema into a grammar."""
    return {
        "messages": [user_message(prompt)],
        "response_format": json_schema_response_format(schema),
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "chat_template_kwargs": NO_THINKING,
    }


def tokenize_body(text: str) -> dict[str, Any]:
    return {"content": text, "add_special": False}


def parse_tokens(payload: Any) -> list[int]:
    tokens = _field(payload, "tokens")
    if not isinstance(tokens, list):
        raise ProtocolError("tokens is not a list", payload=payload)
    return [int(token["id"] if isinstance(token, dict) else token) for token in tokens]


def parse_models(payload: Any) -> tuple[int, tuple[str, ...]]:
    """The vocabulary size and every id and alias the server answers to, from /v1/models."""
    vocab_size = int(_field(payload, "data", 0, "meta", "n_vocab"))
    names: list[str] = []
    for model in _field(payload, "data"):
        names.append(str(model.get("id", "")))
        names.extend(str(alias) for alias in model.get("aliases", ()))
    return vocab_size, tuple(name for name in names if name)


def probe_template_body() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROBE_MESSAGE}]}


class AsyncLlamaCpp:
    """Scoring (``POST /completion``) and generation client for llama.cpp's server."""

    #: The SDK frames the raw prefix in the served family's turn markers.
    frames_prompt = True
    #: Generation on llama.cpp refuses images (before any request).
    accepts_images = False

    def __init__(
        self, http: HttpClient, *, top_k: int = DEFAULT_TOP_K, cache_prompt: bool = True
    ) -> None:
        self.http = http
        self.top_k = top_k
        self.cache_prompt = cache_prompt

    def __repr__(self) -> str:
        return f"AsyncLlamaCpp({self.http!r}, top_k={self.top_k}, cache_prompt={self.cache_prompt})"

    async def probe(self) -> Probe:
        """Classify the served template, tokenize every control, read the vocabulary size."""
        template = await self.http.post_json("/apply-template", probe_template_body())
        rendered = str(_field(template, "prompt"))
        tokens = await gather_in_order(DIGITS, self.tokenize)
        vocab_size, model_ids = parse_models(await self.http.get_json("/v1/models"))
        ordered = {
            control: cast(list[int], ids) for control, ids in zip(DIGITS, tokens, strict=True)
        }
        return Probe(
            classify_template(rendered),
            rendered,
            control_token_ids(ordered),
            vocab_size,
            model_ids,
        )

    async def tokenize(self, text: str) -> list[int]:
        return parse_tokens(await self.http.post_json("/tokenize", tokenize_body(text)))

    async def read(self, request: ScoringRequest, vocab_size: int) -> CandidateRead:
        """The candidates' logprobs from one read, escalating K until all are present."""
        top_k = min(self.top_k, vocab_size)
        reads = prompt_tokens = cached_tokens = 0
        while True:
            body = completion_body(request.prompt, top_k, cache_prompt=self.cache_prompt)
            payload = await self.http.post_json("/completion", body)
            top, read_tokens, read_cached = parse_completion(payload, top_k)
            reads, prompt_tokens, cached_tokens = (
                reads + 1,
                prompt_tokens + read_tokens,
                cached_tokens + read_cached,
            )
            logprobs = find_candidates(top, request.token_ids, vocab_size)
            if logprobs is not None:
                return CandidateRead(
                    request.token_ids, logprobs, top_k, reads, prompt_tokens, cached_tokens
                )
            top_k = next_top_k(top_k, vocab_size)

    async def generate(
        self, prompt: str, schema: Any, images: Sequence[Image], max_tokens: int
    ) -> ChatOutput:
        if images:
            raise InvalidInputError("llama.cpp generation does not take images; nothing was sent")
        body = generation_body(prompt, schema, max_tokens)
        return parse_chat_output(await self.http.post_json("/v1/chat/completions", body))
