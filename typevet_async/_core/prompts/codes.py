"""Two-token codes: the controls of a question with more options than single-token controls.

A tokenizer keeps about 62 single-token controls (A..Z, a..z, 0..9). Past them, every option of
the question gets a *code*: a digit, then a letter (``0A``, ``0B``, ... ``0z``, ``1A``, ...:
520 codes, 255 needed at most by System One). Digits and letters are split apart by the
pre-tokenizers of every BPE family here (Qwen's, Llama 3's) and by SentencePiece's digit split
(Gemma's), so a code is two tokens; a code is only used where the served tokenizer says so in
context (`codes_in_context`): its tokens at the answer position are one shared lead (or none),
then the digit's token, then the letter's.

A code's probability is read exactly: P(code) = P(first) x P(second | first). One read at the
answer position gives every first token's logprob; one more read per first token that starts
an option, on the prefix extended by that token, gives the seconds' logprobs after it (the
prefix is the same, so a server's prompt cache makes those reads cheap). A 255-option question
costs 1 + 5 reads. The codes are distinct two-token sequences, so their joint probabilities sum
to at most 1 and the rest is the off-menu mass, exactly as for single tokens; the answer is the
softmax of the joint logprobs. All options of a question get codes (never a mix with single
controls): a single ``A`` would be a prefix of no code, but ``0`` alone would be a prefix of
``0A``, and the menu must be prefix-free for the product to be the option's probability.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from typevet_async._core.prompts.controls import DIGITS, LOWERCASE, UPPERCASE, BoundOption
from typevet_async._core.prompts.questions import Option
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import TooManyOptionsError

__all__ = [
    "CODES",
    "CodeTokens",
    "bind_codes",
    "check_code_count",
    "code_firsts",
    "codes_in_context",
    "codes_needed",
    "joint_logprobs",
    "seconds_after",
    "usable_codes",
    "with_reads_after",
]

#: Every code, in the order options get them: a digit, then a letter.
CODES: tuple[str, ...] = tuple(
    digit + letter for digit in DIGITS for letter in UPPERCASE + LOWERCASE
)


@attrs.frozen
class CodeTokens:
    """A code's tokens at the answer position: its lead (none on most tokenizers), its first
    token, its second."""

    lead: tuple[int, ...]
    first: int
    second: int


def check_code_count(count: int) -> None:
    """Refuse a question with more options than there are codes: no tokenizer could give them
    all, so the tokenizer is not asked about any.

    :raises TooManyOptionsError: naming the count and the maximum (``len(CODES)``).
    """
    if count > len(CODES):
        raise TooManyOptionsError(
            f"{count} options, and a question takes at most {len(CODES)} (past the single-"
            f"token controls each option gets a two-token code, a digit then a letter, and "
            f"there are {len(CODES)}): refused before any request",
            count=count,
            limit=len(CODES),
        )


def codes_needed(count: int, known: Mapping[str, CodeTokens | None]) -> list[str]:
    """The codes to ask the tokenizer about before ``count`` options can be bound: the next
    ones in `CODES` order that are not yet known, as many as usable codes are still missing
    (none once ``known`` has enough, or every code has been asked)."""
    usable = sum(1 for tokens in known.values() if tokens is not None)
    missing = count - usable
    if missing <= 0:
        return []
    return [code for code in CODES if code not in known][:missing]


def codes_in_context(
    base: Sequence[int], extended: Mapping[str, Sequence[int]]
) -> dict[str, CodeTokens | None]:
    """What each code adds to the tokenized answer position (``base``), from the tokens of
    the same prefix with the code appended: a lead of at most one token, then two tokens. A
    code that changes the prefix's tokens, adds another number, or repeats another code's
    tokens is None (not usable: it narrows the option limit, nothing more)."""
    found: dict[str, CodeTokens | None] = {}
    taken: set[tuple[int, ...]] = set()
    width = len(base)
    for code, tokens in extended.items():
        added = tuple(tokens[width:])
        extends = tuple(tokens[:width]) == tuple(base)
        if not extends or len(added) not in (2, 3) or added in taken:
            found[code] = None
            continue
        taken.add(added)
        found[code] = CodeTokens(added[:-2], added[-2], added[-1])
    return found


def usable_codes(
    count: int, known: Mapping[str, CodeTokens | None]
) -> list[tuple[str, CodeTokens]]:
    """The first ``count`` usable codes in `CODES` order that share the first usable code's
    lead (a question's prefix ends in one lead); fewer when there are not as many."""
    chosen: list[tuple[str, CodeTokens]] = []
    lead: tuple[int, ...] | None = None
    for code in CODES:
        tokens = known.get(code)
        if tokens is None:
            continue
        if lead is None:
            lead = tokens.lead
        if tokens.lead == lead:
            chosen.append((code, tokens))
            if len(chosen) == count:
                break
    return chosen


def code_firsts(codes: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The distinct first tokens of a question's codes, in option order: what the first read
    asks for."""
    return tuple(dict.fromkeys(first for first, _ in codes))


def seconds_after(codes: Sequence[tuple[int, int]], first: int) -> tuple[int, ...]:
    """The second tokens of the codes that start with ``first``, in option order: what the
    read after ``first`` asks for."""
    return tuple(second for head, second in codes if head == first)


def joint_logprobs(
    codes: Sequence[tuple[int, int]],
    first: Mapping[int, float],
    after: Mapping[int, Mapping[int, float]],
) -> tuple[float, ...]:
    """Each option's log P(first) + log P(second | first), in option order, from the first
    read's logprobs and each follow-up read's (by first token). The reads were checked
    complete before: a missing value here is a bug, not an estimate."""
    return tuple(first[head] + after[head][second] for head, second in codes)


def bind_codes(
    options: Sequence[Option], usable: Sequence[tuple[str, CodeTokens]]
) -> tuple[BoundOption, ...]:
    """Give option ``i`` the ``i``-th usable code (`usable_codes`); ``usable`` holds at least
    as many codes as there are options."""
    return tuple(
        BoundOption(code, tokens.first, option, tokens.second)
        for (code, tokens), option in zip(usable, options, strict=False)
    )


def with_reads_after(first: CandidateRead, after: Sequence[CandidateRead]) -> CandidateRead:
    """A code question's first read carrying the reads after its first tokens, its counts
    (reads, prompt and cached tokens, attempts) the question's; the off-menu mass is known
    only if every read's is, and a read clamped anywhere is clamped."""
    reads = (first, *after)
    return attrs.evolve(
        first,
        after=tuple(after),
        reads=sum(read.reads for read in reads),
        prompt_tokens=sum(read.prompt_tokens for read in reads),
        cached_tokens=sum(read.cached_tokens for read in reads),
        attempts=sum(read.attempts for read in reads),
        off_menu_known=all(read.off_menu_known for read in reads),
        truncated=any(read.truncated for read in reads),
        clamped=sum(read.clamped for read in reads),
    )
