"""From a question to a scoring request, and from a candidate read back to an answer.

These two pure steps sit either side of the one `await` in the session.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from typevet_async.core.answers import Answer, Diagnostics, build_answer
from typevet_async.core.controls import bind_controls
from typevet_async.core.fields import render_user_content
from typevet_async.core.framing import TemplateFamily, frame_prefix
from typevet_async.core.questions import Question
from typevet_async.core.readings import CandidateRead, off_menu_mass, softmax
from typevet_async.errors import InvalidLogprobsError, TooManyOptionsError, TypevetError

__all__ = ["Probe", "ScoringRequest", "interpret_read", "plan_question"]


@attrs.frozen
class Probe:
    """What a session learns about its server once: template family, controls, vocabulary."""

    family: TemplateFamily
    rendered_template: str
    control_ids: Mapping[str, int]
    vocab_size: int
    model_ids: tuple[str, ...] = ()
    #: Most candidates one read can take (vLLM: 128); None for no limit.
    max_candidates: int | None = None


@attrs.frozen
class ScoringRequest:
    """One question, rendered: the text sent and the candidate token ids, in option order.

    ``prompt`` is the raw prefix the SDK framed (llama.cpp), or the plain user content when the
    server applies its own chat template (vLLM).
    """

    question_id: str
    question: Question
    prompt: str
    controls: tuple[str, ...]
    token_ids: tuple[int, ...]


def plan_question(
    question_id: str,
    question: Question,
    state_text: str,
    family: TemplateFamily | None,
    control_ids: Mapping[str, int],
    max_candidates: int | None = None,
) -> ScoringRequest:
    """Bind controls, render the field block and, for a ``family``, frame the raw prefix.

    :raises TooManyOptionsError: more options than controls, or than one read can take.
    """
    try:
        options = question.options()
        if max_candidates is not None and len(options) > max_candidates:
            raise TooManyOptionsError(
                f"{len(options)} options, but one read takes at most {max_candidates} candidates",
                count=len(options),
                limit=max_candidates,
            )
        bound = bind_controls(options, control_ids)
    except TypevetError as error:
        error.question_id = question_id
        raise
    content = render_user_content(state_text, question, bound)
    prompt = content if family is None else frame_prefix(family, content)
    return ScoringRequest(
        question_id,
        question,
        prompt,
        tuple(b.control for b in bound),
        tuple(b.token_id for b in bound),
    )


def interpret_read(request: ScoringRequest, read: CandidateRead) -> tuple[Answer, Diagnostics]:
    """Softmax the candidates' logprobs into the typed answer, and record what it came from."""
    if read.token_ids != request.token_ids:
        raise InvalidLogprobsError(
            f"read returned token ids {read.token_ids}, expected {request.token_ids}"
        )
    answer = build_answer(request.question, softmax(read.logprobs))
    diagnostics = Diagnostics(
        prompt=request.prompt,
        controls=request.controls,
        token_ids=read.token_ids,
        logprobs=read.logprobs,
        off_menu_mass=off_menu_mass(read.logprobs) if read.off_menu_known else None,
        top_k=read.top_k,
        reads=read.reads,
    )
    return answer, diagnostics
