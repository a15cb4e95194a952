"""Planning a session's judgments: each question bound to the served controls once, each
state's requests rendered, caller text neutralised by the served tokenizer's own verdicts, and
the two-token codes a question with many options needs learnt from the tokenizer first.

Planning is pure once the backend has been asked what it must say (marker runs, codes): bad
input fails here with nothing sent.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Mapping, Sequence

from typevet_async._backends.base import AnswerTokenizing, Backend
from typevet_async._core.prompts.codes import (
    CodeTokens,
    check_code_count,
    codes_in_context,
    codes_needed,
)
from typevet_async._core.prompts.controls import ALPHABETS, available_controls
from typevet_async._core.prompts.framing import TemplateFamily, turn_markers
from typevet_async._core.prompts.layouts import Layout
from typevet_async._core.prompts.markers import ALL_RUNS, marker_runs, runs_to_check
from typevet_async._core.prompts.questions import Question
from typevet_async._core.prompts.rotations import rotation_offsets
from typevet_async._core.prompts.scoring import (
    QuestionPlan,
    ScoringRequest,
    bind_question,
    request_for,
)
from typevet_async._core.reading.probe import Probe, check_context
from typevet_async._core.statistics.calibration import Reading
from typevet_async._errors import (
    InvalidInputError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async._session.images import JudgmentImages
from typevet_async._session.priors import PriorCache
from typevet_async._session.read_cache import CachedReads
from typevet_async._session.settings import SessionSettings

__all__ = [
    "PLAN_CACHE_SIZE",
    "VERDICT_CACHE_SIZE",
    "Planner",
    "examples_refusal",
    "template_refusal",
]


#: Questions whose plan a session keeps (least recently used beyond it are planned again).
PLAN_CACHE_SIZE = 1024


#: Marker runs whose verdict (special token or not) a session keeps.
VERDICT_CACHE_SIZE = 4096


def _question_texts(question: Question) -> list[str]:
    texts = [question.instructions, *(state for state, _ in question.examples)]
    for option in question.options():
        texts.append(option.label)
        if option.description:
            texts.append(option.description)
    return texts


class Planner:
    """Plans a session's judgments: binds each question once (`bind_question`, cached) and
    renders its request about each state (`request_for`).

    Caller text is neutralised by the served tokenizer's own verdict on each marker run
    (`typevet_async._core.prompts.markers`): before a judgment's first request, the runs in its
    state
    and questions that the session has not met yet are put to the backend in one
    `Backend.special_runs` call, at most `MAX_CHECKED_RUNS` of them (`runs_to_check`; the rest
    are neutralised unchecked), and the verdicts kept (`VERDICT_CACHE_SIZE`). A backend that
    cannot tell answers None once, and every run is then neutralised (`ALL_RUNS`). The
    server's own media marker (``/props``) is always neutralised: the server reads it as an
    image's place whatever its tokenizer makes of it.
    """

    def __init__(self, backend: Backend, probe: Probe, settings: SessionSettings) -> None:
        self.settings = settings
        capabilities = backend.capabilities
        self.backend = backend
        self.probe = probe
        #: Where the backend scores a raw prefix, the frame the SDK frames it in (None: the
        #: server renders the messages); `template_refusal` says why a template has none.
        self._frames = capabilities.framing == "sdk"
        self._frame = probe.prompt_frame if self._frames else None
        control_ids, layout, controls = probe.control_ids, settings.layout, settings.controls
        leads = probe.control_leads
        limit = capabilities.max_candidates
        #: Marker run -> whether the served tokenizer reads it as a special token (recently
        #: used last); None once the backend has said it cannot tell.
        self._verdicts: collections.OrderedDict[str, bool] | None = collections.OrderedDict()
        self._media_marker = probe.media_marker
        is_special = self.is_special

        @functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
        def bind(question: Question, rotation: int) -> QuestionPlan:
            return bind_question(
                question,
                layout,
                control_ids,
                limit,
                is_special,
                rotation,
                controls,
                leads,
                self._codes,
                settings.noul_controls,
                settings.score_controls,
            )

        @functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
        def question_runs(question: Question) -> frozenset[str]:
            return frozenset(marker_runs(_question_texts(question)))

        @functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
        def option_count(question: Question) -> int:
            return len(question.options())

        @functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
        def example_states(question: Question) -> tuple[str, ...]:
            return tuple(state for state, _ in question.examples)

        self._bind = bind
        self._example_states = example_states
        self._question_runs = question_runs
        self._option_count = option_count
        #: Code -> its tokens in context, or None where the tokenizer writes it otherwise;
        #: None for a backend that cannot say (no codes: the single controls are the limit).
        self._codes: dict[str, CodeTokens | None] | None = (
            {} if isinstance(backend, AnswerTokenizing) and not layout.is_jev else None
        )
        self._single_limit = len(available_controls(ALPHABETS[controls], control_ids, leads))
        #: Numbers each judgment planned (`ScoringRequest.judgment`).
        self._judgments = itertools.count(1)
        #: The session's read cache for this backend and probe (None: every read is sent).
        self.cached_reads = CachedReads.bind(settings.cache, backend, probe)
        #: Each question's content-free prior, read once (``content_free``).
        self.content_free_priors = PriorCache()

    def is_special(self, run: str) -> bool:
        """The served tokenizer's verdict on a marker run (unknown: special, to be safe)."""
        verdicts = self._verdicts
        if verdicts is None:
            return ALL_RUNS(run)
        if run == self._media_marker:
            return True
        verdict = verdicts.get(run)
        if verdict is None:
            return True
        verdicts.move_to_end(run)
        return verdict

    async def learn(self, state_text: str, questions: Sequence[tuple[str, Question]]) -> None:
        """Ask the backend what planning this judgment needs and it has not said yet: the
        verdicts on new marker runs, and the tokens of the codes of a question with more
        options than single controls (no request in the common case).

        :raises TooManyOptionsError: a question with more options than any tokenizer gives
            codes (`check_code_count`), before anything is asked.
        :raises PromptTooLongError: the state and a question's examples certainly cannot fit
            the served context (`check_context`; `plan` checks each whole prompt).
        """
        self._refuse_unanswerable(state_text, questions)
        await self._learn_runs(state_text, questions)
        if self._codes is None:
            return
        # Per judgment, on the hot path: each question's option count is built once.
        widest = max((self._option_count(question) for _, question in questions), default=0)
        if widest > self._single_limit:
            await self._learn_codes(widest, self._codes)

    def _refuse_unanswerable(
        self, state_text: str, questions: Sequence[tuple[str, Question]]
    ) -> None:
        """Refuse, before the tokenizer is asked anything, a question no read can answer: more
        options than there are codes, or a state and examples past the served context."""
        context = self.probe.context_tokens
        for question_id, question in questions:
            if self._codes is not None:  # else the single controls are the limit (`plan`)
                try:
                    check_code_count(self._option_count(question))
                except TypevetError as error:
                    error.question_id = question_id
                    raise
            if context is not None:  # each prompt shows the state and its question's examples
                check_context(question_id, (state_text, *self._example_states(question)), context)

    async def _learn_codes(self, count: int, known: dict[str, CodeTokens | None]) -> None:
        """Ask the tokenizer how it writes codes at the answer position until ``count`` are
        usable or every code has been asked (`codes_needed`): once per session, as many codes
        as its widest question needs."""
        assert isinstance(self.backend, AnswerTokenizing)  # known is None otherwise
        needed = codes_needed(count, known)
        while needed:
            base, extended = await self.backend.answer_tokens(needed)
            known.update(codes_in_context(base, dict(zip(needed, extended, strict=True))))
            needed = codes_needed(count, known)

    async def _learn_runs(self, state_text: str, questions: Sequence[tuple[str, Question]]) -> None:
        """The verdicts on the marker runs of this judgment the session has not met yet."""
        verdicts = self._verdicts
        if verdicts is None:
            return
        asked: set[str] = set()
        for _, question in questions:
            asked |= self._question_runs(question)
        state = marker_runs((state_text,)) if ("<" in state_text or "[" in state_text) else set()
        media = self._media_marker
        unknown = runs_to_check(
            (run for run in asked if run not in verdicts and run != media),
            (run for run in state if run not in verdicts and run != media),
        )
        if not unknown:
            return
        special = await self.backend.special_runs(unknown)
        if special is None:
            self._verdicts = None
            return
        for run in unknown:
            verdicts[run] = run in special
        while len(verdicts) > VERDICT_CACHE_SIZE:
            verdicts.popitem(last=False)

    def plan(
        self,
        state_text: str,
        questions: Sequence[tuple[str, Question]],
        images: JudgmentImages,
        readings: Mapping[str, Reading] | None = None,
    ) -> list[ScoringRequest]:
        """Every question's scoring requests (one per rotation its `Reading` asks for, next to
        each other, the unrotated one first), or the error that refuses the judgment unsent.
        The state's images go in every request, a question's own only in its own.

        :raises UnsupportedTemplateError: the SDK frames prompts and the served template is
            degraded (its turn markers are not the model's special tokens), has no markers, or
            could not be framed (`template_refusal`).
        :raises InvalidInputError: images for a server that does not declare vision.
        :raises TooManyOptionsError: a question needs more controls or candidates than there
            are (``question_id`` names it).
        :raises PromptTooLongError: a request's prompt certainly cannot fit the served context
            (`check_context`).
        """
        frame, probe = self._frame, self.probe
        if self._frames and frame is None:
            raise template_refusal(probe)
        if self.settings.layout is Layout.SPLIT and not probe.consecutive_user_turns:
            raise UnsupportedTemplateError(
                "the split layout sends two user messages in a row (the state, then the "
                "question), and the served chat template requires alternating roles (it "
                "refused them at the probe); use layout='fused' or the default layout, which "
                "send one user message",
                family=probe.family.value,
                rendered=probe.rendered_template,
            )
        if images and not probe.vision:
            raise InvalidInputError(
                "the server does not declare vision (/props modalities); images were refused "
                "before any scoring read"
            )
        requests = []
        judgment = next(self._judgments)
        for question_id, question in questions:
            if question.examples and frame is not None and frame.turns is None:
                raise examples_refusal(question_id, probe)
            offsets = (  # the common case, no rotations, without building the options
                (0,)
                if readings is None
                else rotation_offsets(len(question.options()), readings[question_id].rotations)
            )
            for rotation in offsets:
                try:
                    plan = self._bind(question, rotation)
                except TypevetError as error:
                    error.question_id = question_id
                    raise
                request = request_for(
                    question_id,
                    plan,
                    state_text,
                    frame=frame,
                    images=images.state,
                    media_marker=probe.media_marker,
                    is_special=self.is_special,
                    judgment=judgment,
                    question_images=images.of(question_id),
                )
                check_context(question_id, _prompt_texts(request), probe.context_tokens)
                requests.append(request)
        return requests


