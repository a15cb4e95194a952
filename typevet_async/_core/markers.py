"""Neutralising caller text so it can never forge a turn marker, media marker or control line.

Chosen behaviour: neutralise, not reject. Real states (tickets, receipts, HTML) contain angle
brackets; refusing them would refuse real data.

What is special is the served tokenizer's to say, not a list written for one model family.
A *marker run* is a bracket-shaped run of text without whitespace, ``<...>`` or ``[...]``, at
most 64 characters inside (every special token of Gemma 3 and 4, ChatML's ``<|im_start|>``,
Llama 3's ``<|eot_id|>``, Mistral's ``[INST]``, llama.cpp's ``<__media_...__>`` marker have
this shape). Where the backend can ask its tokenizer (llama.cpp: ``/tokenize`` with and without
``parse_special``), a run is neutralised exactly when the tokenizer reads it as a special
token, so ordinary text such as ``<div>`` (one ordinary Gemma token) reaches the model
unchanged; elsewhere every marker run is neutralised (`ALL_RUNS`). A neutralised run keeps its
text with look-alike brackets, ``‹...›`` or fullwidth square brackets (U+FF3B, U+FF3D): a
reader still sees it, the tokenizer sees no special token.

Single-line fields (instructions, labels, descriptions) also have every line break folded to a
space, so they cannot start a line of their own, such as a forged control line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Final

__all__ = [
    "ALL_RUNS",
    "IsSpecial",
    "marker_runs",
    "neutralise",
    "neutralise_line",
]

#: Whether a marker run is a special token of the served tokenizer.
IsSpecial = Callable[[str], bool]

#: Angle and square runs are found separately (they may nest: ``[<end_of_turn>]``).
_RUNS: Final = (re.compile(r"<[^\s<>]{1,64}>"), re.compile(r"\[[^\s\[\]]{1,64}\]"))
_LINE_BREAKS: Final = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")
_ANGLE_WORD: Final = re.compile(r'[^\W\d]|"')
_SQUARE_WORD: Final = re.compile(r"\[/?[A-Z][A-Z_]*\]")
_LOOK_ALIKE: Final = {"<": "‹", ">": "›", "[": "\uff3b", "]": "\uff3d"}


def ALL_RUNS(run: str) -> bool:
    """The rule where the tokenizer cannot be asked: every marker run that could be a special
    token is treated as one: an angle run holding a letter, ``_`` or ``"`` (``<->`` and
    ``<3>`` are not), a square run of capitals (``[INST]``, ``[/INST]``; ``[1]`` is not)."""
    if run[0] == "<":
        return _ANGLE_WORD.search(run) is not None
    return _SQUARE_WORD.fullmatch(run) is not None


def marker_runs(texts: Iterable[str]) -> set[str]:
    """Every distinct marker run in ``texts`` (what the tokenizer is asked about)."""
    return {run for text in texts if text for pattern in _RUNS for run in pattern.findall(text)}


def neutralise(text: str, is_special: IsSpecial = ALL_RUNS) -> str:
    """Replace the brackets of every special marker run by look-alikes; keep everything else."""
    if "<" not in text and "[" not in text:  # the common case, without the regexes
        return text
    spans = [
        match.span()
        for pattern in _RUNS
        for match in pattern.finditer(text)
        if is_special(match[0])
    ]
    if not spans:
        return text
    chars = list(text)
    for start, end in spans:
        for index in range(start, end):
            chars[index] = _LOOK_ALIKE.get(chars[index], chars[index])
    return "".join(chars)


def neutralise_line(text: str, is_special: IsSpecial = ALL_RUNS) -> str:
    """`neutralise`, and fold line breaks to single spaces."""
    return _LINE_BREAKS.sub(" ", neutralise(text, is_special)).strip()
