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
import orjson

import typevet_async._telemetry as telemetry
from typevet_async._backends.base import Capabilities, server_of
from typevet_async._backends.http import Attempts, HttpClient, HttpSettings
from typevet_async._backends.openai_chat import decode_chat_output
from typevet_async._backends.vllm_wire import (
    Scoring,
    chat_tokens_body,
    completion_scoring_body,
    decode_completion_scoring,
    decode_max_model_len,
    decode_model_ids,
    decode_rendered,
    decode_scoring,
    decode_tokens,
    generation_body,
    render_body,
    scoring_body,
    split_render_body,
    tokenize_body,
)
from typevet_async._concurrency.fanout import gather_in_order
from typevet_async._core.generation.records import ChatOutput, GenerationRequest
from typevet_async._core.prompts.controls import (
    PROBED_CONTROLS,
    REQUIRED_CONTROLS,
    ControlsInContext,
    control_token_ids,
    controls_in_context,
    with_bare_tokens,
)
from typevet_async._core.prompts.framing import classify_template
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.probe import Probe, check_served_model
from typevet_async._core.reading.readings import CandidateRead, missing_options, validated_logprobs
from typevet_async._errors import (
    ConfigurationError,
    InvalidLogprobsError,
    ServerError,
)
from typevet_async._options import Unset, one_of, url
from typevet_async._redaction import redact, redacted_repr

__all__ = [
    "MAX_LOGPROB_TOKEN_IDS",
    "AsyncVllm",
    "LogprobsMode",
    "VllmConfig",
]

#: vLLM refuses more ``logprob_token_ids`` than this.
MAX_LOGPROB_TOKEN_IDS = 128

#: The server applies its own template; a read names at most 128 candidates; generation takes
#: images (a text-only model refuses them itself).
_CAPABILITIES = Capabilities(
    server="vllm",
    framing="server",
    prefix_reuse=False,
    max_candidates=MAX_LOGPROB_TOKEN_IDS,
    generation_images=True,
)

LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]


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

    base_url: str = attrs.field(validator=url, repr=redacted_repr)
    model: str = attrs.field(validator=_non_empty)
    logprobs_mode: LogprobsMode = attrs.field(
        default="raw_logprobs", validator=one_of(LogprobsMode)
    )
    http: HttpSettings = attrs.field(factory=HttpSettings)


