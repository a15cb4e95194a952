"""The field block: the question, one line per control, and the answer rule.

Lines start with the control itself: the earlier system measured 0.91 of the next-token mass on
the word "Control" when option lines started with it, and 2e-7 once they did not.
"""

from __future__ import annotations

from collections.abc import Sequence

from typevet_async._core.controls import BoundOption
from typevet_async._core.markers import ALL_RUNS, IsSpecial, neutralise, neutralise_line
from typevet_async._core.questions import Choice, Noul, Question, Score

__all__ = ["render_field_block", "render_user_content"]

_NOUL_WORDS = {"false": "No", "true": "Yes"}


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
    return f"{bound.control} = {text}"


def _answer_rule(question: Question, bound: Sequence[BoundOption]) -> str:
    kind = "digit" if all(b.control.isdigit() for b in bound) else "digit or letter"
    if isinstance(question, Choice):
        return f"Reply with the one {kind} of the option that fits best."
    if isinstance(question, Score):
        return f"Reply with the one {kind} of the level that fits best."
    return f"Reply with the one {kind} of your answer."


def render_field_block(
    question: Question, bound: Sequence[BoundOption], is_special: IsSpecial = ALL_RUNS
) -> str:
    """The question line, a line per control, and a last line asking for exactly one control
    (caller text neutralised by ``is_special``: `typevet_async._core.markers`)."""
    lines = [f"Question: {neutralise_line(question.instructions, is_special)}"]
    lines.extend(_option_line(question, option, is_special) for option in bound)
    lines.append(_answer_rule(question, bound))
    return "\n".join(lines)


def render_user_content(state_text: str, field_block: str, is_special: IsSpecial = ALL_RUNS) -> str:
    """State first (so every question of a judgment shares it as a prefix), then the field
    block (`render_field_block`, rendered once per question)."""
    return f"{neutralise(state_text, is_special)}\n\n{field_block}"
