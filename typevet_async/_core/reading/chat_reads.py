"""Reading candidates from an OpenAI-compatible chat server's ``top_logprobs``: which returned
entry counts for which control, the truncation policies over a window the server caps, and
what the probe learns from the server's replies (its cap, the controls it writes whole).

Such a server returns, at the answer position, its top ``N`` tokens as text with their
full-vocabulary logprobs (OpenAI's ``choices[0].logprobs.content[0].top_logprobs``), and
often a token id (llama.cpp's ``id``, vLLM's ``token_id:N``) or the token's ``bytes``. An
entry counts for a control when its text is the control, with or without leading whitespace
(Jev's rule: ``"A"`` and ``" A"`` both answer A, the likelier kept); where the probe learnt
the controls' ids (``/tokenize``) and the entry carries one, the id decides instead. The
candidates' values are full-vocabulary logprobs whatever ``N``, so with every candidate in
the window the answer is the exact softmax over them and the off-menu mass is known.

Pure functions, no I/O (`typevet_async._backends.openai_compatible` awaits between them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import attrs

from typevet_async._core.prompts.controls import (
    DIGITS,
    LOWERCASE,
    NOUL_WORDS,
    UPPERCASE,
    space_variant,
)
from typevet_async._errors import CandidateMissingError, InvalidLogprobsError

__all__ = [
    "DEFAULT_TOP_LOGPROBS",
    "MAX_TOP_LOGPROBS",
    "STEP_DOWN",
    "TEXT_CONTROLS",
    "TOKENIZED_CONTROLS",
    "WIDENING_FACTOR",
    "ChatEntry",
    "ChatOnMissing",
    "ChatServer",
    "SettledRead",
    "after_refusal",
    "limit_from_error",
    "match_options",
    "normalised",
    "settle_options",
    "text_control_ids",
    "whole_controls",
    "wider",
    "window_limit",
]

ChatOnMissing = Literal["exact", "clamp", "error"]

#: The first read's window: OpenAI's cap, and what the Jev gateway reads.
DEFAULT_TOP_LOGPROBS: Final = 20
#: The widest read a session asks for where the server states no cap (the Jev gateway's
#: ceiling); a larger ``top_logprobs`` asked for raises it.
MAX_TOP_LOGPROBS: Final = 4096
#: Each widening asks for this many times more entries (up to the server's cap).
WIDENING_FACTOR: Final = 32
#: The windows the probe steps down through when a server refuses one without naming its
#: limit.
STEP_DOWN: Final = (4096, 1024, 256, 128, 64, 20, 10, 5, 1)

#: The controls a session uses where the server offers no ``/tokenize``: letters, single
#: tokens in every major vocabulary (digits are not: a SentencePiece tokenizer with a dummy
#: prefix writes ``▁`` before one; and words split in some), with their space variants.
TEXT_CONTROLS: Final = (
    *UPPERCASE,
    *LOWERCASE,
    *(space_variant(letter) for letter in UPPERCASE + LOWERCASE),
)
#: The controls a ``/tokenize`` probe checks for one token each (with their space variants).
TOKENIZED_CONTROLS: Final = (*UPPERCASE, *LOWERCASE, *DIGITS, *NOUL_WORDS)

#: Leading whitespace, and the word-start markers of byte-level BPE (``Ġ``) and SentencePiece
#: (``▁``) that a server may return undecoded.
_LEADING: Final = re.compile(r"^[\s\u0120\u2581]+")


@attrs.frozen
class ChatServer:
    """What the probe learnt of an OpenAI-compatible chat server (``Probe.chat_server``)."""

    #: The most ``top_logprobs`` it takes (None: no limit up to what was asked: the widest a
    #: session reads is then `MAX_TOP_LOGPROBS`, or the ``top_logprobs`` asked for if larger).
    top_logprobs_cap: int | None
    #: Whether it takes ``chat_template_kwargs`` (thinking off); refused: not sent again.
    thinking_switch: bool
    #: Whether it offers ``/tokenize`` (the controls were then checked to be one token each,
    #: and entries that carry an id are matched by it).
    tokenize: bool
    #: What it refused at the probe, in words (``"top_logprobs above 20"``,
    #: ``"chat_template_kwargs"``, ``"/tokenize"``).
    refused: tuple[str, ...] = ()
    #: The controls its probe reads returned whole (one entry each: letters, ``Yes``,
    #: ``No``), sorted: without ``/tokenize``, what shows they are one token.
    whole_controls: tuple[str, ...] = ()


@attrs.frozen
class ChatEntry:
    """One returned entry: its text (decoded from ``bytes`` where the server gave them), its
    logprob, and its token id where the server gave one."""

    text: str
    logprob: float
    token_id: int | None = None


def normalised(text: str) -> str:
    """The text without leading whitespace (or an undecoded word-start marker)."""
    return _LEADING.sub("", text)


def text_control_ids(words: bool) -> dict[str, int]:
    """Stand-in ids for `TEXT_CONTROLS` (and, with ``words``, a Noul's words and their space
    variants) where the server's tokenizer cannot be asked: each control's index (the read
    matches entries by text, never by these)."""
    controls = list(TEXT_CONTROLS)
    if words:
        controls += [*NOUL_WORDS, *map(space_variant, NOUL_WORDS)]
    return {control: index for index, control in enumerate(controls)}


def match_options(
    entries: Sequence[ChatEntry],
    groups: Sequence[Sequence[int]],
    controls: Mapping[int, str],
    accepted_ids: Mapping[int, frozenset[int]] | None,
) -> list[float | None]:
    """Each option's value: the largest logprob of an entry that counts for one of its
    tokens (None: none came back).

    :param groups: each option's token ids (its control's, then its variants').
    :param controls: the control's text of each id in ``groups``.
    :param accepted_ids: where the probe learnt real ids, each group id's accepted ids (its
        control's and its space variant's): an entry with an id counts by it; None, or an
        entry without an id: by text (`normalised` equal to the control's).
    """
    best: list[float | None] = []
    for group in groups:
        texts = {normalised(controls[token]) for token in group}
        ids: set[int] = set()
        if accepted_ids is not None:
            for token in group:
                ids |= accepted_ids.get(token, frozenset())
        value: float | None = None
        for entry in entries:
            if entry.token_id is not None and accepted_ids is not None:
                counts = entry.token_id in ids
            else:
                counts = normalised(entry.text) in texts
            if counts and (value is None or entry.logprob > value):
                value = entry.logprob
        best.append(value)
    return best


@attrs.frozen
class SettledRead:
    """The options' ids (one each: its control's) and logprobs, and how many ``clamp``
    filled in."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    clamped: int = 0


