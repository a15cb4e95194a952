"""Examples in context: a question's (state, answer) pairs shown as earlier turns.

Each example is a user turn rendered as a real one is (its state, then the question's field
block) and the assistant's answer, the control its option has in the plan that asks it (under
a rotation, the rotated control). The turns go before the state, so every state asked the
same question shares them as a cached prefix
(`typevet_async._core.prompts.framing.PromptFrame.prefix`
frames them where the SDK frames prompts; a server that renders messages gets them as
messages).
"""

from __future__ import annotations

from collections.abc import Sequence

from typevet_async._core.prompts.controls import BoundOption
from typevet_async._core.prompts.fields import render_user_content
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.prompts.markers import IsSpecial
from typevet_async._core.prompts.questions import Question

__all__ = ["earlier_turns", "example_turns"]


def example_turns(
    question: Question,
    bound: Sequence[BoundOption],
    field_block: str | None,
    is_special: IsSpecial,
) -> tuple[tuple[str, str], ...]:
    """Each example as an earlier turn: its user message (the state and the field block) and
    the control of its answer as ``bound`` binds it. None in a layout without a field block."""
    if not question.examples or field_block is None:
        return ()
    control_of = {b.option.label: b.control for b in bound}
    return tuple(
        (render_user_content(state, field_block, is_special), control_of[label])
        for state, label in question.examples
    )


def earlier_turns(examples: Sequence[tuple[str, str]]) -> tuple[Message, ...]:
    """The examples' turns as chat messages: each a user message and the assistant's answer."""
    return tuple(
        Message(role, text)
        for example, answer in examples
        for role, text in (("user", example), ("assistant", answer))
    )
