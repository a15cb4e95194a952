"""llama.cpp's HTTP server: template probe, control tokenization and exact top-K scoring reads.

Pure functions build each request body and decode each reply strictly
(`typevet_async._backends.llama_cpp_wire`); `AsyncLlamaCpp` only awaits between them. A scoring
read asks for the top K logprobs at the answer position (``n_predict: 0``, pre-sampling
probabilities, so they are full-vocabulary log-softmax values). If every candidate is among
them the read is exact; otherwise it reads again with a larger K, up to the whole vocabulary.
A missing candidate is never estimated.

The backend owns its configuration (`LlamaCppConfig`), its HTTP client and, with no URL, the
embedded server's lifecycle (`typevet_async._backends.embedded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio
import attrs
import orjson

import typevet_async._telemetry as telemetry
from typevet_async._backends.base import Capabilities, server_of
from typevet_async._backends.embedded import EmbeddedServer, ServerOptions
from typevet_async._backends.http import Attempts, HttpClient, HttpSettings
from typevet_async._backends.llama_cpp_wire import (
    Completion,
    completion_body,
    decode_completion,
    decode_models,
    decode_pieces,
    decode_props,
    decode_rendered,
    decode_tokens,
    generation_body,
    history_probe_body,
    probe_template_body,
    split_probe_body,
    template_body,
    tokenize_body,
)
from typevet_async._backends.openai_chat import decode_chat_output
from typevet_async._concurrency.fanout import gather_in_order
from typevet_async._core.generation.records import ChatOutput, GenerationRequest
from typevet_async._core.prompts.controls import PROBED_CONTROLS, controls_in_context
from typevet_async._core.prompts.framing import (
    GEMMA_FRAMES,
    PROBE_MESSAGE,
    SECOND_PROBE_MESSAGE,
    TRIM_PROBE_MESSAGE,
    classify_template,
    learn_frame,
    learn_trim,
    learn_turns,
    structural_markers,
    turn_markers,
    with_turns,
)
from typevet_async._core.prompts.markers import (
    ALL_RUNS,
    RUN_SEPARATOR,
    Piece,
    special_runs_from_pieces,
)
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.probe import Probe, check_served_model, model_identity
from typevet_async._core.reading.readings import (
    CandidateRead,
    missing_options,
    read_entries,
    settle_candidates,
)
from typevet_async._errors import (
    ConfigurationError,
    InvalidLogprobsError,
    ServerError,
    SessionStateError,
)
from typevet_async._options import (
    Unset,
    boolean,
    instance_of,
    non_empty_text,
    one_of,
    optional,
    positive_int,
    url,
)
from typevet_async._redaction import redact, redacted_repr

__all__ = [
    "DEFAULT_CLAMP_TOP_K",
    "ENTRIES_PER_OPTION",
    "MIN_FIRST_TOP_K",
    "AsyncLlamaCpp",
    "LlamaCppConfig",
    "OnMissing",
    "next_top_k",
]

#: The first read under ``on_missing="exact"`` holds this many entries per option (rounded up
#: to a power of two, within `MIN_FIRST_TOP_K` .. `ESCALATED_TOP_K`): 64 for a Noul, 128 for 3
#: or 4 options, 512 for 10, 1,024 for 20. The size of a read does not change an answer:
#: llama.cpp's float32 normaliser shifts every logprob of a top-K read by one common amount,
#: which cancels in the answer's softmax (benchmarks/real_answers/measure_top_k.py, 1,014 complete
#: reads: answers within 1.2e-7 of the whole-vocabulary read at every K from 16 up). So the first
#: read only has to find the candidates, and how deep they sit grows with the menu: the largest
#: candidate rank over 10 measured pairs was 24 for 2 options, 95 for 3, 346 for 10 and about
#: 10,000 for 20 and 36. This rule escalated 7 of those 60 pairs, a fixed 128 escalated 22, and
#: a Noul's read is 5 KB (top 4,096: 370 KB). A read that misses a candidate escalates.
ENTRIES_PER_OPTION = 32
#: The smallest first read under ``on_missing="exact"``.
MIN_FIRST_TOP_K = 64
#: An escalated read asks for at least this many, and no first read asks for more: on the
#: measured set, every read that missed a candidate at 128 but 4 (20- and 36-option menus)
#: found it in the top 4,096.
ESCALATED_TOP_K = 4096
#: The one read under ``on_missing="clamp"`` and ``"error"``: the Jev gateway reads 20.
DEFAULT_CLAMP_TOP_K = 20
#: Each escalation asks for this many times more entries (capped at the vocabulary).
ESCALATION_FACTOR = 32

OnMissing = Literal["exact", "clamp", "error"]


@attrs.frozen(kw_only=True)
class LlamaCppConfig:
    """A llama.cpp backend's settings; checked when built.

    :param base_url: the server's URL; None starts the embedded server (``server``).
    :param model: if given, the server must serve a model of that id or alias.
    :param top_k: logprobs asked for on the first read (default: under ``exact``, 32 per
        option rounded up to a power of two, at least 64 and at most 4,096; 20 under ``clamp``
        and ``error``). Under ``exact`` a read that misses a candidate is repeated with a
        larger K, up to the whole vocabulary; under ``clamp`` and ``error`` it is the only
        read.
    :param on_missing: ``"exact"`` (escalate until every option is read), ``"clamp"`` (Jev:
        a missing option gets the lowest logprob returned and the answer is flagged
        ``truncated``) or ``"error"`` (`CandidateMissingError`).
    :param reproducible: bit-identical answers under the same server: no prompt cache and one
        read at a time. See the README for the cost.
    :param server: how to start the embedded server, when ``base_url`` is None.
    """

    base_url: str | None = attrs.field(default=None, validator=optional(url), repr=redacted_repr)
    model: str | None = attrs.field(default=None, validator=optional(non_empty_text))
    top_k: int | None = attrs.field(default=None, validator=optional(positive_int))
    on_missing: OnMissing = attrs.field(default="exact", validator=one_of(OnMissing))
    reproducible: bool = attrs.field(default=False, validator=boolean)
    http: HttpSettings = attrs.field(factory=HttpSettings)
    server: ServerOptions | None = attrs.field(
        default=None, validator=optional(instance_of(ServerOptions, "a tv.ServerOptions or None"))
    )

    def __attrs_post_init__(self) -> None:
        if (self.base_url is None) == (self.server is None):
            raise ConfigurationError(
                "a llama.cpp backend needs either base_url or embedded server options, not both"
            )

    def first_top_k(self, options: int) -> int:
        """The K of a question's first read, for a question of ``options`` options."""
        if self.top_k is not None:
            return self.top_k
        if self.on_missing != "exact":
            return DEFAULT_CLAMP_TOP_K
        top_k = MIN_FIRST_TOP_K
        while top_k < ENTRIES_PER_OPTION * options and top_k < ESCALATED_TOP_K:
            top_k *= 2
        return top_k


