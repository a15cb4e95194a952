"""Template families and the raw prefix framed in the served family's own turn markers.

The probe renders one sentinel message through the server's template; `classify_template`
names the family from the markers it finds. Judgments accept only the two native Gemma
families: their prefix ends exactly where the model's first answer token goes.
"""

from __future__ import annotations

import enum

__all__ = [
    "PROBE_MESSAGE",
    "TemplateFamily",
    "answer_prefill",
    "classify_template",
    "frame_prefix",
]

#: After Gemma 4's model turn header: an empty thought channel, so no thinking can open.
GEMMA4_NO_THINKING = "<|channel>thought\n<channel|>"

#: The text the template probe sends as its only user message.
PROBE_MESSAGE = "typevet-probe"


class TemplateFamily(enum.Enum):
    GEMMA4 = "gemma4"
    GEMMA3 = "gemma3"
    CHATML = "chatml"
    UNSUPPORTED = "unsupported"
    #: A System One server: it frames and reads every question itself, and shows no template.
    REMOTE = "remote"

    @property
    def is_native(self) -> bool:
        return self in (TemplateFamily.GEMMA4, TemplateFamily.GEMMA3)


def classify_template(rendered: str) -> TemplateFamily:
    """Name the family of a template from its rendering of one user message."""
    if "<|turn>user\n" in rendered and "<turn|>" in rendered:
        return TemplateFamily.GEMMA4
    if "<start_of_turn>user\n" in rendered and "<end_of_turn>" in rendered:
        return TemplateFamily.GEMMA3
    if "<|im_start|>" in rendered:
        return TemplateFamily.CHATML
    return TemplateFamily.UNSUPPORTED


def answer_prefill(family: TemplateFamily) -> str:
    """What must follow the model turn header at the answer position."""
    return GEMMA4_NO_THINKING if family is TemplateFamily.GEMMA4 else ""


def frame_prefix(family: TemplateFamily, user_content: str) -> str:
    """One user turn and the model turn header; the server adds BOS itself.

    Gemma 4's prefix also carries an empty thought channel, so no thinking section can open
    at the answer position.
    """
    if family is TemplateFamily.GEMMA4:
        return f"<|turn>user\n{user_content}<turn|>\n<|turn>model\n{GEMMA4_NO_THINKING}"
    if family is TemplateFamily.GEMMA3:
        return f"<start_of_turn>user\n{user_content}<end_of_turn>\n<start_of_turn>model\n"
    raise ValueError(f"cannot frame a prefix for template family {family.value!r}")
