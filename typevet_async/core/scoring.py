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
from typevet_async.errors import InvalidLogprobsError, TypevetError

__all__ = ["Probe", "ScoringRequest", "interpret_read", "plan_question"]


@attrs.frozen
class Probe:
    """What a session learns about its server once: template family, controls, vocabulary."""

    family: TemplateFamily
    rendered_template: str
    control_ids: Mapping[str, int]
    vocab_size: int
    model_ids: tuple[str, ...] = ()


@attrs.frozen
class ScoringRequest:
    """One question, rendered: the prompt to score and the candidate token ids, in option order."""

    question_id: str
    question: Question
    prompt: str
    controls: tuple[str, ...]
    token_ids: tuple[int, ...]


def plan_question(
    question_id: str,
    question: Question,
    state_text: str,
    family: TemplateFamily,
    control_ids: Mapping[str, int],
) -> ScoringRequest:
    """Bind controls, render the field block and frame the prefix for one question."""
    try:
        bound = bind_controls(question.options(), control_ids)
    except TypevetError as error:
        error.question_id = question_id
        raise
    prompt = frame_prefix(family, render_user_content(state_text, question, bound))
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
        off_menu_mass=off_menu_mass(read.logprobs),
        top_k=read.top_k,
        reads=read.reads,
    )
    return answer, diagnostics
