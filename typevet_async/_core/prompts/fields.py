"""The field block: the instructions, one line per control, and the answer rule.

It reads as the prompt a user writes by hand for a multiple-choice question::

    <state>

    Which team should handle the ticket?
    A. billing: charges, invoices
    B. shipping: parcels
    Answer with one letter.

Measured on a real instruction model (Qwen2.5 Coder 1.5B Instruct, README "Real answers"): the
earlier block (``Question: ...``, ``0 = billing: ...``, "Reply with the one digit of the option
that fits best.") was right on 0.617 of the shipped set's routes where this one is right on
0.783; letters alone moved it to 0.650, ``A.`` for ``A =`` nothing. Lines start with the control
itself: the earlier system measured 0.91 of the next-token mass on the word "Control" when
option lines started with it, and 2e-7 once they did not.
"""

from __future__ import annotations

from collections.abc import Sequence

from typevet_async._core.prompts.controls import NOUL_WORDS, SCALE_NUMBERS, BoundOption
from typevet_async._core.prompts.markers import ALL_RUNS, IsSpecial, neutralise, neutralise_line
from typevet_async._core.prompts.questions import Noul, Question, Score

__all__ = ["FIELD_BLOCK_VERSION", "framing_pin", "render_field_block", "render_user_content"]

#: The field block's wording: 1 was ``Question: ...`` / ``0 = ...`` / "Reply with the one digit
#: ..."; 2 is the plain letter prompt above. A calibration map pins it (`framing_pin`).
FIELD_BLOCK_VERSION = 2

_NOUL_WORDS = {"false": "No", "true": "Yes"}


def _answers_in_words(bound: Sequence[BoundOption]) -> bool:
    """A Noul answered with the words themselves (``noul_controls="words"``)."""
    return tuple(b.control for b in bound) == NOUL_WORDS


def _answers_on_scale(question: Question, bound: Sequence[BoundOption]) -> bool:
    """A Score numbered from 1 (``score_controls="scale"``)."""
    controls = tuple(b.control for b in bound)
    return isinstance(question, Score) and controls == SCALE_NUMBERS[: len(controls)]


def _option_line(question: Question, bound: BoundOption, is_special: IsSpecial) -> str:
    option = bound.option
    if isinstance(question, Noul):
        text = _NOUL_WORDS[option.label]
        if option.description:
            text += f": {neutralise_line(option.description, is_special)}"
    elif isinstance(question, Score):
        text = neutralise_line(option.description or option.label, is_special)
    else:
        text = neutralise_line(option.label, is_special)
        if option.description:
            text += f": {neutralise_line(option.description, is_special)}"
    return f"{bound.control}. {text}"


def _answer_rule(question: Question, bound: Sequence[BoundOption]) -> str:
    if _answers_in_words(bound):
        return "Answer Yes or No."
    if _answers_on_scale(question, bound):
        return f"Answer with one number from 1 to {len(bound)}."
    if any(b.second_id is not None for b in bound):
        return "Answer with one code: its digit, then its letter."
    if all(b.control.isdigit() for b in bound):
        return "Answer with one digit."
    if all(b.control.isalpha() for b in bound):
        return "Answer with one letter."
    return "Answer with one letter or digit."


def render_field_block(
    question: Question, bound: Sequence[BoundOption], is_special: IsSpecial = ALL_RUNS
) -> str:
    """The instructions, a line per control, and a last line asking for exactly one control
    (caller text neutralised by ``is_special``: `typevet_async._core.prompts.markers`). A Noul
    answered in words has no option lines but its described ones (``Yes: ...``)."""
    lines = [neutralise_line(question.instructions, is_special)]
    if _answers_in_words(bound):
        lines.extend(
            f"{b.control}: {neutralise_line(b.option.description, is_special)}"
            for b in bound
            if b.option.description
        )
    else:
        lines.extend(_option_line(question, option, is_special) for option in bound)
    lines.append(_answer_rule(question, bound))
    return "\n".join(lines)


def render_user_content(state_text: str, field_block: str, is_special: IsSpecial = ALL_RUNS) -> str:
    """State first (so every question of a judgment shares it as a prefix), then the field
    block (`render_field_block`, rendered once per question)."""
    return f"{neutralise(state_text, is_special)}\n\n{field_block}"


def framing_pin(
    layout: str,
    controls: str,
    noul_controls: str = "letters",
    score_controls: str = "letters",
    content_free: str = "off",
) -> str:
    """What a calibration map pins of the prompt's framing and reading: the layout, and for
    the default layout (``"typevet"``) its alphabet and field block version
    (``"typevet/letters/2"``), then each answer method that is not the alphabet's
    (``/noul-words``, ``/score-scale``) and content-free calibration (``/content-free`` for
    every question, ``/content-free-scores``), so a map fitted before they existed pins what
    it pinned then."""
    methods = {"off": "", "all": "/content-free"}.get(content_free, f"/content-free-{content_free}")
    if layout != "typevet":
        return f"{layout}{methods}"
    if noul_controls != "letters":
        methods = f"/noul-{noul_controls}{methods}"
    if score_controls != "letters":
        methods = f"/score-{score_controls}{methods}"
    return f"typevet/{controls}/{FIELD_BLOCK_VERSION}{methods}"
