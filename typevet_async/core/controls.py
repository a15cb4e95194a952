"""Controls: the one-token answer each option is given.

`bind_controls` is the only place that pairs options with controls and token ids, so the
controls rendered into the prompt and the token ids scored can never drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from typevet_async.core.questions import Option
from typevet_async.errors import ControlTokenError, TooManyOptionsError

__all__ = ["DIGITS", "BoundOption", "bind_controls", "control_token_ids"]

#: Controls in the order they are handed out.
DIGITS: tuple[str, ...] = tuple("0123456789")


@attrs.frozen
class BoundOption:
    """An option with the control that answers it and that control's token id."""

    control: str
    token_id: int
    option: Option


def control_token_ids(
    tokenized: Mapping[str, Sequence[int]],
) -> dict[str, int]:
    """Keep the controls that tokenized to exactly one token; refuse the set if any did not."""
    ids: dict[str, int] = {}
    for control, tokens in tokenized.items():
        if len(tokens) != 1:
            raise ControlTokenError(
                f"control {control!r} must be exactly one token on the served tokenizer, "
                f"it is {len(tokens)}: {list(tokens)!r}"
            )
        ids[control] = tokens[0]
    if len(set(ids.values())) != len(ids):
        raise ControlTokenError(f"two controls share a token id: {ids!r}")
    return ids


def bind_controls(
    options: Sequence[Option],
    control_ids: Mapping[str, int],
    alphabet: Sequence[str] = DIGITS,
) -> tuple[BoundOption, ...]:
    """Give option ``i`` the ``i``-th control of ``alphabet`` that has a token id."""
    available = [control for control in alphabet if control in control_ids]
    if len(options) > len(available):
        raise TooManyOptionsError(
            f"{len(options)} options, but only {len(available)} single-token controls "
            f"({''.join(available)}) are available",
            count=len(options),
            limit=len(available),
        )
    return tuple(
        BoundOption(control, control_ids[control], option)
        for control, option in zip(available, options, strict=False)
    )