def settle_options(
    values: Sequence[float | None],
    groups: Sequence[Sequence[int]],
    entries: Sequence[ChatEntry],
    policy: ChatOnMissing,
    top_logprobs: int,
    limit: str,
) -> SettledRead:
    """The read under ``policy`` once it can widen no further (``exact`` and ``clamp`` widen
    before they get here with an option missing).

    ``clamp`` (Jev's): a missing option gets the lowest logprob returned.

    :param limit: what stopped the window, for the error (``"the server's cap of 20"``).
    :raises CandidateMissingError: an option is missing under ``exact`` or ``error``.
    :raises InvalidLogprobsError: ``clamp`` with nothing returned to clamp to.
    """
    missing = tuple(group[0] for group, value in zip(groups, values, strict=True) if value is None)
    if missing and policy != "clamp":
        raise CandidateMissingError(
            f"candidate token ids {list(missing)} are outside the top {top_logprobs} the server "
            f"returned ({limit}; on_missing={policy!r}): on_missing='clamp' answers with them "
            "clamped and flagged truncated",
            missing=missing,
        )
    if missing and not entries:
        raise InvalidLogprobsError("the read returned no logprobs to clamp to")
    floor = min((entry.logprob for entry in entries), default=0.0)
    logprobs = tuple(floor if value is None else value for value in values)
    return SettledRead(tuple(group[0] for group in groups), logprobs, len(missing))


def wider(top_logprobs: int, returned: int, ceiling: int | None) -> int | None:
    """The next, larger window after a read of ``top_logprobs`` that returned ``returned``
    entries, up to ``ceiling`` (None: no ceiling); None: no wider read can return more (the
    ceiling is reached, or the server returned fewer than asked: its whole vocabulary, or a
    cap it applies without saying)."""
    if returned < top_logprobs or (ceiling is not None and top_logprobs >= ceiling):
        return None
    widened = top_logprobs * WIDENING_FACTOR
    return widened if ceiling is None else min(widened, ceiling)


def window_limit(
    policy: ChatOnMissing, cap: int | None, ceiling: int | None, top_logprobs: int, returned: int
) -> str:
    """What stopped a read's window from widening, in words (for `settle_options`' error)."""
    if policy == "error":
        return "no wider read under on_missing='error'"
    if cap is not None and top_logprobs >= cap:
        return f"the server's cap of {cap}"
    if ceiling is not None and top_logprobs >= ceiling:
        return f"the widest read, {top_logprobs}"
    return f"all it returns: {returned} entries"


#: A number a refusal names as a limit: after "<=", "at most", "max allowed:", "maximum
#: value", "less than or equal to", "between 0 and", "up to".
_LIMIT: Final = re.compile(
    r"(?:<=|\u2264|at most|max(?:imum)?(?: value)?(?: allowed)?(?: is)?:?|"
    r"less than or equal to|between \d+ and|up to)\s*(\d{1,7})(?![\d.])",
    re.IGNORECASE,
)


def limit_from_error(message: str, asked: int) -> int | None:
    """The ``top_logprobs`` limit a server's refusal names, if it names one: a number below
    ``asked`` in a message about (top_)logprobs (OpenAI: "Expected a value <= 20, but got 21
    instead"; vLLM: "Requested sample logprobs of 30, which is greater than max allowed:
    20"). None: the message names none."""
    if "logprob" not in message.lower():
        return None
    numbers = [int(found) for found in _LIMIT.findall(message)]
    below = [number for number in numbers if 0 < number < asked]
    return max(below) if below else None


def after_refusal(message: str, asked: int, thinking_switch: bool) -> tuple[int, bool] | None:
    """The probe's next read after a server refused one of ``asked`` entries (HTTP 400 or
    422 with ``message``): its window and whether it sends the thinking switch. A limit the
    refusal names: that window. Else the switch is taken for the culprit first (dropped, the
    same window; the backend tries it again once a window is found), then the window steps
    down (`STEP_DOWN`). None: nothing smaller is left (the server refuses logprobs)."""
    limit = limit_from_error(message, asked)
    if limit is not None:
        return limit, thinking_switch
    if thinking_switch:
        return asked, False
    smaller = next((step for step in STEP_DOWN if step < asked), None)
    return None if smaller is None else (smaller, False)


def whole_controls(entries: Sequence[ChatEntry]) -> tuple[str, ...]:
    """The letters and Noul words among ``entries`` that came back whole (one entry's text,
    leading whitespace aside), sorted: evidence that the served tokenizer writes them as one
    token."""
    wanted = set(UPPERCASE + LOWERCASE + NOUL_WORDS)
    return tuple(sorted({normalised(entry.text) for entry in entries} & wanted))
