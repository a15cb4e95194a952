"""Template families, and the raw prefix framed in the served template's own turn markers.

The probe renders a sentinel user message through the server's template (thinking off, with
the generation prompt); `classify_template` names the family from the markers it finds.

A template is *native* to the model when its turn markers are the model's own special tokens:
the served tokenizer reads each as one token. A marker it reads as several ordinary tokens
means a template written for another family, which the model was never trained on: *degraded*,
and refused. The two Gemma families are recognised by their markers alone, as
before (their frames are written here); every other family must pass the tokenizer's check,
and its frame is learned from the served template itself (`learn_frame`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence

import attrs

from typevet_async._core.prompts.markers import marker_runs

__all__ = [
    "ANSWER_PROBE",
    "EMPTY_THINK_BLOCK",
    "GEMMA_FRAMES",
    "PROBE_MESSAGE",
    "SECOND_PROBE_MESSAGE",
    "THINKING_MARKERS",
    "TRIM_PROBE_MESSAGE",
    "PromptFrame",
    "TemplateFamily",
    "classify_template",
    "frame_prefix",
    "learn_frame",
    "learn_trim",
    "learn_turns",
    "structural_markers",
    "turn_markers",
    "with_turns",
]

#: After Gemma 4's model turn header: an empty thought channel, so no thinking can open.
GEMMA4_NO_THINKING = "<|channel>thought\n<channel|>"

#: What a thinking template (Qwen3 and its kin) writes after the assistant header when thinking
#: is off; the SDK writes it itself where the template does not.
EMPTY_THINK_BLOCK = "<think>\n\n</think>\n\n"

#: The text the template probe sends as its only user message.
PROBE_MESSAGE = "typevet-probe"
#: A second sentinel: a frame learned from one rendering is checked against another.
SECOND_PROBE_MESSAGE = "typevet-probe-second"
#: A third, in whitespace: whether the template trims a message's content (Gemma's and Llama
#: 3's do, ``| trim``), so the SDK's frame renders a state as the template would.
TRIM_PROBE_MESSAGE = "\n  typevet-probe-trim  \n"

#: The assistant's answer in the probe's conversation of two turns (`learn_turns`).
ANSWER_PROBE = "typevet-answer"

_ENDS_IN_EMPTY_THINK_BLOCK = re.compile(r"<think>\s*</think>\s*$")


class TemplateFamily(enum.Enum):
    GEMMA4 = "gemma4"
    GEMMA3 = "gemma3"
    #: ChatML turns (``<|im_start|>``): Qwen, and many others.
    CHATML = "chatml"
    #: Llama 3 headers (``<|start_header_id|>``).
    LLAMA3 = "llama3"
    #: Another template whose turn markers are the model's own special tokens.
    OTHER = "other"
    #: Turn markers the served tokenizer reads as several ordinary tokens: another family's.
    DEGRADED = "degraded"
    #: No turn markers the SDK can find.
    UNSUPPORTED = "unsupported"
    #: A System One server: it frames and reads every question itself, and shows no template.
    REMOTE = "remote"

    @property
    def is_native(self) -> bool:
        """Whether the SDK may frame prompts in it (the refused ones are degraded, unsupported
        and, since a remote server frames its own, remote)."""
        return self in _NATIVE

    @property
    def is_gemma(self) -> bool:
        return self in (TemplateFamily.GEMMA4, TemplateFamily.GEMMA3)


_NATIVE = frozenset(
    {
        TemplateFamily.GEMMA4,
        TemplateFamily.GEMMA3,
        TemplateFamily.CHATML,
        TemplateFamily.LLAMA3,
        TemplateFamily.OTHER,
    }
)


@attrs.frozen
class PromptFrame:
    """What goes around the user content in a prefix the SDK frames: ``head`` up to it,
    ``tail`` after it, to the answer position."""

    head: str
    tail: str
    #: What follows the template's generation prompt so that no thinking opens (Gemma 4's
    #: empty thought channel, or an empty think block the template did not write); a prompt
    #: the server renders (Jev layouts) must end with it too.
    prefill: str = ""
    #: Whether the template trims the content of a message (`learn_trim`).
    trim: bool = False
    #: An earlier turn's reply as the template renders it in the conversation's history: what
    #: goes between a user message and the assistant's answer, and after the answer up to the
    #: next user message (`learn_turns`); None: not learnt, so no examples can be framed.
    turns: tuple[str, str] | None = None

    def prefix(self, user_content: str, examples: Sequence[tuple[str, str]] = ()) -> str:
        """The prefix of one user turn, after ``examples`` (each a user message and the
        assistant's answer to it) as earlier turns.

        :raises ValueError: examples, and the frame knows no earlier turns (`turns` None).
        """
        if examples and self.turns is None:
            raise ValueError("this frame has not learnt how the template renders earlier turns")
        parts = [self.head]
        if examples and self.turns is not None:
            before_answer, after_answer = self.turns
            for content, answer in examples:
                parts += [self._content(content), before_answer, answer, after_answer]
        parts += [self._content(user_content), self.tail]
        return "".join(parts)

    def _content(self, user_content: str) -> str:
        return user_content.strip() if self.trim else user_content


#: The Gemma families' frames, written here; the server adds BOS itself.
GEMMA_FRAMES = {
    TemplateFamily.GEMMA4: PromptFrame(
        "<|turn>user\n", f"<turn|>\n<|turn>model\n{GEMMA4_NO_THINKING}", GEMMA4_NO_THINKING
    ),
    TemplateFamily.GEMMA3: PromptFrame(
        "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"
    ),
}


def turn_markers(rendered: str) -> list[str]:
    """The marker runs of a sentinel rendering (the template's own: the sentinel has none)."""
    return sorted(marker_runs([rendered]))


#: A thinking block's markers: part of the answer, not of a turn, and on some tokenizers
#: ordinary tokens (Qwen3 flags ``<think>`` user-defined, not special).
THINKING_MARKERS = frozenset({"<think>", "</think>"})


def structural_markers(rendered: str) -> list[str]:
    """The rendering's marker runs that open and close turns: every one but a thinking
    block's (`THINKING_MARKERS`)."""
    return [marker for marker in turn_markers(rendered) if marker not in THINKING_MARKERS]


def classify_template(
    rendered: str,
    is_one_token: Callable[[str], bool] | None = None,
    is_special: Callable[[str], bool] | None = None,
) -> TemplateFamily:
    """Name the family of a template from its rendering of one user message.

    :param is_one_token: the served tokenizer's verdict on each of the rendering's
        `turn_markers` (one token, or several); without it (a server whose template renders
        every prompt itself) the family is named from the markers alone.
    :param is_special: whether the tokenizer marks a marker as a special token. Every marker
        that opens or closes a turn (`structural_markers`) must be: an ordinary token such as
        ``<s>`` on Gemma (llama.cpp's built-in ``monarch`` template) is text a state can
        forge, and caller text is neutralised only where a run is special. A thinking block's
        markers (Qwen3's ``<think>``, an ordinary token by its tokenizer's flags) need only be
        one token.
    """
    if "<|turn>user\n" in rendered and "<turn|>" in rendered:
        return TemplateFamily.GEMMA4
    if "<start_of_turn>user\n" in rendered and "<end_of_turn>" in rendered:
        return TemplateFamily.GEMMA3
    markers = turn_markers(rendered)
    if not markers:
        return TemplateFamily.UNSUPPORTED
    if is_one_token is not None and not all(map(is_one_token, markers)):
        return TemplateFamily.DEGRADED
    if is_special is not None and not all(map(is_special, structural_markers(rendered))):
        return TemplateFamily.DEGRADED
    if "<|im_start|>" in markers:
        return TemplateFamily.CHATML
    if "<|start_header_id|>" in markers:
        return TemplateFamily.LLAMA3
    return TemplateFamily.OTHER


def learn_frame(
    first: str, second: str, *, template: str = "", bos: str | None = None
) -> PromptFrame | None:
    """The frame around the user content, from the served template's renderings of
    `PROBE_MESSAGE` (``first``) and `SECOND_PROBE_MESSAGE` (``second``); None when the two do
    not agree (a template that moves with the content cannot be framed once).

    A leading ``bos`` text is dropped: the server adds BOS to a prompt itself. Where the
    template's source mentions ``<think>`` but its rendering with thinking off does not end in
    an empty think block, one is appended (`EMPTY_THINK_BLOCK`), so the answer position is
    after it, never inside a thought.
    """
    if first.count(PROBE_MESSAGE) != 1 or second.count(SECOND_PROBE_MESSAGE) != 1:
        return None
    head, tail = first.split(PROBE_MESSAGE)
    if second != f"{head}{SECOND_PROBE_MESSAGE}{tail}" or not tail:
        return None
    if bos and head.startswith(bos):
        head = head[len(bos) :]
    prefill = ""
    if "<think>" in template and not _ENDS_IN_EMPTY_THINK_BLOCK.search(tail):
        prefill = EMPTY_THINK_BLOCK
    return PromptFrame(head, tail + prefill, prefill)


def learn_trim(first: str, trimmed: str) -> bool | None:
    """Whether the template trims a message's content, from its renderings of `PROBE_MESSAGE`
    (``first``) and `TRIM_PROBE_MESSAGE` (``trimmed``): False when it keeps the whitespace,
    True when it strips it, None when it does something else (no frame can render that)."""
    if first.count(PROBE_MESSAGE) != 1:
        return None
    head, tail = first.split(PROBE_MESSAGE)
    if trimmed == f"{head}{TRIM_PROBE_MESSAGE}{tail}":
        return False
    if trimmed == f"{head}{TRIM_PROBE_MESSAGE.strip()}{tail}":
        return True
    return None


def learn_turns(first: str, history: str) -> tuple[str, str] | None:
    """How the served template renders an earlier turn's answer, from its renderings of
    `PROBE_MESSAGE` alone (``first``) and of a conversation of two turns (``history``: the
    user's `PROBE_MESSAGE`, the assistant's `ANSWER_PROBE`, the user's `SECOND_PROBE_MESSAGE`,
    with the generation prompt): the text between the first message and the answer, and
    between the answer and the second message. None when the conversation does not render as
    the first message's frame around those two (a template that rewrites its history)."""
    if first.count(PROBE_MESSAGE) != 1 or history.count(ANSWER_PROBE) != 1:
        return None
    head, tail = first.split(PROBE_MESSAGE)
    opening, closing = f"{head}{PROBE_MESSAGE}", f"{SECOND_PROBE_MESSAGE}{tail}"
    if not history.startswith(opening) or not history.endswith(closing):
        return None
    middle = history[len(opening) : len(history) - len(closing)]
    before_answer, after_answer = middle.split(ANSWER_PROBE)
    if not before_answer or not after_answer:
        return None
    return before_answer, after_answer


def with_turns(
    frame: PromptFrame | None, family: TemplateFamily, turns: tuple[str, str] | None
) -> PromptFrame | None:
    """``frame`` (a Gemma family's own, where none was learnt) with the earlier ``turns``
    `learn_turns` found; as it was without them."""
    base = frame if frame is not None else GEMMA_FRAMES.get(family)
    if turns is None or base is None:
        return frame
    return attrs.evolve(base, turns=turns)


def frame_prefix(family: TemplateFamily, user_content: str) -> str:
    """A Gemma family's prefix: one user turn and the model turn header (Gemma 4's with an
    empty thought channel, so no thinking section can open at the answer position)."""
    frame = GEMMA_FRAMES.get(family)
    if frame is None:
        raise ValueError(f"cannot frame a prefix for template family {family.value!r}")
    return frame.prefix(user_content)
