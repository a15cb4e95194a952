"""Controls: the one-token answer each option is given.

`bind_controls` is the only place that pairs options with controls and token ids, so the
controls rendered into the prompt and the token ids scored can never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from typevet_async._core.questions import Option
from typevet_async._errors import ControlTokenError, TooManyOptionsError

__all__ = [
    "ALPHABETS",
    "DEFAULT_ALPHABET",
    "DEFAULT_CONTROLS",
    "DIGITS",
    "JEV_LETTERS",
    "PROBED_CONTROLS",
    "BoundOption",
    "Controls",
    "bind_controls",
    "control_token_ids",
    "space_variant",
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


def space_variant(control: str) -> str:
    """The same control after a space (``" A"``): Jev counts both as the answer A."""
    return f" {control}"


#: Every control the probe tokenizes: the alphabet and the space variants of Jev's letters.
PROBED_CONTROLS: tuple[str, ...] = DEFAULT_ALPHABET + tuple(
    space_variant(letter) for letter in JEV_LETTERS
)


@attrs.frozen
class BoundOption:
    """An option with the control that answers it and that control's token id."""

    control: str
    token_id: int
    option: Option


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


def bind_controls(
    options: Sequence[Option],
    control_ids: Mapping[str, int],
    alphabet: Sequence[str] = DEFAULT_ALPHABET,
) -> tuple[BoundOption, ...]:
    """Give option ``i`` the ``i``-th control of ``alphabet`` that has a token id."""
    available = [control for control in alphabet if control in control_ids]
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
