"""From a question to a scoring request, and from a candidate read back to an answer.

These two pure steps sit either side of the one ``await`` of a read
(``typevet_async._session.judging``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import attrs

from typevet_async._core.prompts.codes import (
    CodeTokens,
    bind_codes,
    code_firsts,
    seconds_after,
    usable_codes,
)
from typevet_async._core.prompts.controls import (
    ALPHABETS,
    DEFAULT_CONTROLS,
    JEV_LETTERS,
    NOUL_WORDS,
    SCALE_NUMBERS,
    BoundOption,
    Controls,
    NoulControls,
    ScoreControls,
    alphabet_lead,
    available_controls,
    bind_controls,
    reads_in_one_order,
    space_variant,
)
from typevet_async._core.prompts.examples import earlier_turns, example_turns
from typevet_async._core.prompts.fields import render_field_block, render_user_content
from typevet_async._core.prompts.framing import GEMMA_FRAMES, PromptFrame, TemplateFamily
from typevet_async._core.prompts.layouts import ImagePart, Layout, Message, jev_messages
from typevet_async._core.prompts.markers import ALL_RUNS, IsSpecial
from typevet_async._core.prompts.questions import Noul, Option, Question
from typevet_async._core.prompts.rotations import rotation_order
from typevet_async._errors import (
    ControlTokenError,
    QuestionError,
    TooManyOptionsError,
    TypevetError,
)

__all__ = [
    "QuestionPlan",
    "ScoringRequest",
    "after_first",
    "bind_question",
    "plan_question",
    "request_for",
]


def option_groups(
    token_ids: tuple[int, ...], variant_ids: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, ...], ...]:
    """Each option's accepted tokens: its control's, then its variants (none: ``()``)."""
    variants = variant_ids or tuple(() for _ in token_ids)
    return tuple((token, *extra) for token, extra in zip(token_ids, variants, strict=True))


def read_ids(
    token_ids: tuple[int, ...], variant_ids: tuple[tuple[int, ...], ...]
) -> tuple[int, ...]:
    """Every token id a read asks for: the controls, then their variants."""
    return token_ids + tuple(token for variants in variant_ids for token in variants)


@attrs.frozen
class ScoringRequest:
    """One question, rendered: the messages or raw prefix to score, and the candidates."""

    question_id: str
    question: Question
    #: The chat messages (what a server-side template renders).
    messages: tuple[Message, ...]
    #: The raw prefix, when the SDK frames it itself (llama.cpp, default layout); None when
    #: the server's template renders ``messages`` (vLLM; Jev layouts on llama.cpp).
    prompt: str | None
    controls: tuple[str, ...]
    #: Each option's control token id, in option order.
    token_ids: tuple[int, ...]
    #: Each option's other accepted tokens (Jev: ``" A"`` for ``A``); empty when none.
    variant_ids: tuple[tuple[int, ...], ...] = ()
    #: What follows a server-rendered template at the answer position (Gemma 4: no thinking).
    answer_prefill: str = ""
    #: Which judgment of its session the request belongs to: a session over several
    #: endpoints keeps a judgment's reads on one, so its cached prefix is reused.
    judgment: int = attrs.field(default=0, eq=False)
    #: The option shown at each position, when the options are rotated
    #: (`typevet_async._core.prompts.rotations`); empty: the order as given.
    order: tuple[int, ...] = ()
    #: Tokens that end the prefix before the answer (the controls' shared lead,
    #: `typevet_async._core.prompts.controls`); empty: none.
    lead: tuple[int, ...] = ()

    #: Each option's accepted tokens: its control's, then its variants (`option_groups`; a
    #: request planned from a `QuestionPlan` gets the plan's, built once per question).
    option_groups: tuple[tuple[int, ...], ...] = attrs.field(
        default=attrs.Factory(lambda self: option_groups(self.token_ids, self.variant_ids), True),
        eq=False,
        repr=False,
    )
    #: Every token id to read: the controls, then their variants (`read_ids`).
    read_ids: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: read_ids(self.token_ids, self.variant_ids), True),
        eq=False,
        repr=False,
    )
    #: Each option's (first, second) token ids when its control is a two-token code
    #: (`typevet_async._core.prompts.codes`): ``token_ids`` are then the distinct first tokens, what
    #: the first read asks for; empty: one token per control.
    codes: tuple[tuple[int, int], ...] = ()

    @property
    def user_text(self) -> str:
        return "\n\n".join(m.content for m in self.messages if m.role == "user")


def after_first(request: ScoringRequest, first: int) -> ScoringRequest:
    """The read that follows a code question's first read: the same prompt extended by the
    first token ``first`` (after the codes' lead), its candidates the seconds of the codes that
    start with it (`seconds_after`)."""
    seconds = seconds_after(request.codes, first)
    return attrs.evolve(
        request,
        token_ids=seconds,
        variant_ids=(),
        lead=(*request.lead, first),
        codes=(),
        option_groups=tuple((second,) for second in seconds),
        read_ids=seconds,
    )


@attrs.frozen
class QuestionPlan:
    """A question bound to the served controls and rendered as far as it does not depend on
    the state: built once per question and reused by every judgment that asks it."""

    question: Question
    layout: Layout
    bound: tuple[BoundOption, ...]
    #: Each option's other accepted tokens (Jev's space variants); empty when none.
    variant_ids: tuple[tuple[int, ...], ...]
    #: The default layout's field block (question, a line per control, the answer rule).
    field_block: str | None
    #: The option shown at each position (`rotation_order`); empty: the order as given.
    order: tuple[int, ...] = ()
    #: The tokens the prefix ends in before the controls (their shared lead); empty: none.
    lead: tuple[int, ...] = ()
    #: The question's examples as earlier turns: each example's user message (its state and
    #: this plan's field block) and its answer's control under this plan; empty: none.
    examples: tuple[tuple[str, str], ...] = ()

    @functools.cached_property
    def controls(self) -> tuple[str, ...]:
        return tuple(b.control for b in self.bound)

    @functools.cached_property
    def codes(self) -> tuple[tuple[int, int], ...]:
        """Each option's (first, second) tokens, when the controls are two-token codes."""
        return tuple((b.token_id, b.second_id) for b in self.bound if b.second_id is not None)

    @functools.cached_property
    def token_ids(self) -> tuple[int, ...]:
        """Each option's control token (two-token codes: each distinct first token once)."""
        if self.codes:
            return code_firsts(self.codes)
        return tuple(b.token_id for b in self.bound)

    @functools.cached_property
    def option_groups(self) -> tuple[tuple[int, ...], ...]:
        return option_groups(self.token_ids, self.variant_ids)

    @functools.cached_property
    def read_ids(self) -> tuple[int, ...]:
        return read_ids(self.token_ids, self.variant_ids)


def bind_question(
    question: Question,
    layout: Layout,
    control_ids: Mapping[str, int],
    max_candidates: int | None,
    is_special: IsSpecial = ALL_RUNS,
    rotation: int = 0,
    controls: Controls = DEFAULT_CONTROLS,
    leads: Mapping[str, tuple[int, ...]] | None = None,
    codes: Mapping[str, CodeTokens | None] | None = None,
    noul_controls: NoulControls = "letters",
    score_controls: ScoreControls = "letters",
) -> QuestionPlan:
    """Bind ``question``'s options to controls in ``layout`` and render what does not depend on
    the state (its examples' turns included). ``max_candidates`` is the backend's limit of
    candidate tokens per read. With a ``rotation``, the options are shown rotated by it (the
    controls keep their positions).
    ``controls`` picks the default layout's alphabet (the Jev layouts always use A..P);
    ``leads`` are the controls' leads in context (`typevet_async._core.prompts.controls`). Past the
    single-token controls, the default layout's options get two-token codes from ``codes``,
    what the served tokenizer said of them (`typevet_async._core.prompts.codes`). In the default
    layout a Noul under ``noul_controls="words"`` is answered ``No``/``Yes``, and a Score of
    at most 9 levels under ``score_controls="scale"`` by the numbers 1..n (both in their one
    order: `reads_in_one_order`; a ``rotation`` is ignored).

    :raises TooManyOptionsError: more options than controls (and codes), or than one read
        can take.
    :raises ControlTokenError: words for a Noul, and the served tokenizer writes ``Yes`` or
        ``No`` as more than one token at the answer position.
    :raises QuestionError: a question with examples in a Jev layout.
    """
    if question.examples and layout.is_jev:
        raise QuestionError(
            f"examples are shown as earlier turns of the default layout; the {layout.value!r} "
            "layout reproduces Jev's prompts, which have none"
        )
    leads = leads or {}
    options = question.options()
    one_order = reads_in_one_order(question, noul_controls, score_controls, jev=layout.is_jev)
    if one_order and isinstance(question, Noul):
        return _bind_words(question, layout, options, control_ids, leads, is_special)
    order = rotation_order(len(options), rotation) if rotation and not one_order else ()
    if order:
        options = tuple(options[index] for index in order)
    alphabet = JEV_LETTERS if layout.is_jev else SCALE_NUMBERS if one_order else ALPHABETS[controls]
    single = available_controls(alphabet, control_ids, leads)
    if len(options) > len(single) and codes is not None and not layout.is_jev and not one_order:
        return _bind_codes(question, layout, options, codes, max_candidates, is_special, order)
    lead = alphabet_lead(alphabet, control_ids, leads)
    bound = tuple(bind_controls(options, control_ids, alphabet, leads))
    variants = tuple(
        (control_ids[space_variant(b.control)],)
        if layout.is_jev
        and space_variant(b.control) in control_ids
        and leads.get(space_variant(b.control), ()) == lead
        else ()
        for b in bound
    )
    reads = len(bound) + sum(len(v) for v in variants)
    _check_candidates(len(options), reads, max_candidates)
    field_block = None if layout.is_jev else render_field_block(question, bound, is_special)
    return QuestionPlan(
        question,
        layout,
        bound,
        variants if any(variants) else (),
        field_block,
        order,
        lead,
        example_turns(question, bound, field_block, is_special),
    )


def _bind_words(
    question: Question,
    layout: Layout,
    options: Sequence[Option],
    control_ids: Mapping[str, int],
    leads: Mapping[str, tuple[int, ...]],
    is_special: IsSpecial,
) -> QuestionPlan:
    """A Noul answered ``No`` (false) or ``Yes`` (true), the words as the served tokenizer
    writes them at the answer position."""
    lead = leads.get(NOUL_WORDS[0], ())
    usable = all(word in control_ids for word in NOUL_WORDS) and all(
        leads.get(word, ()) == lead for word in NOUL_WORDS
    )
    if not usable:
        raise ControlTokenError(
            "noul_controls='words' needs 'Yes' and 'No' each to be one token of its own (with "
            "the same lead) at the answer position of the served tokenizer, and they are not; "
            "use noul_controls='letters'"
        )
    bound = tuple(
        BoundOption(word, control_ids[word], option)
        for word, option in zip(NOUL_WORDS, options, strict=True)
    )
    field_block = render_field_block(question, bound, is_special)
    examples = example_turns(question, bound, field_block, is_special)
    return QuestionPlan(question, layout, bound, (), field_block, (), lead, examples)


def _check_candidates(options: int, reads: int, max_candidates: int | None) -> None:
    if max_candidates is not None and reads > max_candidates:
        raise TooManyOptionsError(
            f"{options} options need {reads} candidate tokens, but one read takes at "
            f"most {max_candidates}",
            count=options,
            limit=max_candidates,
        )


def _bind_codes(
    question: Question,
    layout: Layout,
    options: Sequence[Option],
    codes: Mapping[str, CodeTokens | None],
    max_candidates: int | None,
    is_special: IsSpecial,
    order: tuple[int, ...],
) -> QuestionPlan:
    """The default layout's plan with a two-token code per option."""
    usable = usable_codes(len(options), codes)
    if len(usable) < len(options):
        raise TooManyOptionsError(
            f"{len(options)} options, but the served tokenizer keeps only {len(usable)} "
            "two-token codes (a digit, then a letter) in context",
            count=len(options),
            limit=len(usable),
        )
    bound = bind_codes(options, usable)
    field_block = render_field_block(question, bound, is_special)
    examples = example_turns(question, bound, field_block, is_special)
    plan = QuestionPlan(
        question, layout, bound, (), field_block, order, usable[0][1].lead, examples
    )
    firsts = plan.token_ids  # the distinct first tokens: the first read's candidates
    widest = max(len(seconds_after(plan.codes, first)) for first in firsts)
    _check_candidates(len(options), max(widest, len(firsts)), max_candidates)
    return plan


def request_for(
    question_id: str,
    plan: QuestionPlan,
    state_text: str,
    *,
    frame: PromptFrame | None,
    images: Sequence[ImagePart] = (),
    media_marker: str | None = None,
    is_special: IsSpecial = ALL_RUNS,
    judgment: int = 0,
    question_images: Sequence[ImagePart] = (),
) -> ScoringRequest:
    """One question's scoring request about ``state_text`` (in judgment ``judgment``).

    With a ``frame`` the SDK frames the raw prefix itself (the default layout where the
    backend frames prompts; a Jev layout's server-rendered prompt then ends in the frame's
    prefill). ``images`` (the state's) go before the state text; ``question_images`` (this
    question's own) after it, just before the question's instructions (the ``split`` layout:
    on its question message), so every question still shares the state as a prefix. With a
    ``media_marker`` each image's marker stands where it goes.

    :raises QuestionError: images with controls that need a lead token, or with two-token
        codes (whose second read ends in the first token): neither server's image prompt can
        end in a token; a question's own images under the ``fused`` layout, whose one JSON
        message cannot show them after the state.
    """
    if (images or question_images) and (plan.lead or plan.codes):
        raise _token_ending_with_images_error(question_id, plan)
    markers = "".join(f"{media_marker}\n" for _ in images) if media_marker else ""
    own = "".join(f"{media_marker}\n" for _ in question_images) if media_marker else ""
    if plan.field_block is None:
        messages = jev_messages(
            plan.layout, state_text, plan.question, plan.bound, images, is_special
        )
        messages = _with_markers(messages, markers)
        if question_images:
            messages = _with_question_images(question_id, messages, own, question_images)
        prefill = frame.prefill if frame is not None else ""
        return _planned_request(
            question_id, plan, messages, None, plan.variant_ids, prefill, judgment
        )
    question_part = f"{own}{plan.field_block}"
    content = f"{markers}{render_user_content(state_text, question_part, is_special)}"
    start = len(content) - len(question_part)  # where the question's own images go
    step = len(own) // len(question_images) if question_images else 0
    inline = tuple((start + n * step, image) for n, image in enumerate(question_images))
    messages = (Message("user", content, tuple(images), inline),)
    if plan.examples:  # earlier turns (a frame without them is refused by the planner)
        messages = (*earlier_turns(plan.examples), *messages)
    prompt = frame.prefix(content, plan.examples) if frame is not None else None
    return _planned_request(question_id, plan, messages, prompt, (), "", judgment)


def _with_question_images(
    question_id: str, messages: tuple[Message, ...], own: str, images: Sequence[ImagePart]
) -> tuple[Message, ...]:
    """A Jev layout's messages with the question's own images: before the ``split`` layout's
    question message (after the evidence message).

    :raises QuestionError: the ``fused`` layout (one message, the evidence inside its JSON).
    """
    if len(messages) < 3:
        error = QuestionError(
            "the fused layout shows the state and the question in one JSON message, so a "
            "question's own images cannot go after the state; use the default or the split "
            "layout, or give the images to the whole judgment (images=)"
        )
        error.question_id = question_id
        raise error
    question = messages[2]
    return (*messages[:2], Message(question.role, own + question.content, tuple(images)))


def _token_ending_with_images_error(question_id: str, plan: QuestionPlan) -> QuestionError:
    """A question whose reads must end in a token, asked with images: llama.cpp's image prompt
    is a string (``prompt_string``) and vLLM's token prompt carries no image, so the read would
    silently drop the token and score the wrong position."""
    if plan.codes:
        why = (
            f"its {len(plan.bound)} options are past the single-token controls and get "
            "two-token codes, whose second read must end in the code's first token"
        )
        fix = "ask it without images, or with fewer options"
    else:
        why = (
            f"its controls ({''.join(plan.controls)}) need a lead token at the answer "
            "position on this tokenizer"
        )
        fix = "controls='letters' need none on most such tokenizers"
    error = QuestionError(
        f"{why}, and no server's image prompt can end in a token, so it is refused before "
        f"any read; {fix}"
    )
    error.question_id = question_id
    return error


def _with_markers(messages: tuple[Message, ...], markers: str) -> tuple[Message, ...]:
    """A Jev layout's messages with the media markers before the state text (its second
    message); as they are without markers."""
    if not markers:
        return messages
    first = messages[1]
    return (
        messages[0],
        Message(first.role, markers + first.content, first.images),
        *messages[2:],
    )


def _planned_request(
    question_id: str,
    plan: QuestionPlan,
    messages: tuple[Message, ...],
    prompt: str | None,
    variant_ids: tuple[tuple[int, ...], ...],
    answer_prefill: str,
    judgment: int,
) -> ScoringRequest:
    """The scoring request of ``plan`` with these messages, its candidates the plan's."""
    return ScoringRequest(
        question_id,
        plan.question,
        messages,
        prompt,
        plan.controls,
        plan.token_ids,
        variant_ids,
        answer_prefill,
        judgment,
        plan.order,
        plan.lead,
        plan.option_groups,
        plan.read_ids,
        plan.codes,
    )


def plan_question(
    question_id: str,
    question: Question,
    state_text: str,
    *,
    family: TemplateFamily | None,
    control_ids: Mapping[str, int],
    layout: Layout = Layout.TYPEVET,
    images: Sequence[ImagePart] = (),
    media_marker: str | None = None,
    max_candidates: int | None = None,
    question_images: Sequence[ImagePart] = (),
) -> ScoringRequest:
    """`bind_question` and `request_for` in one step, for one question (``family``: a Gemma
    family, whose frame the SDK writes; None: the server renders the messages).

    :raises TooManyOptionsError: as `bind_question` (``question_id`` names the question).
    """
    try:
        plan = bind_question(question, layout, control_ids, max_candidates)
    except TypevetError as error:
        error.question_id = question_id
        raise
    frame = None if family is None else GEMMA_FRAMES[family]
    return request_for(
        question_id,
        plan,
        state_text,
        frame=frame,
        images=images,
        media_marker=media_marker,
        question_images=question_images,
    )
