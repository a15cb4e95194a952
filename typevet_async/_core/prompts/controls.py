"""Controls: the one-token answer each option is given, and the token the model writes for it.

`bind_controls` is the only place that pairs options with controls and token ids, so the
controls rendered into the prompt and the token ids scored can never drift apart.

A control's token id is the one the served tokenizer gives it *in context*, at the answer
position (`controls_in_context`): the prefix is tokenized with and without the control and the
control's ids are what it adds. On most vocabularies that is the control's own token. On a
SentencePiece vocabulary with a dummy prefix (Llama 2, Mistral v0.1-v0.3, Mixtral) the model
writes a word-start ``▁`` before a digit (``"0"`` after ``[/INST]`` is ``▁`` then ``0``), while
``"A"`` is the one token ``▁A``: the ``▁`` is that control's *lead*. A question's controls all
share one lead (the lead of its alphabet's first control); the lead goes at the end of the
prefix, so the one read is at the position where the model writes the control itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from typevet_async._core.prompts.questions import Noul, Option, Question, Score
from typevet_async._errors import ControlTokenError, TooManyOptionsError

__all__ = [
    "ALPHABETS",
    "DEFAULT_ALPHABET",
    "DEFAULT_CONTROLS",
    "DIGITS",
    "JEV_LETTERS",
    "LOWERCASE",
    "NOUL_WORDS",
    "PROBED_CONTROLS",
    "REQUIRED_CONTROLS",
    "SCALE_NUMBERS",
    "UPPERCASE",
    "BoundOption",
    "Controls",
    "ControlsInContext",
    "NoulControls",
    "ScoreControls",
    "alphabet_lead",
    "available_controls",
    "bind_controls",
    "control_token_ids",
    "controls_in_context",
    "reads_in_one_order",
    "space_variant",
    "with_bare_tokens",
]

DIGITS: tuple[str, ...] = tuple("0123456789")
UPPERCASE: tuple[str, ...] = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
LOWERCASE: tuple[str, ...] = tuple("abcdefghijklmnopqrstuvwxyz")
#: Which controls the default layout hands out first: ``"letters"`` (A, B, C, ... then a..z,
#: then digits) or ``"digits"`` (0..9, then A..Z, a..z). How many of them a question may use is
#: what the served tokenizer keeps as single tokens.
Controls = Literal["letters", "digits"]
ALPHABETS: Mapping[str, tuple[str, ...]] = {
    "letters": UPPERCASE + LOWERCASE + DIGITS,
    "digits": DIGITS + UPPERCASE + LOWERCASE,
}
#: Measured on a real instruction model (README, "Real answers"): letters.
DEFAULT_CONTROLS: Controls = "letters"
DEFAULT_ALPHABET: tuple[str, ...] = ALPHABETS[DEFAULT_CONTROLS]
#: The Jev gateway's controls: letters A..P, 2 to 16 options.
JEV_LETTERS: tuple[str, ...] = UPPERCASE[:16]


#: How a Noul is answered: ``"letters"`` (``A. No`` / ``B. Yes``, the alphabet's controls) or
#: ``"words"`` (the words themselves, `NOUL_WORDS`: "Answer Yes or No.").
NoulControls = Literal["letters", "words"]
#: A Noul's controls under ``noul_controls="words"``, in option order (false, true): the words
#: an instruction model writes for a yes/no question.
NOUL_WORDS: tuple[str, str] = ("No", "Yes")
#: How a Score is answered: ``"letters"`` (its levels lettered like a Choice's options) or
#: ``"scale"`` (numbered from 1, lowest first: `SCALE_NUMBERS`).
ScoreControls = Literal["letters", "scale"]
#: A Score's controls under ``score_controls="scale"``: level ``i`` is the number ``i + 1``
#: (a scale of at most 9 levels; a longer one is lettered).
SCALE_NUMBERS: tuple[str, ...] = DIGITS[1:]


def space_variant(control: str) -> str:
    """The same control after a space (``" A"``): Jev counts both as the answer A."""
    return f" {control}"


#: Every control the probe tokenizes: the alphabet, the space variants of Jev's letters and
#: a Noul's words.
PROBED_CONTROLS: tuple[str, ...] = (
    DEFAULT_ALPHABET + tuple(space_variant(letter) for letter in JEV_LETTERS) + NOUL_WORDS
)
#: A served tokenizer must give these controls a token in context, or the probe refuses it:
#: a Noul's two answers under the default alphabet.
REQUIRED_CONTROLS: tuple[str, ...] = DEFAULT_ALPHABET[:2]


@attrs.frozen
class ControlsInContext:
    """Each control's token id at the answer position, and the lead of those that need one."""

    ids: Mapping[str, int]
    #: The tokens the model writes before a control's own token (SentencePiece's ``▁`` before a
    #: digit); a control not named here has none.
    leads: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)