def _prompt_texts(request: ScoringRequest) -> tuple[str, ...]:
    """The text a request's prompt holds: the raw prefix the SDK framed, else its messages'
    contents (the server's template adds its own markers around them)."""
    if request.prompt is not None:
        return (request.prompt,)
    return tuple(message.content for message in request.messages)


def examples_refusal(question_id: str, probe: Probe) -> UnsupportedTemplateError:
    """A question with examples, and the probe could not learn how the served template renders
    earlier turns (refused before any read)."""
    error = UnsupportedTemplateError(
        f"question {question_id!r} has examples, shown as earlier turns of the conversation, "
        f"and the served chat template ({probe.family.value}) renders a conversation in a way "
        "the probe could not learn (it rewrites earlier turns); ask it without examples",
        family=probe.family.value,
        rendered=probe.rendered_template,
    )
    error.question_id = question_id
    return error


def template_refusal(probe: Probe) -> UnsupportedTemplateError:
    """Why the SDK cannot frame prompts in the served template (refused before any read)."""
    family = probe.family
    if family is TemplateFamily.DEGRADED:
        markers = turn_markers(probe.rendered_template)
        why = (
            f"its turn markers {markers} are not special tokens of the served model: its "
            "tokenizer reads them as several ordinary tokens, so the template was written for "
            "another model family and this model was never trained on it; serve the model's "
            "own chat template"
        )
    elif family.is_native:
        why = (
            "its rendering moves with the message, so the SDK cannot learn where the answer "
            "starts (two probe messages rendered differently around the message)"
        )
    else:
        why = "it shows no turn markers (<...> or [...]) the SDK can frame a prompt in"
    return UnsupportedTemplateError(
        f"the served chat template ({family.value}) cannot frame a judgment: {why}",
        family=family.value,
        rendered=probe.rendered_template,
    )
