"""Neutralising caller text so it can never forge a turn marker, media marker or control line.

Chosen behaviour: neutralise, not reject. Real states (tickets, receipts, HTML) contain angle
brackets; refusing them would refuse real data. Any ``<name>``, ``<|name>``, ``<name|>`` or
``</name>`` shaped run (which covers every Gemma 3 and Gemma 4 special token, ChatML's
``<|im_start|>`` and llama.cpp's ``<__media_...__>`` marker) has its brackets replaced by the
look-alike guillemets ``‹ ›``: a reader still sees the text, the tokenizer sees no special token.
Single-line fields (instructions, labels, descriptions) also have every line break folded to a
space, so they cannot start a line of their own, such as a forged control line.
"""

from __future__ import annotations

import re

__all__ = ["neutralise", "neutralise_line"]

_MARKER = re.compile(r"<(/?\|?/?[A-Za-z_][A-Za-z0-9_\-]*\|?)>")
_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")


def neutralise(text: str) -> str:
    """Replace marker-shaped runs ``<...>`` by ``‹...›``; everything else is kept."""
    return _MARKER.sub(r"‹\1›", text)


def neutralise_line(text: str) -> str:
    """`neutralise`, and fold line breaks to single spaces."""
    return _LINE_BREAKS.sub(" ", neutralise(text)).strip()