def next_top_k(top_k: int, vocab_size: int) -> int:
    """The next, larger read: never below ESCALATED_TOP_K (capped at the vocabulary)."""
    return min(max(top_k * ESCALATION_FACTOR, ESCALATED_TOP_K), vocab_size)


class AsyncLlamaCpp:
    """Scoring (``POST /completion``) and generation client for llama.cpp's server."""

    def __init__(self, config: LlamaCppConfig) -> None:
        self.config = config
        self._capabilities = Capabilities(
            server="llama.cpp",
            framing="sdk",
            prefix_reuse=True,
            generation_images=False,
            max_concurrency=1 if config.reproducible else None,
        )
        self._server = EmbeddedServer(config.server) if config.server is not None else None
        self.http = HttpClient(config.base_url, config.http)
        #: The probe prompt up to the answer position, in the frame a judgment ends in (set
        #: by `probe`): where `answer_tokens` tokenizes answers.
        self._answer_context: str | None = None
        #: The served ids a read's span last named, and the name (`_telemetry_model`).
        self._span_model: tuple[tuple[str, ...], str | None] = ((), None)

    def __repr__(self) -> str:
        where = redact(self.config.base_url) if self.config.base_url else "embedded"
        return (
            f"AsyncLlamaCpp({where!r}, top_k={self.config.top_k!r}, "
            f"on_missing={self.config.on_missing!r}, reproducible={self.config.reproducible})"
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def model(self) -> str | None:
        return self.config.model

    @property
    def base_url(self) -> str | None:
        """Where the server listens (for the embedded server: once open)."""
        return self.http.base_url

    @property
    def embedded(self) -> bool:
        """Whether this backend starts and stops its own (embedded) server."""
        return self._server is not None

    def read_identity(self) -> str | None:
        """What decides this backend's reads (`ReadIdentifying`): the server (its URL; an
        embedded server's model file, template, slots and build, not its port), the model pin,
        and every setting of how a read is made (the first top-K and its rule, escalation,
        ``on_missing``, ``reproducible``); None before an embedded server has started."""
        config = self.config
        if self._server is None:
            where: dict[str, Any] = {"base_url": server_of(self.http.base_url)}
        elif self._server.read_identity is None:
            return None
        else:
            where = {"embedded": self._server.read_identity}
        rule = (
            ENTRIES_PER_OPTION,
            MIN_FIRST_TOP_K,
            ESCALATED_TOP_K,
            DEFAULT_CLAMP_TOP_K,
            ESCALATION_FACTOR,
        )
        identity = {
            "backend": "llama.cpp",
            **where,
            "model": config.model,
            "top_k": config.top_k,
            "top_k_rule": rule,
            "on_missing": config.on_missing,
            "reproducible": config.reproducible,
        }
        return orjson.dumps(identity, option=orjson.OPT_SORT_KEYS).decode()

    async def open(self) -> None:
        """Start the embedded server, if this backend has one, then open the pool."""
        url = None
        if self._server is not None and not self._server.url:
            url = await anyio.to_thread.run_sync(self._server.start)
        await self.http.open(url)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.http.aclose()
            if self._server is not None:
                await anyio.to_thread.run_sync(self._server.stop)

    async def probe(self) -> Probe:
        """Classify the served template (its turn markers checked against the tokenizer),
        learn its frame, tokenize every control, read vocabulary and vision."""
        vocab_size, model_ids = decode_models(await self.http.get("/v1/models"))
        check_served_model(self.config.model, model_ids)
        rendered = decode_rendered(await self.http.post("/apply-template", probe_template_body()))
        props = decode_props(await self.http.get("/props"))
        family = classify_template(rendered)
        frame = None
        if not family.is_gemma and family.is_native:
            # A native template's markers are the model's own tokens: one token each, and those
            # of its turns special (caller text can never forge them).
            markers = turn_markers(rendered)
            tokenized = await gather_in_order(markers, self.tokenize)
            lengths = {m: len(t) for m, t in zip(markers, tokenized, strict=True)}
            special = await self.special_runs(structural_markers(rendered))
            family = classify_template(
                rendered, lambda marker: lengths[marker] == 1, special.__contains__
            )
        if family.is_native:
            trimmed = decode_rendered(
                await self.http.post("/apply-template", probe_template_body(TRIM_PROBE_MESSAGE))
            )
            trim = learn_trim(rendered, trimmed)
            if family.is_gemma:
                frame = attrs.evolve(GEMMA_FRAMES[family], trim=True) if trim else None
            elif trim is not None:
                second = await self.http.post(
                    "/apply-template", probe_template_body(SECOND_PROBE_MESSAGE)
                )
                frame = learn_frame(
                    rendered,
                    decode_rendered(second),
                    template=props.chat_template,
                    bos=props.bos_token,
                )
                frame = attrs.evolve(frame, trim=trim) if frame is not None else None
            history = await self.http.post("/apply-template", history_probe_body())
            frame = with_turns(frame, family, learn_turns(rendered, decode_rendered(history)))
        # Each control's ids where the model writes it: after the prefix a judgment ends in.
        answer_frame = frame if frame is not None else GEMMA_FRAMES.get(family)
        context = answer_frame.prefix(PROBE_MESSAGE) if answer_frame is not None else rendered
        self._answer_context = context
        base, extended = await self.answer_tokens(PROBED_CONTROLS)
        controls = controls_in_context(base, dict(zip(PROBED_CONTROLS, extended, strict=True)))
        return Probe(
            family,
            rendered,
            controls.ids,
            vocab_size,
            model_ids,
            vision=props.vision,
            media_marker=props.media_marker,
            slots=props.slots,
            frame=frame,
            context_tokens=props.context_tokens,
            control_leads=controls.leads,
            consecutive_user_turns=await self._renders_consecutive_user_turns(),
        )

    async def _renders_consecutive_user_turns(self) -> bool:
        """Whether the template renders the ``split`` layout's messages (system, user, user):
        a template that requires alternating roles (Mistral's) refuses them with a 400."""
        try:
            await self.http.post("/apply-template", split_probe_body(), max_retries=0)
        except ServerError as error:
            if error.status == 400:
                return False
            raise
        return True

    async def answer_tokens(self, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        """The probe prompt's tokens at the answer position, and with each answer appended
        (the frame a judgment's prompt ends in; before the probe has learnt it: refused)."""
        context = self._answer_context
        if context is None:
            raise SessionStateError("the backend must be probed before its answers are tokenized")
        base, *extended = await gather_in_order(
            ("", *answers), lambda answer: self.tokenize(context + answer)
        )
        return base, extended

    async def tokenize(self, text: str, *, parse_special: bool = True) -> list[int]:
        body = tokenize_body(text, parse_special=parse_special)
        return decode_tokens(await self.http.post("/tokenize", body))

    async def special_runs(self, runs: Sequence[str]) -> frozenset[str]:
        """The runs the served tokenizer reads as special tokens, from one pair of
        ``/tokenize`` requests sent at once whatever the runs: all of them joined, with and
        without ``parse_special``, each token with its text (`special_runs_from_pieces`).
        Pieces that do not spell the text (a tokenizer that rewrites it) leave the rule where
        the tokenizer cannot be asked (`ALL_RUNS`)."""
        if not runs:
            return frozenset()
        joined = RUN_SEPARATOR.join(runs)

        async def pieces(parse_special: bool) -> list[Piece]:
            body = tokenize_body(joined, parse_special=parse_special, with_pieces=True)
            return decode_pieces(await self.http.post("/tokenize", body))

        parsed, plain = await gather_in_order((True, False), pieces)
        special = special_runs_from_pieces(runs, parsed, plain)
        return frozenset(filter(ALL_RUNS, runs)) if special is None else special

    async def _render(
        self, request: ScoringRequest, max_retries: int | Unset, attempts: Attempts
    ) -> str:
        """The served template's rendering of the request's messages, ending at the answer."""
        raw = await self.http.post(
            "/apply-template",
            template_body(request.messages),
            max_retries=max_retries,
            attempts=attempts,
        )
        rendered = decode_rendered(raw)
        if request.answer_prefill and not rendered.endswith(request.answer_prefill):
            rendered += request.answer_prefill
        return rendered

    async def read(
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        """The candidates' logprobs at the answer position, under the truncation policy.

        ``exact`` escalates K until every option is present (never estimates); ``clamp`` and
        ``error`` read the top K once and fill in, or refuse, a missing option.
        """
        attempts = Attempts()
        prompt = (
            request.prompt
            if request.prompt is not None
            else await self._render(request, max_retries, attempts)
        )
        # in the order of their media markers in the prompt: each message's, leading then inline
        images = [image for message in request.messages for image in message.all_images()]
        groups = request.option_groups
        policy = self.config.on_missing
        vocab_size = probe.vocab_size
        top_k = min(self.config.first_top_k(len(groups)), vocab_size)
        reads = prompt_tokens = cached_tokens = 0
        while True:
            body = completion_body(
                prompt,
                top_k,
                cache_prompt=not self.config.reproducible,
                images=images,
                lead=request.lead,
            )
            if telemetry.observing():
                reply = await self._read_top(body, top_k, reads, probe, max_retries, attempts)
            else:  # the hot path: no span, and no coroutine layer of its own
                raw = await self.http.post(
                    "/completion", body, max_retries=max_retries, attempts=attempts
                )
                reply = decode_completion(raw, top_k)
            reads, prompt_tokens, cached_tokens = (
                reads + 1,
                prompt_tokens + reply.prompt_tokens,
                cached_tokens + reply.cached_tokens,
            )
            entries = read_entries(reply.top, vocab_size)
            missing = missing_options(entries, groups)
            if missing and policy == "exact":
                if top_k >= vocab_size:
                    raise InvalidLogprobsError(
                        f"candidate token ids {[t for g in missing for t in g]} are missing "
                        "from a whole-vocabulary read"
                    )
                wider = next_top_k(top_k, vocab_size)
                telemetry.escalated(top_k, wider, len(missing))
                top_k = wider
                continue
            ids, logprobs, truncated = settle_candidates(entries, groups, missing, policy, top_k)
            return CandidateRead(
                ids,
                logprobs,
                top_k,
                reads,
                prompt_tokens,
                cached_tokens,
                prompt=prompt,
                policy=policy,
                truncated=truncated,
                clamped=len(missing) if truncated else 0,
                attempts=attempts.count,
            )

    async def _read_top(
        self,
        body: dict[str, Any],
        top_k: int,
        escalation: int,
        probe: Probe,
        max_retries: int | Unset,
        attempts: Attempts,
    ) -> Completion:
        """One ``/completion`` read of the top ``top_k`` (the ``escalation``-th of its
        question's), in its read span (`typevet_async._telemetry`)."""
        model = self._telemetry_model(probe)
        with telemetry.read_span(
            "text_completion",
            "llama.cpp",
            model,
            self.http.base_url,
            top_k=top_k,
            escalation=escalation,
        ) as span:
            raw = await self.http.post(
                "/completion", body, max_retries=max_retries, attempts=attempts
            )
            reply = decode_completion(raw, top_k)
            if span is not None:
                telemetry.read_usage(span, reply.prompt_tokens, reply.cached_tokens)
            return reply

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        with telemetry.generation_span(
            "llama.cpp", self.config.model, self.http.base_url, request.max_tokens
        ) as span:
            # Not retried after a timeout: it would generate from scratch, as long again.
            raw = await self.http.post(
                "/v1/chat/completions",
                generation_body(request),
                max_retries=max_retries,
                retry_timeouts=False,
            )
            output = decode_chat_output(raw)
            if span is not None:
                telemetry.generated(
                    span, output.prompt_tokens, output.completion_tokens, output.finish_reason
                )
            return output

    def _telemetry_model(self, probe: Probe) -> str | None:
        """The model a read's span names: the pin, else the served model's file name (worked
        out once per probe: every read asks)."""
        if self.config.model is not None or not probe.model_ids:
            return self.config.model
        served, name = self._span_model
        if served is not probe.model_ids:
            name = model_identity(None, probe.model_ids)
            self._span_model = (probe.model_ids, name)
        return name
