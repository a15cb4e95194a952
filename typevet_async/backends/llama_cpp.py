"""llama.cpp's HTTP server: template probe, control tokenization and exact top-K scoring reads.

Pure functions build each request body and interpret each response; `AsyncLlamaCpp` only
awaits between them. A scoring read asks for the top K logprobs at the answer position
(``n_predict: 0``, pre-sampling probabilities, so they are full-vocabulary log-softmax values).
If every candidate is among them the read is exact; otherwise it reads again with a larger K,
up to the whole vocabulary. A missing candidate is never estimated.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal, cast

from typevet_async.backends.http import Attempts, HttpClient
from typevet_async.backends.openai_chat import (
    NO_THINKING,
    json_schema_response_format,
    parse_chat_output,
    user_message,
)
from typevet_async.core.controls import PROBED_CONTROLS, control_token_ids
from typevet_async.core.framing import PROBE_MESSAGE, classify_template
from typevet_async.core.generation import ChatOutput
from typevet_async.core.layouts import ImagePart, Message
from typevet_async.core.readings import (
    CandidateRead,
    TopLogprobs,
    clamp_candidates,
    find_option_candidates,
)
from typevet_async.core.scoring import Probe, ScoringRequest
from typevet_async.errors import CandidateMissingError, InvalidInputError, ProtocolError
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
#: The top-N that on_missing="clamp" and "error" read once (Jev's policy), up to 4096.
DEFAULT_TOP_N = 20
MAX_TOP_N = 4096

OnMissing = Literal["exact", "clamp", "error"]


def completion_body(
    prompt: str, top_k: int, *, cache_prompt: bool, images: Sequence[ImagePart] = ()
) -> dict[str, Any]:
    """A one-position read: no tokens generated, the top-K full-vocabulary logprobs returned.

    With images the prompt becomes ``{"prompt_string", "multimodal_data"}``; the prefix holds
    one media marker per image, in order.
    """
    body_prompt: Any = prompt
    if images:
        body_prompt = {
            "prompt_string": prompt,
            "multimodal_data": [base64.b64encode(image.data).decode("ascii") for image in images],
        }
    return {
        "prompt": body_prompt,
        "n_predict": 0,
        "n_probs": top_k,
        "post_sampling_probs": False,
        "cache_prompt": cache_prompt,
        "return_tokens": False,
    }


def template_body(messages: Sequence[Message]) -> dict[str, Any]:
    """Render messages through the served template, thinking off, ending at the answer."""
    return {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "add_generation_prompt": True,
        "chat_template_kwargs": NO_THINKING,
    }


def parse_props(payload: Any) -> tuple[bool, str | None]:
    """Whether the server declares vision, and its media marker."""
    if not isinstance(payload, dict):
        raise ProtocolError("/props is not an object", payload=payload)
    vision = bool((payload.get("modalities") or {}).get("vision", False))
    marker = payload.get("media_marker")
    return vision, marker if isinstance(marker, str) and marker else None


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
        self,
        http: HttpClient,
        *,
        top_k: int = DEFAULT_TOP_K,
        cache_prompt: bool = True,
        on_missing: OnMissing = "exact",
        top_n: int = DEFAULT_TOP_N,
    ) -> None:
        self.http = http
        self.top_k = top_k
        self.cache_prompt = cache_prompt
        self.on_missing = on_missing
        self.top_n = top_n

    def __repr__(self) -> str:
        return (
            f"AsyncLlamaCpp({self.http!r}, top_k={self.top_k}, cache_prompt={self.cache_prompt}, "
            f"on_missing={self.on_missing!r})"
        )

    async def probe(self) -> Probe:
        """Classify the served template, tokenize every control, read vocabulary and vision."""
        template = await self.http.post_json("/apply-template", probe_template_body())
        rendered = str(_field(template, "prompt"))
        tokens = await gather_in_order(PROBED_CONTROLS, self.tokenize)
        vocab_size, model_ids = parse_models(await self.http.get_json("/v1/models"))
        vision, marker = parse_props(await self.http.get_json("/props"))
        tokenized = {c: cast(list[int], t) for c, t in zip(PROBED_CONTROLS, tokens, strict=True)}
        return Probe(
            classify_template(rendered),
            rendered,
            control_token_ids(tokenized),
            vocab_size,
            model_ids,
            vision=vision,
            media_marker=marker,
        )

    async def tokenize(self, text: str) -> list[int]:
        return parse_tokens(await self.http.post_json("/tokenize", tokenize_body(text)))

    async def render(
        self,
        request: ScoringRequest,
        max_retries: int | None = None,
        attempts: Attempts | None = None,
    ) -> str:
        """The served template's rendering of the request's messages, ending at the answer."""
        payload = await self.http.post_json(
            "/apply-template",
            template_body(request.messages),
            max_retries=max_retries,
            attempts=attempts,
        )
        rendered = str(_field(payload, "prompt"))
        if request.answer_prefill and not rendered.endswith(request.answer_prefill):
            rendered += request.answer_prefill
        return rendered

    async def read(
        self, request: ScoringRequest, vocab_size: int, *, max_retries: int | None = None
    ) -> CandidateRead:
        """The candidates' logprobs at the answer position, under the truncation policy.

        ``exact`` escalates K until every candidate is present (never estimates); ``clamp``
        and ``error`` read the top ``top_n`` once and fill in, or refuse, what is missing.
        """
        attempts = Attempts()
        prompt = (
            request.prompt
            if request.prompt is not None
            else await self.render(request, max_retries, attempts)
        )
        images = [image for message in request.messages for image in message.images]
        ids = request.read_ids
        exact = self.on_missing == "exact"
        top_k = min(self.top_k if exact else self.top_n, vocab_size)
        reads = prompt_tokens = cached_tokens = 0
        while True:
            body = completion_body(prompt, top_k, cache_prompt=self.cache_prompt, images=images)
            payload = await self.http.post_json(
                "/completion", body, max_retries=max_retries, attempts=attempts
            )
            top, read_tokens, read_cached = parse_completion(payload, top_k)
            reads, prompt_tokens, cached_tokens = (
                reads + 1, prompt_tokens + read_tokens, cached_tokens + read_cached
            )  # fmt: skip
            if exact:
                found = find_option_candidates(top, request.option_groups, vocab_size)
                if found is None:
                    top_k = next_top_k(top_k, vocab_size)
                    continue
                ids, logprobs = found
                truncated = False
            else:
                logprobs, truncated = clamp_candidates(top, ids, vocab_size)
                if truncated and self.on_missing == "error":
                    present = {token for token, _ in top.entries}
                    missing = tuple(token for token in ids if token not in present)
                    raise CandidateMissingError(
                        f"candidate token ids {list(missing)} are outside the top {top_k} "
                        "(on_missing='error')",
                        missing=missing,
                    )
            return CandidateRead(
                ids,
                logprobs,
                top_k,
                reads,
                prompt_tokens,
                cached_tokens,
                prompt=prompt,
                policy=self.on_missing,
                truncated=truncated,
                attempts=attempts.count,
            )

    async def generate(
        self,
        prompt: str,
        schema: Any,
        images: Sequence[Image],
        max_tokens: int,
        *,
        max_retries: int | None = None,
    ) -> ChatOutput:
        if images:
            raise InvalidInputError("llama.cpp generation does not take images; nothing was sent")
        body = generation_body(prompt, schema, max_tokens)
        payload = await self.http.post_json("/v1/chat/completions", body, max_retries=max_retries)
        return parse_chat_output(payload)