def controls_in_context(
    base: Sequence[int],
    extended: Mapping[str, Sequence[int]],
    required: Sequence[str] = REQUIRED_CONTROLS,
) -> ControlsInContext:
    """What each control adds to the tokenized answer position.

    :param base: the tokens of a prefix that ends at the answer position.
    :param extended: each control's tokens of the same prefix with the control appended.

    A control adds one token (its id) or two (a lead, then its id). A control whose tokens do
    not extend ``base``, that adds more than two, or whose (lead, id) another control already
    has is left out (it narrows the option limit, nothing more), unless it is ``required``.

    :raises ControlTokenError: a ``required`` control has no token of its own in context.
    """
    ids: dict[str, int] = {}
    leads: dict[str, tuple[int, ...]] = {}
    taken: set[tuple[tuple[int, ...], int]] = set()
    width = len(base)
    for control, tokens in extended.items():
        added = tuple(tokens[width:])
        extends = len(tokens) > width and tuple(tokens[:width]) == tuple(base)
        key = (added[:-1], added[-1]) if extends and len(added) <= 2 else None
        if key is None or key in taken:
            if control in required:
                found = (
                    "changes the prefix's own tokens"
                    if not extends
                    else f"shares the tokens {list(added)!r} with another control"
                    if key in taken
                    else f"adds {list(added)!r}"
                )
                raise ControlTokenError(
                    f"control {control!r} must add one token of its own (or a lead and one "
                    f"token) at the answer position of the served tokenizer; it {found}"
                )
            continue
        taken.add(key)
        ids[control] = key[1]
        if key[0]:
            leads[control] = key[0]
    return ControlsInContext(ids, leads)


@attrs.frozen
class BoundOption:
    """An option with the control that answers it and that control's token id."""

    control: str
    token_id: int
    option: Option
    #: The code's second token, when the control is a two-token code
    #: (`typevet_async._core.prompts.codes`; ``token_id`` is then its first); None: one token.
    second_id: int | None = None


def control_token_ids(
    tokenized: Mapping[str, Sequence[int]], required: Sequence[str] = DIGITS
) -> dict[str, int]:
    """The controls that are exactly one token, in the order given.

    A ``required`` control that is not one token, or that shares its id, refuses the whole
    set; any other such control is left out (it narrows the option limit, nothing more).
    """
    ids: dict[str, int] = {}
    taken: set[int] = set()
    for control, tokens in tokenized.items():
        single = len(tokens) == 1 and tokens[0] not in taken
        if not single:
            if control in required:
                raise ControlTokenError(
                    f"control {control!r} must be exactly one token of its own on the served "
                    f"tokenizer, it is {list(tokens)!r}"
                )
            continue
        ids[control] = tokens[0]
        taken.add(tokens[0])
    return ids


def with_bare_tokens(
    controls: ControlsInContext, bare: Mapping[str, Sequence[int]]
) -> ControlsInContext:
    """``controls`` with each control it lacks taken from its tokenization alone, where that
    is one token no other control (without a lead) has. For a server whose template renders
    the answer (vLLM): a template that trims the answer (Gemma's) renders ``" A"`` as ``"A"``,
    yet the model may still write the one token ``" A"`` first."""
    ids = dict(controls.ids)
    taken = {token for control, token in ids.items() if control not in controls.leads}
    for control, tokens in bare.items():
        if control in ids or len(tokens) != 1 or tokens[0] in taken:
            continue
        ids[control] = tokens[0]
        taken.add(tokens[0])
    return ControlsInContext(ids, controls.leads)


def alphabet_lead(
    alphabet: Sequence[str], control_ids: Mapping[str, int], leads: Mapping[str, tuple[int, ...]]
) -> tuple[int, ...]:
    """The lead every control of a question under ``alphabet`` shares: its first control's."""
    first = next((control for control in alphabet if control in control_ids), None)
    return leads.get(first, ()) if first is not None else ()


def available_controls(
    alphabet: Sequence[str],
    control_ids: Mapping[str, int],
    leads: Mapping[str, tuple[int, ...]] | None = None,
) -> list[str]:
    """The controls of ``alphabet`` a question can use, in order: those with a token id and
    the lead of the alphabet's first control (`alphabet_lead`)."""
    leads = leads or {}
    lead = alphabet_lead(alphabet, control_ids, leads)
    return [
        control for control in alphabet if control in control_ids and leads.get(control, ()) == lead
    ]


def bind_controls(
    options: Sequence[Option],
    control_ids: Mapping[str, int],
    alphabet: Sequence[str] = DEFAULT_ALPHABET,
    leads: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[BoundOption, ...]:
    """Give option ``i`` the ``i``-th control of ``alphabet`` that has a token id (and, where
    some controls need a lead, the lead of the alphabet's first control: `alphabet_lead`)."""
    available = available_controls(alphabet, control_ids, leads)
    if len(options) > len(available):
        raise TooManyOptionsError(
            f"{len(options)} options, but the served tokenizer has only {len(available)} "
            f"single-token controls ({''.join(available)}) for this layout",
            count=len(options),
            limit=len(available),
        )
    return tuple(
        BoundOption(control, control_ids[control], option)
        for control, option in zip(available, options, strict=False)
    )


def reads_in_one_order(
    question: Question,
    noul_controls: NoulControls,
    score_controls: ScoreControls,
    *,
    jev: bool = False,
) -> bool:
    """Whether the default layout answers ``question`` with controls whose order is their
    meaning (a Noul's words, a Score's numbers from 1), so it is read in that order only; a
    Jev layout (``jev``) never does (its letters A..P)."""
    if jev:
        return False
    if isinstance(question, Noul):
        return noul_controls == "words"
    if isinstance(question, Score):
        return score_controls == "scale" and len(question.levels) <= len(SCALE_NUMBERS)
    return False
