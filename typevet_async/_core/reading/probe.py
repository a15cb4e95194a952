"""What a session learns about its server once, the model pin checked against it, and the
served context a prompt is checked against before it is sent."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from typevet_async._core.prompts.framing import GEMMA_FRAMES, PromptFrame, TemplateFamily
from typevet_async._core.reading.chat_reads import ChatServer
from typevet_async._errors import ConfigurationError, PromptTooLongError

__all__ = [
    "MAX_TOKEN_BYTES",
    "Probe",
    "check_context",
    "check_requested_model",
    "check_served_model",
    "fewest_tokens",
    "model_identity",
]

#: The most bytes of text one token of a served vocabulary stands for, with a margin: the
#: longest measured are 128 bytes (Qwen's runs of spaces, as in tiktoken-style vocabularies),
#: 78 (Mistral's Tekken) and 48 (Gemma 3's), special tokens' texts included. A count of
#: tokens below bytes / this never refuses a prompt that would fit.
MAX_TOKEN_BYTES: Final = 256

#: UTF-8 takes at most this many bytes per character.
_MAX_CHAR_BYTES: Final = 4


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
    #: The tokens one request may hold, prompt and answer together, if the server says
    #: (llama.cpp ``/props``: a slot's ``n_ctx``, the total over ``n_parallel``; vLLM
    #: ``/v1/models``: ``max_model_len``): the limit `check_context` refuses against.
    context_tokens: int | None = None
    #: What the probe learnt of an OpenAI-compatible chat server (its ``top_logprobs`` cap,
    #: what it refused); None for the other backends.
    chat_server: ChatServer | None = None

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


def fewest_tokens(size: int) -> int:
    """The fewest tokens ``size`` bytes of text can take in a served tokenizer: no token stands
    for more than `MAX_TOKEN_BYTES` bytes (a byte-fallback token stands for one)."""
    return -(-size // MAX_TOKEN_BYTES)


def check_context(question_id: str, texts: Iterable[str], context_tokens: int | None) -> None:
    """Refuse a prompt holding ``texts`` that certainly cannot fit a request of
    ``context_tokens`` tokens (None: not known, nothing refused): at least `fewest_tokens` for
    the prompt, and one more for the token read after it. Each text counts without the
    whitespace at its ends, which a chat template may trim. Cheap on ordinary text: its
    characters are counted (``len``), and its bytes only when four per character could reach
    the limit.

    :raises PromptTooLongError: naming the question, the prompt's bytes, the fewest tokens
        they take and the context.
    """
    if context_tokens is None:
        return
    most = MAX_TOKEN_BYTES * (context_tokens - 1)  # bytes past this take too many tokens
    kept = [text.strip() for text in texts]
    if _MAX_CHAR_BYTES * sum(map(len, kept)) <= most:  # the common case, nothing encoded
        return
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in kept)
    if size <= most:
        return
    tokens = fewest_tokens(size)
    error = PromptTooLongError(
        f"its prompt holds {size:,} bytes of text, at least {tokens:,} tokens (no token stands "
        f"for more than {MAX_TOKEN_BYTES} bytes), and the served context holds "
        f"{context_tokens:,} tokens per request (the prompt and the answer's token): refused "
        "before any request; shorten the state or the question's examples",
        prompt_bytes=size,
        min_tokens=tokens,
        context_tokens=context_tokens,
    )
    error.question_id = question_id
    raise error
