"""Any OpenAI-compatible chat server: typed answers read from ``top_logprobs``.

A scoring read is ``POST {base_url}/chat/completions`` with ``max_tokens: 1``,
``temperature: 0``, ``logprobs: true`` and ``top_logprobs: N``: the server renders the
question's messages in its own chat template and returns its top ``N`` tokens at the answer
position with their full-vocabulary logprobs (`typevet_async._core.reading.chat_reads` says which
entry counts for which control). Ollama, LM Studio, SGLang, TGI, vLLM, llama.cpp's
``llama-server``, LiteLLM and hosted providers speak it.

The probe learns, once per session, what the server gives (`ChatServer`): whether it
returns logprobs at all (if not, `LogprobsUnavailableError` before any question is read), the
most ``top_logprobs`` it takes (asked for the widest window, then its refusal's named limit or
smaller windows), whether it takes ``chat_template_kwargs`` (thinking off; refused: not sent
again), and whether it offers ``/tokenize`` at its root (then every control is checked to be
one token, and an entry's id decides what it counts for).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import orjson

import typevet_async._telemetry as telemetry
from typevet_async._backends.base import Capabilities, server_of
from typevet_async._backends.http import Attempts, HttpClient, HttpSettings
from typevet_async._backends.openai_chat import decode_chat_output
from typevet_async._backends.openai_compatible_wire import (
    ChatScoring,
    decode_context,
    decode_model_ids,
    decode_scoring,
    decode_tokens,
    generation_body,
    scoring_body,
    tokenize_body,
)
from typevet_async._concurrency.fanout import gather_in_order
from typevet_async._core.generation.records import ChatOutput, GenerationRequest
from typevet_async._core.prompts.controls import (
    NOUL_WORDS,
    REQUIRED_CONTROLS,
    control_token_ids,
    space_variant,
)
from typevet_async._core.prompts.framing import TemplateFamily
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.chat_reads import (
    DEFAULT_TOP_LOGPROBS,
    MAX_TOP_LOGPROBS,
    TOKENIZED_CONTROLS,
    WIDENING_FACTOR,
    ChatEntry,
    ChatOnMissing,
    ChatServer,
    after_refusal,
    match_options,
    settle_options,
    text_control_ids,
    whole_controls,
    wider,
    window_limit,
)
from typevet_async._core.reading.probe import Probe, check_served_model
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import (
    BackendError,
    ConfigurationError,
    ControlTokenError,
    LogprobsUnavailableError,
    ServerError,
    SessionStateError,
)
from typevet_async._options import Unset, non_empty_text, one_of, optional, positive_int, url
from typevet_async._redaction import redact, redacted_repr

__all__ = ["AsyncOpenAICompatible", "OpenAICompatibleConfig"]

#: The probe's reads: questions any chat model answers with a letter, and with Yes or No, so
#: that those come back whole among the entries where the server's tokenizer writes each as
#: one token.
PROBE_QUESTIONS = (
    "Which letter comes first in the alphabet? Answer with one letter: A, B or C.",
    "Is the sky blue on a clear day? Answer Yes or No.",
)

#: The statuses a server refuses a body's field with.
_REFUSED = (400, 422)
#: The statuses of a server without ``/tokenize``.
_NO_TOKENIZE = (400, 404, 405, 422, 501)


@attrs.frozen(kw_only=True)
class OpenAICompatibleConfig:
    """An OpenAI-compatible backend's settings; checked when built.

    :param base_url: the API's base, as OpenAI's clients take it (``http://host:8000/v1``):
        reads go to ``{base_url}/chat/completions``, the model list to ``{base_url}/models``;
        ``/tokenize`` is asked for at the root when ``base_url`` ends in ``/v1``.
    :param model: the model every request names (None: the first ``GET {base_url}/models``
        lists, unpinned).
    :param top_logprobs: the first read's window (default 20, OpenAI's cap; never more than
        the server's cap).
    :param on_missing: what a read does with an option outside the window. ``"clamp"`` (the
        default): widen the window up to the server's cap, then give a still missing option
        the lowest logprob returned and flag the answer ``truncated`` (its off-menu mass is
        then unknown), so a server capped at 20 still answers. ``"exact"``: widen, and fail
        with `CandidateMissingError` naming the cap. ``"error"``: fail at once.
    """

    base_url: str = attrs.field(validator=url, repr=redacted_repr)
    model: str | None = attrs.field(default=None, validator=optional(non_empty_text))
    top_logprobs: int | None = attrs.field(default=None, validator=optional(positive_int))
    on_missing: ChatOnMissing = attrs.field(default="clamp", validator=one_of(ChatOnMissing))
    http: HttpSettings = attrs.field(factory=HttpSettings)

    @property
    def ceiling(self) -> int:
        """The widest window a read asks for where the server states no cap."""
        return max(self.top_logprobs or 0, MAX_TOP_LOGPROBS)


_CAPABILITIES = Capabilities(
    server="openai-compatible", framing="server", prefix_reuse=False, generation_images=True
)


def _root(base_url: str) -> str | None:
    """The server's root, where llama.cpp and vLLM serve ``/tokenize`` (only for a
    ``base_url`` ending in ``/v1``)."""
    trimmed = base_url.rstrip("/")
    return trimmed[: -len("/v1")] if trimmed.endswith("/v1") else None


class AsyncOpenAICompatible:
    """Scoring and generation client for any ``POST {base_url}/chat/completions``."""

    def __init__(self, config: OpenAICompatibleConfig) -> None:
        self.config = config
        self.http = HttpClient(config.base_url, config.http)
        root = _root(config.base_url)
        self._root = HttpClient(root, config.http) if root is not None else None
        #: The model requests name (set by `probe`: the pin, else the first listed).
        self._served: str | None = config.model
        #: Whether requests carry ``chat_template_kwargs`` (the probe turns it off if refused).
        self._thinking_switch = True
        #: A probe's controls by id, and each id's accepted ids (None: matched by text).
        self._controls: tuple[Probe | None, dict[int, str], dict[int, frozenset[int]] | None] = (
            None,
            {},
            None,
        )

    def __repr__(self) -> str:
        return (
            f"AsyncOpenAICompatible({redact(self.config.base_url)!r}, model={self.config.model!r}"
            f", on_missing={self.config.on_missing!r})"
        )

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def model(self) -> str | None:
        return self.config.model

    def read_identity(self) -> str:
        """What decides this backend's reads (`ReadIdentifying`): the server, the model pin,
        the window and its rule, and ``on_missing``."""
        config = self.config
        identity = {
            "backend": "openai-compatible",
            "base_url": server_of(self.http.base_url),
            "model": config.model,
            "top_logprobs": config.top_logprobs,
            "rule": (DEFAULT_TOP_LOGPROBS, config.ceiling, WIDENING_FACTOR),
            "on_missing": config.on_missing,
        }
        return orjson.dumps(identity, option=orjson.OPT_SORT_KEYS).decode()

    async def open(self) -> None:
        await self.http.open()
        if self._root is not None:
            await self._root.open()

    async def aclose(self) -> None:
        await self.http.aclose()
        if self._root is not None:
            await self._root.aclose()

    async def probe(self) -> Probe:
        """The served models, then what the server gives (`ChatServer`): logprobs, its
        ``top_logprobs`` cap, the thinking switch, ``/tokenize`` and the controls.

        :raises LogprobsUnavailableError: the server returns no logprobs, or refuses them.
        :raises ControlTokenError: no letter came back whole (without ``/tokenize``), or
            ``A`` or ``B`` is not one token (with it).
        """
        raw_models = await self.http.get("/models")
        model_ids = decode_model_ids(raw_models)
        check_served_model(self.config.model, model_ids)
        if self.config.model is None and not model_ids:
            raise ConfigurationError(
                "the server lists no model at /models: give the model's id (model=)"
            )
        served = self._served = self.config.model or model_ids[0]
        cap, refused, entries = await self._probe_window(served)
        body = scoring_body(
            served,
            (Message("user", PROBE_QUESTIONS[1]),),
            len(entries),
            thinking_switch=self._thinking_switch,
        )
        words = decode_scoring(await self.http.post("/chat/completions", body)).entries or ()
        whole = whole_controls((*entries, *words))
        control_ids = await self._tokenized_controls(served)
        if control_ids is None:
            refused.append("/tokenize")
            control_ids = text_control_ids(all(word in whole for word in NOUL_WORDS))
            if not set(whole) - set(NOUL_WORDS):
                raise ControlTokenError(
                    f"no entry of the server's top {len(entries)} at the probe was a single "
                    "letter: its tokenizer does not write letters as one token, or its token "
                    "texts are not text; judgments need letters that come back whole"
                )
        server = ChatServer(
            top_logprobs_cap=cap,
            thinking_switch=self._thinking_switch,
            tokenize="/tokenize" not in refused,
            refused=tuple(refused),
            whole_controls=whole,
        )
        return Probe(
            TemplateFamily.OTHER,
            "",  # the server renders its template; it shows none
            control_ids,
            vocab_size=0,
            model_ids=model_ids,
            vision=True,  # not declared; a text-only model refuses images itself
            context_tokens=decode_context(raw_models, served),
            chat_server=server,
        )

    async def _probe_window(
        self, model: str
    ) -> tuple[int | None, list[str], tuple[ChatEntry, ...]]:
        """The widest window the server takes (None: the ceiling, no cap met), what it
        refused, and the probe read's entries."""
        asked, capped, refused = self.config.ceiling, False, []
        messages = (Message("user", PROBE_QUESTIONS[0]),)
        while True:
            body = scoring_body(model, messages, asked, thinking_switch=self._thinking_switch)
            try:
                reply = decode_scoring(await self.http.post("/chat/completions", body))
                break
            except ServerError as error:
                if error.status not in _REFUSED:
                    raise
                following = after_refusal(error.body, asked, self._thinking_switch)
                if following is not None:
                    if self._thinking_switch and not following[1]:
                        refused.append("chat_template_kwargs")  # tried again at the window found
                    capped = capped or following[0] < asked
                    asked, self._thinking_switch = following
                else:
                    raise LogprobsUnavailableError(
                        f"the server refuses every read with logprobs (HTTP {error.status}: "
                        f"{str(error)[:200]}): typed answers need top_logprobs"
                    ) from error
        if not self._thinking_switch and capped:
            reply = await self._with_thinking_switch(model, messages, asked, reply, refused)
        if reply.entries is None:
            raise LogprobsUnavailableError(
                f"the server returns no logprobs (choices[0].logprobs.content[0].top_logprobs "
                f"is missing for top_logprobs {asked}): typed answers need them; this server "
                "cannot judge"
            )
        if capped:
            refused.insert(0, f"top_logprobs above {asked}")
        elif len(reply.entries) < asked:  # a cap it applies without saying
            asked, capped = len(reply.entries), True
            refused.insert(0, f"top_logprobs above {asked} (returned fewer)")
        return (asked if capped else None), refused, reply.entries

    async def _with_thinking_switch(
        self,
        model: str,
        messages: tuple[Message, ...],
        asked: int,
        reply: ChatScoring,
        refused: list[str],
    ) -> ChatScoring:
        """A refusal that named no limit was first taken for the thinking switch's; with the
        window found, the switch is tried again."""
        body = scoring_body(model, messages, asked, thinking_switch=True)
        try:
            again = decode_scoring(await self.http.post("/chat/completions", body))
        except ServerError as error:
            if error.status not in _REFUSED:
                raise
            return reply
        self._thinking_switch = True
        refused.remove("chat_template_kwargs")
        return again

    async def _tokenized_controls(self, model: str) -> dict[str, int] | None:
        """Each control that is one token (``A`` and ``B`` must be), with its space variant's
        id where that is one token too; None: the server offers no ``/tokenize``."""
        root = self._root
        if root is None:
            return None
        try:
            # A 429 or 5xx is retried as any request (after its Retry-After), not taken for a
            # server without /tokenize; a timeout is not (a root that never answers).
            await root.post("/tokenize", tokenize_body(model, "A"), retry_timeouts=False)
        except (ServerError, BackendError) as error:
            if isinstance(error, ServerError) and error.status not in _NO_TOKENIZE:
                raise
            return None
        texts = [*TOKENIZED_CONTROLS, *(space_variant(c) for c in TOKENIZED_CONTROLS)]

        async def tokens(text: str) -> list[int]:
            return decode_tokens(await root.post("/tokenize", tokenize_body(model, text)))

        tokenized = await gather_in_order(texts, tokens)
        return control_token_ids(dict(zip(texts, tokenized, strict=True)), REQUIRED_CONTROLS)

    def _matching(self, probe: Probe) -> tuple[dict[int, str], dict[int, frozenset[int]] | None]:
        """The probe's controls by id, and (where it learnt real ids) each id's accepted ids:
        its control's and its space variant's. Worked out once per probe."""
        known, controls, accepted = self._controls
        if known is probe:
            return controls, accepted
        ids = probe.control_ids
        controls = {token: control for control, token in ids.items()}
        accepted = None
        if probe.chat_server is not None and probe.chat_server.tokenize:
            accepted = {
                token: frozenset(
                    ids[each]
                    for each in (control.strip(), space_variant(control.strip()))
                    if each in ids
                )
                for control, token in ids.items()
            }
        self._controls = (probe, controls, accepted)
        return controls, accepted

    async def read(
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        """The options' logprobs from the server's top window, widened up to its cap while
        an option is missing (not under ``on_missing="error"``), then settled under
        ``on_missing``."""
        server, model = probe.chat_server, self._served
        if server is None or model is None:
            raise SessionStateError("the backend must be probed before it reads")
        controls, accepted = self._matching(probe)
        groups = request.option_groups
        policy = self.config.on_missing
        # Under exact, a server without a cap is read as wide as it answers (its whole
        # vocabulary at most); clamp stops at the ceiling, where it may fill in.
        cap = server.top_logprobs_cap
        ceiling = cap if cap is not None else None if policy == "exact" else self.config.ceiling
        top = min(self.config.top_logprobs or DEFAULT_TOP_LOGPROBS, ceiling or MAX_TOP_LOGPROBS)
        attempts = Attempts()
        reads = prompt_tokens = cached_tokens = 0
        while True:
            reply = await self._scoring_read(
                model, request.messages, top, reads, max_retries, attempts
            )
            reads, prompt_tokens, cached_tokens = (
                reads + 1,
                prompt_tokens + reply.prompt_tokens,
                cached_tokens + reply.cached_tokens,
            )
            if reply.entries is None:
                raise LogprobsUnavailableError(
                    "the server returned no logprobs for a read (it did at the probe)"
                )
            values = match_options(reply.entries, groups, controls, accepted)
            missing = values.count(None)
            widened = (
                wider(top, len(reply.entries), ceiling) if missing and policy != "error" else None
            )
            if widened is None:
                break
            telemetry.escalated(top, widened, missing)
            top = widened
        limit = window_limit(policy, cap, ceiling, top, len(reply.entries))
        settled = settle_options(values, groups, reply.entries, policy, top, limit)
        return CandidateRead(
            settled.token_ids,
            settled.logprobs,
            top,
            reads,
            prompt_tokens,
            cached_tokens,
            prompt=request.user_text,
            policy=policy,
            truncated=settled.clamped > 0,
            clamped=settled.clamped,
            attempts=attempts.count,
        )

    async def _scoring_read(
        self,
        model: str,
        messages: Sequence[Message],
        top: int,
        escalation: int,
        max_retries: int | Unset,
        attempts: Attempts,
    ) -> ChatScoring:
        """One read of the top ``top`` (the ``escalation``-th widening of its question's), in
        its own read span, as every backend's read (`typevet_async._telemetry`)."""
        with telemetry.read_span(
            "chat", "openai-compatible", model, self.http.base_url, top_k=top, escalation=escalation
        ) as span:
            body = scoring_body(model, messages, top, thinking_switch=self._thinking_switch)
            raw = await self.http.post(
                "/chat/completions", body, max_retries=max_retries, attempts=attempts
            )
            reply = decode_scoring(raw)
            if span is not None:
                telemetry.read_usage(span, reply.prompt_tokens, reply.cached_tokens)
            return reply

    async def special_runs(self, runs: Sequence[str]) -> None:
        """None: the server's tokenizer cannot be asked which runs are special, so every
        marker run is neutralised."""
        return None

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        """One schema-bound completion through ``response_format`` (the model: the pin, the
        probe's, else the first listed); a refusal of the thinking switch is retried once
        without it, and the switch is not sent again."""
        model = self._served
        if model is None:
            model_ids = decode_model_ids(await self.http.get("/models"))
            if not model_ids:
                raise ConfigurationError(
                    "the server lists no model at /models: give the model's id (model=)"
                )
            model = self._served = model_ids[0]
        with telemetry.generation_span(
            "openai-compatible", model, self.http.base_url, request.max_tokens
        ) as span:
            output = decode_chat_output(await self._generated(model, request, max_retries))
            if span is not None:
                telemetry.generated(
                    span, output.prompt_tokens, output.completion_tokens, output.finish_reason
                )
            return output

    async def _generated(
        self, model: str, request: GenerationRequest, max_retries: int | Unset
    ) -> bytes:
        while True:
            switch = self._thinking_switch
            body = generation_body(model, request, thinking_switch=switch)
            try:
                # Not retried after a timeout: it would generate from scratch, as long again.
                return await self.http.post(
                    "/chat/completions", body, max_retries=max_retries, retry_timeouts=False
                )
            except ServerError as error:
                if not switch or error.status not in _REFUSED:
                    raise
                self._thinking_switch = False
