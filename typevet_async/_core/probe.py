"""What a session learns about its server once, and the model pin checked against it."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from typevet_async._core.framing import GEMMA_FRAMES, PromptFrame, TemplateFamily
from typevet_async._errors import ConfigurationError

__all__ = ["Probe", "check_requested_model", "check_served_model", "model_identity"]


@attrs.frozen
class Probe:
    """The served template's family, the controls' token ids in context, the vocabulary and
    vision."""

    family: TemplateFamily
    rendered_template: str
    control_ids: Mapping[str, int]
    vocab_size: int
    model_ids: tuple[str, ...] = ()
    #: Whether the server declares it takes images, and the text that marks where one goes.
    vision: bool = False
    media_marker: str | None = None
    #: Reads the server runs at once, if it says (llama.cpp ``/props`` ``total_slots``): the
    #: most a multi-endpoint session sends it at once.
    slots: int | None = None
    #: The frame learned from the served template where the SDK frames prompts: a native
    #: family other than Gemma's, or a Gemma family's own frame with the template's trim
    #: (None: a Gemma family's own frame as written, or none).
    frame: PromptFrame | None = None
    #: The lead of each control that needs one at the answer position (`controls_in_context`:
    #: SentencePiece's ``▁`` before a digit); a control not named here needs none.
    control_leads: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)
    #: Whether the template renders two user messages in a row (the ``split`` layout's); one
    #: that requires alternating roles (Mistral's) does not.
    consecutive_user_turns: bool = True

    @property
    def prompt_frame(self) -> PromptFrame | None:
        """The frame the SDK frames prompts in: the one learned from the served template (for
        a Gemma family, its own frame with the template's trim), else a Gemma family's own."""
        return self.frame if self.frame is not None else GEMMA_FRAMES.get(self.family)


def check_served_model(pinned: str | None, served: tuple[str, ...]) -> None:
    """:raises ConfigurationError: the session is pinned to a model the server does not serve."""
    if pinned is not None and pinned not in served:
        raise ConfigurationError(
            f"the session is pinned to model {pinned!r}, the server serves {list(served)!r}"
        )


def check_requested_model(pinned: str | None, requested: str | None) -> None:
    """:raises ConfigurationError: a call names a model other than the session's pin."""
    if requested is not None and requested != pinned:
        raise ConfigurationError(
            f"this session is pinned to model {pinned!r}; a call for {requested!r} was "
            "refused before any request"
        )


def model_identity(pinned: str | None, served: tuple[str, ...]) -> str:
    """The model id a calibration map is pinned to: the session's pin, else the ids the server
    lists, each GGUF path cut to its file name (llama.cpp lists the path it loaded, which
    differs from machine to machine for the same file)."""
    if pinned is not None:
        return pinned
    names = {name.rsplit("/", 1)[-1] if name.endswith(".gguf") else name for name in served}
    return ",".join(sorted(names))
