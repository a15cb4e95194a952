"""vLLM's OpenAI-compatible server: scoring reads with ``logprob_token_ids``, and generation.

The server applies its own chat template, so a scoring read sends the state and field block as
plain user content with ``max_tokens: 1`` and asks for exactly the candidates' logprobs
(``logprob_token_ids``, at most 128). With ``--logprobs-mode raw_logprobs`` (or
``processed_logprobs``, since a scoring read applies no logit processor) those are
full-vocabulary log-softmax values, so the off-menu mass is exact. In a ``*_logits`` mode the
values are logits: the answer's probabilities are still exact (softmax ignores a common shift),
but the off-menu mass is unknown and is reported as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

from typevet_async.backends.http import Attempts, HttpClient
from typevet_async.backends.openai_chat import NO_THINKING, parse_chat_output, user_message
from typevet_async.core.controls import PROBED_CONTROLS, control_token_ids
from typevet_async.core.framing import PROBE_MESSAGE, classify_template
from typevet_async.core.generation import ChatOutput
from typevet_async.core.layouts import Message
from typevet_async.core.readings import CandidateRead, TopLogprobs, require_candidates
from typevet_async.core.scoring import Probe, ScoringRequest
from typevet_async.errors import (
    ConfigurationError,
    InvalidInputError,
    InvalidLogprobsError,
    ProtocolError,
)
from typevet_async.fanout import gather_in_order
from typevet_async.images import Image

__all__ = [
    "MAX_LOGPROB_TOKEN_IDS",
    "AsyncVllm",
    "LogprobsMode",
    "parse_scoring_response",
    "scoring_body",
]

#: vLLM refuses more ``logprob_token_ids`` than this.
MAX_LOGPROB_TOKEN_IDS = 128

LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]
_TOKEN_ID_PREFIX = "token_id:"


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages; a message's images go before its text as data-URI parts."""
    out: list[dict[str, Any]] = []
    for message in messages:
        entry = user_message(message.content, message.images)  # type: ignore[arg-type]
        entry["role"] = message.role
        out.append(entry)
    return out


def scoring_body(
    model: str, messages: Sequence[Message], token_ids: Sequence[int]
) -> dict[str, Any]:
    """One position, exactly the candidates' logprobs, thinking off, no sampling processors."""
    return {
        "model": model,
        "messages": chat_messages(messages),
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": True,
        "logprob_token_ids": list(token_ids),
        "return_tokens_as_token_ids": True,
        "chat_template_kwargs": NO_THINKING,
    }


def generation_body(
    model: str, prompt: str, schema: Any, images: Sequence[Image], max_tokens: int
) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [user_message(prompt, images)],
        "structured_outputs": {"json": schema},
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "chat_template_kwargs": NO_THINKING,
    }


def _token_id(token: Any) -> int:
    if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
        raise ProtocolError(f"expected a token as 'token_id:N', got {token!r}")
    try:
        return int(token[len(_TOKEN_ID_PREFIX) :])
    except ValueError:
        raise ProtocolError(f"expected a token as 'token_id:N', got {token!r}") from None


