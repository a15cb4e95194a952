"""Neutralising caller text so it can never forge a turn marker, media marker or control line.

Chosen behaviour: neutralise, not reject. Real states (tickets, receipts, HTML) contain angle
brackets; refusing them would refuse real data.

What is special is the served tokenizer's to say, not a list written for one model family.
A *marker run* is a bracket-shaped run of text without whitespace, ``<...>`` or ``[...]``, at
most 64 characters inside (every special token of Gemma 3 and 4, ChatML's ``<|im_start|>``,
Llama 3's ``<|eot_id|>``, Mistral's ``[INST]``, llama.cpp's ``<__media_...__>`` marker have
this shape). Where the backend can ask its tokenizer (llama.cpp: ``/tokenize`` with and without
``parse_special``, `special_runs_from_pieces`), a run is neutralised exactly when the tokenizer
reads it as a special token, so ordinary text such as ``<div>`` (one ordinary Gemma token)
reaches the model unchanged; elsewhere every marker run is neutralised (`ALL_RUNS`). A
neutralised run keeps its text with look-alike brackets, ``‹...›`` or fullwidth square brackets
(U+FF3B, U+FF3D): a reader still sees it, the tokenizer sees no special token.

A judgment asks about at most `MAX_CHECKED_RUNS` new runs (`runs_to_check`), so its cost in
tokenizer requests is bounded whatever its text; a run past the cap is neutralised unchecked.

Single-line fields (instructions, labels, descriptions) also have every line break folded to a
space, so they cannot start a line of their own, such as a forged control line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final

__all__ = [
    "ALL_RUNS",
    "CHECKED_RUNS_BYTES",
    "MAX_CHECKED_RUNS",
    "RUN_SEPARATOR",
    "IsSpecial",
    "Piece",
    "marker_runs",
    "neutralise",
    "neutralise_line",
    "runs_to_check",
    "special_runs_from_pieces",
]

#: New marker runs one judgment puts to the tokenizer at most; past them (or past
#: `CHECKED_RUNS_BYTES`), runs are neutralised unchecked and asked about by a later judgment.
#: Bounds a judgment's tokenizer cost to one pair of requests whatever its text (a vocabulary
#: such as Gemma's has thousands of special tokens to forge, more than a session keeps verdicts
#: on).
MAX_CHECKED_RUNS = 256
#: The bytes of the runs one judgment puts to the tokenizer at most (joined): the pair's size.
CHECKED_RUNS_BYTES = 16 * 1024
#: What the runs put to the tokenizer are joined by: no run holds whitespace, and no token of
#: the vocabularies seen (Gemma, Qwen, Llama 3, Mistral) joins a line break to a bracket, so each
#: run is tokenized on its own.
RUN_SEPARATOR = "\n"

#: Whether a marker run is a special token of the served tokenizer.
IsSpecial = Callable[[str], bool]

#: Angle and square runs are found separately (they may nest: ``[<end_of_turn>]``).
_RUNS: Final = (re.compile(r"<[^\s<>]{1,64}>"), re.compile(r"\[[^\s\[\]]{1,64}\]"))
_LINE_BREAKS: Final = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")
_ANGLE_WORD: Final = re.compile(r'[^\W\d]|"')
_SQUARE_WORD: Final = re.compile(r"\[/?[A-Z][A-Z_]*\]")
_LOOK_ALIKE: Final = {"<": "‹", ">": "›", "[": "\uff3b", "]": "\uff3d"}
_WORD: Final = re.compile(r"[^\W\d]")
_HTML_TAG: Final = re.compile(r"</?[A-Za-z][A-Za-z0-9]*/?>")

#: A token of a `/tokenize` reply with pieces: its id and the bytes of its text.
Piece = tuple[int, bytes]
#: A token's place in the tokenized text: start and end byte, id.
_Span = tuple[int, int, int]


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


def runs_to_check(first: Iterable[str], then: Iterable[str]) -> list[str]:
    """The runs a judgment puts to the tokenizer, in order: ``first`` (the questions' runs,
    which every judgment of the question shares), then ``then`` (the state's), each sorted,
    while there are at most `MAX_CHECKED_RUNS` and their joined bytes fit `CHECKED_RUNS_BYTES`."""
    chosen: list[str] = []
    seen: set[str] = set()
    size = -len(RUN_SEPARATOR)
    for runs in (first, then):
        for run in sorted(set(runs) - seen):
            size += len(run.encode()) + len(RUN_SEPARATOR)
            if len(chosen) == MAX_CHECKED_RUNS or size > CHECKED_RUNS_BYTES:
                return chosen
            chosen.append(run)
            seen.add(run)
    return chosen


def special_runs_from_pieces(
    runs: Sequence[str], parsed: Sequence[Piece], plain: Sequence[Piece]
) -> frozenset[str] | None:
    """The runs the tokenizer reads as special tokens, from one tokenization of all of them
    (joined by `RUN_SEPARATOR`) with special-token parsing (``parsed``) and one without
    (``plain``); None if the pieces do not spell the text (the caller then cannot tell).

    A run is special where its tokens differ between the two (a control token such as
    ``<start_of_turn>``), or where it is one whole token in both and its shape is not markup:
    llama.cpp parses a vocabulary's user-defined tokens even without ``parse_special``, so
    Gemma's ``<start_of_image>`` and ``<end_of_image>`` (the image boundaries llama.cpp's
    multimodal code writes) reach the model as those tokens from plain text. The vocabulary
    does not say which user-defined tokens are structural: Gemma's others are HTML tags
    (``<b>``, ``</table>``, ``<h1>``: ordinary text, kept), and besides those, a whole-token run
    holding a letter or ``_`` is a model's marker, not prose (Gemma's ordinary whole-token runs
    are punctuation: ``[...]``, ``<=>``)."""
    text = RUN_SEPARATOR.join(runs).encode()
    parsed_spans, plain_spans = _spans(text, parsed), _spans(text, plain)
    if parsed_spans is None or plain_spans is None:
        return None
    bounds = []
    start = 0
    for run in runs:
        end = start + len(run.encode())
        bounds.append((start, end))
        start = end + len(RUN_SEPARATOR)
    plain_tokens, parsed_tokens = _per_run(plain_spans, bounds), _per_run(parsed_spans, bounds)
    special = set()
    for run, (start, end), plain_of, parsed_of in zip(
        runs, bounds, plain_tokens, parsed_tokens, strict=True
    ):
        whole = len(plain_of) == 1 and plain_of[0][:2] == (start, end)
        if plain_of != parsed_of or (
            whole and _WORD.search(run) is not None and _HTML_TAG.fullmatch(run) is None
        ):
            special.add(run)
    return frozenset(special)


def _spans(text: bytes, pieces: Sequence[Piece]) -> list[_Span] | None:
    """Where each token lies in ``text`` (None: the pieces do not spell it). A tokenizer with a
    dummy prefix (Mistral's SentencePiece) writes a space before the first token of each
    stretch between special tokens; the runs' text holds no space, so such a space is skipped."""
    spans = []
    at = 0
    for token, piece in pieces:
        if not text.startswith(piece, at):
            if piece[:1] != b" " or not text.startswith(piece[1:], at):
                return None
            piece = piece[1:]
        spans.append((at, at + len(piece), token))
        at += len(piece)
    return spans if at == len(text) else None


def _per_run(spans: Sequence[_Span], bounds: Sequence[tuple[int, int]]) -> list[list[_Span]]:
    """The tokens that cover any byte of each run (``bounds``: start and end, in order), in one
    pass: both are in text order."""
    covering = []
    first = 0
    for start, end in bounds:
        while first < len(spans) and spans[first][1] <= start:
            first += 1
        last = first
        while last < len(spans) and spans[last][0] < end:
            last += 1
        covering.append(list(spans[first:last]))
    return covering
