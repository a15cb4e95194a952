"""Prompt layouts: the default (typevet) layout, and the Jev gateway's ``fused`` and ``split``.

Every layout puts the state first, so every question of a judgment shares it as a prefix (on
llama.cpp through ``cache_prompt``, on vLLM through its prefix cache).

Jev's layouts reproduce its prompts byte for byte, so that calibrations measured there carry
over: letters ``A``..``P``, one fixed system message, and compact JSON user content.
``fused`` sends ``{"evidence", "criterion", "options": [{"letter", "description"}]}`` in one
user message; ``split`` sends ``{"evidence"}`` (with any images) in a first user message,
identical for every question of a judgment, and ``{"criterion", "options"}`` in a second.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import attrs

from typevet_async._core.prompts.controls import BoundOption
from typevet_async._core.prompts.markers import ALL_RUNS, IsSpecial, neutralise, neutralise_line
from typevet_async._core.prompts.questions import Noul, Option, Question, refuse_lookalike_options
from typevet_async._core.wires.jsonvalues import compact_json

__all__ = [
    "JEV_SYSTEM_PROMPT",
    "ImagePart",
    "Layout",
    "Message",
    "jev_messages",
    "jev_option_descriptions",
    "refuse_jev_lookalikes",
]

#: The one system message of both Jev layouts: the same for every question type, so cacheable.
JEV_SYSTEM_PROMPT = (
    "You are a careful evaluator. Read the evidence, the criterion and the lettered options. "
    "Answer with exactly one letter, the letter of the option that fits best, and nothing else."
)


class ImagePart(Protocol):
    """An image as a message carries it (the SDK's `Image`)."""

    @property
    def data(self) -> bytes: ...

    @property
    def sha256(self) -> str:
        """The hex SHA-256 of ``data`` (what the read cache's key holds instead of the bytes)."""
        ...

    def data_uri(self) -> str: ...


class Layout(enum.Enum):
    TYPEVET = "typevet"
    FUSED = "fused"
    SPLIT = "split"

    @property
    def is_jev(self) -> bool:
        return self is not Layout.TYPEVET


@attrs.frozen
class Message:
    """One chat message; ``images`` (if any) go before its text, each of ``inline`` at its
    character offset in the text (a question's own images, after the state)."""

    role: str
    content: str
    images: tuple[ImagePart, ...] = ()
    #: (offset in ``content``, image), offsets ascending.
    inline: tuple[tuple[int, ImagePart], ...] = ()

    def all_images(self) -> tuple[ImagePart, ...]:
        """Every image of the message, in the order it shows them."""
        if not self.inline:
            return self.images
        return (*self.images, *(image for _, image in self.inline))

    def segments(self) -> tuple[str | ImagePart, ...]:
        """The message in order: its leading images, then its text cut at each inline image
        (empty pieces dropped)."""
        pieces: list[str | ImagePart] = list(self.images)
        start = 0
        for offset, image in self.inline:
            pieces.append(self.content[start:offset])
            pieces.append(image)
            start = offset
        pieces.append(self.content[start:])
        return tuple(piece for piece in pieces if not isinstance(piece, str) or piece)


def jev_option_descriptions(
    question: Question, options: Sequence[Option] | None = None
) -> list[str]:
    """Each option's description (of ``options``, by default the question's own, in order): a
    Noul's default to No/Yes, a Choice's label if undescribed."""
    shown = question.options() if options is None else options
    if isinstance(question, Noul):
        defaults = {"false": "No", "true": "Yes"}
        return [o.description or defaults[o.label] for o in shown]
    return [o.description or o.label for o in shown]


def jev_messages(
    layout: Layout,
    evidence: str,
    question: Question,
    bound: Sequence[BoundOption],
    images: Sequence[ImagePart] = (),
    is_special: IsSpecial = ALL_RUNS,
) -> tuple[Message, ...]:
    """The Jev gateway's messages for one question, its JSON compact as the gateway sends it."""
    options = [
        {"letter": b.control, "description": neutralise_line(description, is_special)}
        for b, description in zip(
            bound, jev_option_descriptions(question, [b.option for b in bound]), strict=True
        )
    ]
    evidence = neutralise(evidence, is_special)
    criterion = neutralise_line(question.instructions, is_special)
    system = Message("system", JEV_SYSTEM_PROMPT)
    if layout is Layout.FUSED:
        fused = {"evidence": evidence, "criterion": criterion, "options": options}
        return (system, Message("user", compact_json(fused), tuple(images)))
    if layout is Layout.SPLIT:
        return (
            system,
            Message("user", compact_json({"evidence": evidence}), tuple(images)),
            Message("user", compact_json({"criterion": criterion, "options": options})),
        )
    raise ValueError(f"{layout.value!r} is not a Jev layout")


def refuse_jev_lookalikes(checked: Sequence[tuple[str, Question]]) -> None:
    """The Jev layouts show an option's description in place of its label: two options must
    not read the same there either."""
    for question_id, question in checked:
        refuse_lookalike_options(question_id, question, jev_option_descriptions(question))