class AsyncVllm:
    """Scoring and generation client for vLLM's ``POST /v1/chat/completions``."""

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.http = HttpClient(config.base_url, config.http)

    def __repr__(self) -> str:
        return f"AsyncVllm({redact(self.config.base_url)!r}, model={self.config.model!r})"

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def off_menu_known(self) -> bool:
        return self.config.logprobs_mode.endswith("logprobs")

    def read_identity(self) -> str:
        """What decides this backend's reads (`ReadIdentifying`): the server's URL, the served
        model every request names and the logprobs mode the reads are taken in."""
        config = self.config
        identity = {
            "backend": "vllm",
            "base_url": server_of(self.http.base_url),
            "model": config.model,
            "logprobs_mode": config.logprobs_mode,
        }
        return orjson.dumps(identity, option=orjson.OPT_SORT_KEYS).decode()

    async def open(self) -> None:
        await self.http.open()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def probe(self) -> Probe:
        """Served models, the template's family (rendered via /tokenize), and the controls'
        ids in context: the probe message's answer position rendered by the template with and
        without each control as the assistant's answer."""
        models = await self.http.get("/v1/models")
        model_ids = decode_model_ids(models)
        check_served_model(self.model, model_ids)  # before anything else names the model
        raw = await self.http.post("/tokenize", render_body(self.model))
        rendered, base = decode_rendered(raw), decode_tokens(raw)
        extended = await gather_in_order(PROBED_CONTROLS, self._answer_tokens)
        controls = controls_in_context(
            base, dict(zip(PROBED_CONTROLS, extended, strict=True)), required=()
        )
        if not set(REQUIRED_CONTROLS) <= set(controls.ids):
            # A template that cannot continue an answer: each control tokenized alone.
            tokens = await gather_in_order(PROBED_CONTROLS, self.tokenize)
            bare = control_token_ids(dict(zip(PROBED_CONTROLS, tokens, strict=True)))
            controls = ControlsInContext(bare)
        missing = [control for control in PROBED_CONTROLS if control not in controls.ids]
        if missing:  # e.g. " A" under a template that trims the answer to "A"
            tokens = await gather_in_order(missing, self.tokenize)
            controls = with_bare_tokens(controls, dict(zip(missing, tokens, strict=True)))
        return Probe(
            classify_template(rendered),
            rendered,
            controls.ids,
            vocab_size=0,  # not needed: a logprob_token_ids read names its candidates
            model_ids=model_ids,
            vision=True,  # vLLM does not declare it; a text-only model refuses images itself
            control_leads=controls.leads,
            consecutive_user_turns=await self._renders_consecutive_user_turns(),
            context_tokens=decode_max_model_len(models, self.model),
        )

    async def _renders_consecutive_user_turns(self) -> bool:
        """Whether the template renders the ``split`` layout's messages (system, user, user):
        one that requires alternating roles (Mistral's) refuses them with a 400."""
        try:
            await self.http.post("/tokenize", split_render_body(self.model), max_retries=0)
        except ServerError as error:
            if error.status == 400:
                return False
            raise
        return True

    async def answer_tokens(self, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """The probe message's answer position rendered by the template, and with each answer
        as the assistant's (continued) answer.

        :raises ConfigurationError: the server returns logits (``*_logits`` mode): a code's
            two reads have two normalisers that logits leave out, so no code can be read
            exactly (asked before any read of the question is sent).
        """
        if not self.off_menu_known:
            raise ConfigurationError(
                f"questions past the single-token controls need two-token codes, whose two "
                f"reads must be normalised logprobs; the server returns "
                f"{self.config.logprobs_mode} (start it with --logprobs-mode raw_logprobs)"
            )
        raw = await self.http.post("/tokenize", render_body(self.model))
        return decode_tokens(raw), await gather_in_order(answers, self._answer_tokens)

    async def _answer_tokens(self, answer: str) -> list[int]:
        return decode_tokens(await self.http.post("/tokenize", render_body(self.model, answer)))

    async def tokenize(self, text: str) -> list[int]:
        return decode_tokens(await self.http.post("/tokenize", tokenize_body(self.model, text)))

    async def read(
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        """The candidates' logprobs from one read that names every one of them."""
        ids = request.read_ids
        attempts = Attempts()
        operation = "text_completion" if request.lead else "chat"
        with telemetry.read_span(
            operation, "vllm", self.model, self.http.base_url, top_k=len(ids)
        ) as span:
            if request.lead:
                reply = await self._read_after_lead(request, max_retries, attempts)
            else:
                body = scoring_body(self.model, request.messages, ids)
                raw = await self.http.post(
                    "/v1/chat/completions", body, max_retries=max_retries, attempts=attempts
                )
                reply = decode_scoring(raw, ids)
            if span is not None:
                telemetry.read_usage(span, reply.prompt_tokens, reply.cached_tokens)
        logprobs = validated_logprobs(reply.top, allow_positive=not self.off_menu_known)
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
            reply.prompt_tokens,
            reply.cached_tokens,
            off_menu_known=self.off_menu_known,
            prompt=request.user_text,
            attempts=attempts.count,
        )

    async def _read_after_lead(
        self, request: ScoringRequest, max_retries: int | Unset, attempts: Attempts
    ) -> Scoring:
        """A read whose controls need a lead (SentencePiece's ``▁``): the chat API cannot end
        a prompt in a token, so the template's rendering is tokenized (``/tokenize``), the
        lead appended, and the candidates read from ``/v1/completions`` on those tokens (a
        question with images never gets here: `request_for` refuses it)."""
        rendered = await self.http.post(
            "/tokenize",
            chat_tokens_body(self.model, request.messages),
            max_retries=max_retries,
            attempts=attempts,
        )
        prompt = [*decode_tokens(rendered), *request.lead]
        raw = await self.http.post(
            "/v1/completions",
            completion_scoring_body(self.model, prompt, request.read_ids),
            max_retries=max_retries,
            attempts=attempts,
        )
        return decode_completion_scoring(raw, request.read_ids)

    async def special_runs(self, runs: Sequence[str]) -> None:
        """None: vLLM's ``/tokenize`` has no switch to read special-token text as plain text,
        so every marker run is neutralised."""
        return None

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        body = generation_body(self.model, request)
        with telemetry.generation_span(
            "vllm", self.model, self.http.base_url, request.max_tokens
        ) as span:
            # Not retried after a timeout: it would generate from scratch, as long again.
            raw = await self.http.post(
                "/v1/chat/completions", body, max_retries=max_retries, retry_timeouts=False
            )
            output = decode_chat_output(raw)
            if span is not None:
                telemetry.generated(
                    span, output.prompt_tokens, output.completion_tokens, output.finish_reason
                )
            return output