def parse_scoring_response(payload: Any, token_ids: Sequence[int]) -> tuple[TopLogprobs, int, int]:
    """The candidates' entries (the sampled token may come along; nothing else may).

    :raises ProtocolError: the shape is wrong.
    :raises InvalidLogprobsError: an entry that is neither a candidate nor the sampled token.
    """
    try:
        position = payload["choices"][0]["logprobs"]["content"][0]
        sampled = _token_id(position["token"])
        entries = [(_token_id(e["token"]), float(e["logprob"])) for e in position["top_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ProtocolError(
            "response has no choices[0].logprobs.content[0].top_logprobs", payload=payload
        ) from None
    wanted = set(token_ids)
    unexpected = [tid for tid, _ in entries if tid not in wanted and tid != sampled]
    if unexpected:
        raise InvalidLogprobsError(f"unexpected token ids {unexpected} in a logprob_token_ids read")
    kept = tuple((tid, lp) for tid, lp in entries if tid in wanted)
    duplicated = len(kept) != len({tid for tid, _ in kept})
    if duplicated:
        raise InvalidLogprobsError("a candidate token id appears twice in one read")
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return (
        TopLogprobs(kept, len(token_ids)),
        int(usage.get("prompt_tokens", 0) or 0),
        int(details.get("cached_tokens", 0) or 0),
    )


class AsyncVllm:
    """Scoring and generation client for vLLM's ``POST /v1/chat/completions``."""

    #: The server applies its own chat template to plain user content.
    frames_prompt = False
    accepts_images = True

    def __init__(
        self,
        http: HttpClient,
        model: str,
        *,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        on_missing: str = "exact",
    ) -> None:
        self.http = http
        self.model = model
        self.logprobs_mode = logprobs_mode
        #: Recorded in diagnostics; it never fires here, since the read names its candidates.
        self.on_missing = on_missing

    def __repr__(self) -> str:
        return f"AsyncVllm({self.http!r}, model={self.model!r})"

    @property
    def off_menu_known(self) -> bool:
        return self.logprobs_mode.endswith("logprobs")

    async def probe(self) -> Probe:
        """Served models, the template's family (rendered via /tokenize), and control ids."""
        models = await self.http.get_json("/v1/models")
        try:
            model_ids = tuple(str(m["id"]) for m in models["data"])
        except (KeyError, TypeError):
            raise ProtocolError("/v1/models has no data[].id", payload=models) from None
        if self.model not in model_ids:  # before anything else names the model
            raise ConfigurationError(
                f"the session is pinned to model {self.model!r}, the server serves "
                f"{list(model_ids)!r}"
            )
        tokens = await gather_in_order(PROBED_CONTROLS, self.tokenize)
        rendered = await self._render_probe()
        ordered = {c: cast(list[int], t) for c, t in zip(PROBED_CONTROLS, tokens, strict=True)}
        return Probe(
            classify_template(rendered),
            rendered,
            control_token_ids(ordered),
            vocab_size=0,  # not needed: a logprob_token_ids read names its candidates
            model_ids=model_ids,
            max_candidates=MAX_LOGPROB_TOKEN_IDS,
            vision=True,  # vLLM does not declare it; a text-only model refuses images itself
        )

    async def _render_probe(self) -> str:
        tokens = await self.http.post_json(
            "/tokenize",
            {
                "model": self.model,
                "messages": [user_message(PROBE_MESSAGE)],
                "add_generation_prompt": True,
                "return_token_strs": True,
            },
        )
        pieces = tokens.get("token_strs") if isinstance(tokens, dict) else None
        if not isinstance(pieces, list):
            raise ProtocolError("/tokenize returned no token_strs", payload=tokens)
        return "".join(str(piece) for piece in pieces)

    async def tokenize(self, text: str) -> list[int]:
        payload = await self.http.post_json(
            "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
        )
        tokens = payload.get("tokens") if isinstance(payload, dict) else None
        if not isinstance(tokens, list):
            raise ProtocolError("/tokenize returned no tokens", payload=payload)
        return [int(token) for token in tokens]

    async def read(
        self, request: ScoringRequest, vocab_size: int, *, max_retries: int | None = None
    ) -> CandidateRead:
        """The candidates' logprobs from one read; nothing is sent for more than 128 ids."""
        ids = request.read_ids
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise InvalidInputError(
                f"{len(ids)} candidates, but vLLM reads at most "
                f"{MAX_LOGPROB_TOKEN_IDS} logprob_token_ids; nothing was sent"
            )
        body = scoring_body(self.model, request.messages, ids)
        attempts = Attempts()
        payload = await self.http.post_json(
            "/v1/chat/completions", body, max_retries=max_retries, attempts=attempts
        )
        top, prompt_tokens, cached = parse_scoring_response(payload, ids)
        logprobs = require_candidates(top.entries, ids, allow_positive=not self.off_menu_known)
        return CandidateRead(
            ids,
            logprobs,
            len(ids),
            1,
            prompt_tokens,
            cached,
            off_menu_known=self.off_menu_known,
            prompt=request.user_text,
            policy=self.on_missing,
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
        body = generation_body(self.model, prompt, schema, images, max_tokens)
        payload = await self.http.post_json("/v1/chat/completions", body, max_retries=max_retries)
        return parse_chat_output(payload)
