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
from typing import Any, Literal

import attrs

from typevet_async._backends.base import Capabilities
from typevet_async._backends.http import Attempts, HttpClient, HttpSettings
from typevet_async._backends.openai_chat import NO_THINKING, parse_chat_output, user_message
from typevet_async._core.controls import PROBED_CONTROLS, control_token_ids
from typevet_async._core.framing import PROBE_MESSAGE, classify_template
from typevet_async._core.generation import ChatOutput, GenerationRequest
from typevet_async._core.layouts import Message
from typevet_async._core.probe import Probe, check_served_model
from typevet_async._core.readings import (
    CandidateRead,
    TopLogprobs,
    missing_options,
    validated_entries,
)
from typevet_async._core.scoring import ScoringRequest
from typevet_async._errors import (
    ConfigurationError,
    InvalidLogprobsError,
    ProtocolError,
)
from typevet_async._fanout import gather_in_order
from typevet_async._options import Unset, one_of

__all__ = [
    "MAX_LOGPROB_TOKEN_IDS",
    "AsyncVllm",
    "LogprobsMode",
    "VllmConfig",
    "parse_scoring_response",
    "scoring_body",
]

#: vLLM refuses more ``logprob_token_ids`` than this.
MAX_LOGPROB_TOKEN_IDS = 128

#: The server applies its own template; a read names at most 128 candidates; generation takes
#: images (a text-only model refuses them itself).
_CAPABILITIES = Capabilities(
    framing="server",
    prefix_reuse=False,
    max_candidates=MAX_LOGPROB_TOKEN_IDS,
    generation_images=True,
)

LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]
_TOKEN_ID_PREFIX = "token_id:"


def _non_empty(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"a vLLM backend needs {attribute.name} (the served model id, a non-empty string), "
            f"got {value!r}"
        )


@attrs.frozen(kw_only=True)
class VllmConfig:
    """A vLLM backend's settings; checked when built.

    :param model: the served model id; every request names it.
    :param logprobs_mode: the server's ``--logprobs-mode``. With ``raw_logprobs`` (the
        default, and what we recommend) or ``processed_logprobs`` the off-menu mass is exact;
        with a ``*_logits`` mode it is reported as unknown (None).
    """

    base_url: str = attrs.field(validator=_non_empty)
    model: str = attrs.field(validator=_non_empty)
    logprobs_mode: LogprobsMode = attrs.field(
        default="raw_logprobs", validator=one_of(LogprobsMode)
    )
    http: HttpSettings = attrs.field(factory=HttpSettings)


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """OpenAI chat messages; a message's images go before its text as data-URI parts."""
    out: list[dict[str, Any]] = []
    for message in messages:
        entry = user_message(message.content, message.images)
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


def generation_body(model: str, request: GenerationRequest) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [user_message(request.prompt, request.images)],
        "structured_outputs": {"json": request.schema},
        "temperature": 0.0,
        "max_tokens": request.max_tokens,
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

    Repeated ids and bad values are `validated_entries`' to refuse.

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
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return (
        TopLogprobs(kept, len(token_ids)),
        int(usage.get("prompt_tokens", 0) or 0),
        int(details.get("cached_tokens", 0) or 0),
    )


class AsyncVllm:
    """Scoring and generation client for vLLM's ``POST /v1/chat/completions``."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.http = HttpClient(config.base_url, config.http)

    def __repr__(self) -> str:
        return f"AsyncVllm({self.config.base_url!r}, model={self.config.model!r})"

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def off_menu_known(self) -> bool:
        return self.config.logprobs_mode.endswith("logprobs")

    async def open(self) -> None:
        await self.http.open()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def probe(self) -> Probe:
        """Served models, the template's family (rendered via /tokenize), and control ids."""
        models = await self.http.get_json("/v1/models")
        try:
            model_ids = tuple(str(m["id"]) for m in models["data"])
        except (KeyError, TypeError):
            raise ProtocolError("/v1/models has no data[].id", payload=models) from None
        check_served_model(self.model, model_ids)  # before anything else names the model
        tokens = await gather_in_order(PROBED_CONTROLS, self.tokenize)
        rendered = await self._render_probe()
        return Probe(
            classify_template(rendered),
            rendered,
            control_token_ids(dict(zip(PROBED_CONTROLS, tokens, strict=True))),
            vocab_size=0,  # not needed: a logprob_token_ids read names its candidates
            model_ids=model_ids,
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
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        """The candidates' logprobs from one read that names every one of them."""
        ids = request.read_ids
        body = scoring_body(self.model, request.messages, ids)
        attempts = Attempts()
        payload = await self.http.post_json(
            "/v1/chat/completions", body, max_retries=max_retries, attempts=attempts
        )
        top, prompt_tokens, cached = parse_scoring_response(payload, ids)
        logprobs = validated_entries(top.entries, allow_positive=not self.off_menu_known)
        # A read that names its ids returns every one of them, variants included.
        missing = missing_options(logprobs, [(token,) for token in ids])
        if missing:
            raise InvalidLogprobsError(
                f"candidate token ids {[g[0] for g in missing]} are missing from the read"
            )
        return CandidateRead(
            ids,
            tuple(logprobs[token] for token in ids),
            len(ids),
            1,
            prompt_tokens,
            cached,
            off_menu_known=self.off_menu_known,
            prompt=request.user_text,
            attempts=attempts.count,
        )

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        body = generation_body(self.model, request)
        payload = await self.http.post_json("/v1/chat/completions", body, max_retries=max_retries)
        return parse_chat_output(payload)
