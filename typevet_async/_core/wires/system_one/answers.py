"""A System One server's answers checked and rebuilt as typed answers: a distribution over
exactly the question's options, agreeing with the ``choice`` or ``score`` it names.

**Rounded probabilities.** Servers may round what they send (the System One docs' examples
show 2 or 3 decimals: three options at 0.33 each sum to 0.99). The check allows exactly what
rounding can explain (`rounding_slack`): when every probability is a multiple of 10^-d for
some d in 2..6 (the smallest such d), each may be off by half of 10^-d, so their sum by n
times that, a Choice's top label by that, and a Score's expected level by that times
``1 + n(n-1)/2``; on top of `SYSTEM_ONE_SLACK` (float32 noise). Unrounded probabilities get
`SYSTEM_ONE_SLACK` alone. The probabilities accepted are then divided by their sum when it is
more than 1e-9 from 1, so an answer's distribution always sums to 1 (and a float softmax's,
our own gateway's, is kept bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from typevet_async._core.prompts.questions import Choice, Noul, Question
from typevet_async._core.reading.answers import Answer, ChoiceAnswer, ScoreAnswer, build_answer
from typevet_async._errors import ProtocolError

__all__ = ["SYSTEM_ONE_SLACK", "SystemOneAnswer", "answers_from_system_one", "rounding_slack"]

#: How far a System One answer's probabilities may sum from 1, and its expected score from the
#: one its probabilities give: JSON floats of a float32 softmax (our own gateway's are within
#: 1e-6). Anything further is not the distribution the answer claims to be.
SYSTEM_ONE_SLACK: Final = 1e-3


#: A sum this close to 1 is left as it is; a sum further off is divided out.
_SUM_EXACT: Final = 1e-9


def rounding_slack(probabilities: Sequence[float]) -> float:
    """Half of 10^-d for the smallest d in 2..6 at which every probability is a multiple of
    10^-d (within 1e-7, so float32 values of rounded decimals count); 0 if there is none."""
    for decimals in range(2, 7):
        if all(abs(p - round(p, decimals)) < 1e-7 for p in probabilities):
            return 0.5 * 10.0**-decimals
    return 0.0


@attrs.frozen
class SystemOneAnswer:
    """One answer as a System One server sent it (types checked by the backend's decoder).

    ``probabilities`` is keyed as on the wire: ``"false"``/``"true"`` for a Noul (built from
    ``noul``), labels for a Choice, ``"0"``, ``"1"``, ... for a Score.
    """

    kind: str
    probabilities: Mapping[str, float]
    #: A Choice's ``choice``; a Score's ``score`` (its expected level).
    choice: str | None = None
    score: float | None = None
    #: The server's confidence (a Choice's and a Score's; a Noul's wire has none).
    confidence: float | None = None


def _refused(question_id: str, message: str) -> ProtocolError:
    error = ProtocolError(f"/v1/systemone: answer {question_id!r}: {message}")
    error.question_id = question_id
    return error


def _answer_from_system_one(question_id: str, question: Question, sent: SystemOneAnswer) -> Answer:
    kind = (
        "noul"
        if isinstance(question, Noul)
        else "choice"
        if isinstance(question, Choice)
        else "score"
    )
    if sent.kind != kind:
        raise _refused(question_id, f"a {sent.kind} answer to a {kind} question")
    keys = (
        ["false", "true"]
        if isinstance(question, Noul)
        else list(question.labels)
        if isinstance(question, Choice)
        else [str(level) for level in range(len(question.levels))]
    )
    if set(sent.probabilities) != set(keys):
        raise _refused(
            question_id,
            f"probabilities keyed {sorted(sent.probabilities)}, the question's options are {keys}",
        )
    sent_probabilities = [sent.probabilities[key] for key in keys]
    rounded = rounding_slack(sent_probabilities)
    total = math.fsum(sent_probabilities)
    if abs(total - 1.0) > SYSTEM_ONE_SLACK + len(keys) * rounded:
        raise _refused(question_id, f"probabilities sum to {total:.6g}, not 1")
    exact = abs(total - 1.0) <= _SUM_EXACT  # a float softmax's own sum: kept bit for bit
    answer = build_answer(question, [p if exact else p / total for p in sent_probabilities])
    if isinstance(answer, ChoiceAnswer):
        if sent.choice is None or sent.choice not in sent.probabilities:
            raise _refused(question_id, f"choice {sent.choice!r} is not one of the labels")
        top = max(sent_probabilities)
        if sent.probabilities[sent.choice] < top - SYSTEM_ONE_SLACK - rounded:
            raise _refused(question_id, f"choice {sent.choice!r} is not the most probable label")
    if isinstance(answer, ScoreAnswer):
        expected = math.fsum(level * p for level, p in enumerate(sent_probabilities))
        allowed = SYSTEM_ONE_SLACK + rounded * (1 + len(keys) * (len(keys) - 1) / 2)
        if sent.score is None or abs(sent.score - expected) > allowed:
            raise _refused(
                question_id,
                f"score {sent.score!r} is not the expected level of its probabilities "
                f"({expected:.6g})",
            )
    if sent.confidence is not None:  # the server's own, as it sent it
        answer = attrs.evolve(answer, confidence=sent.confidence)
    return answer


def answers_from_system_one(
    questions: Sequence[tuple[str, Question]], sent: Mapping[str, SystemOneAnswer]
) -> dict[str, Answer]:
    """The typed answers to ``questions`` (in their order) from a System One response's.

    Each answer is rebuilt from the probabilities the server sent (divided by their sum), by
    the rules every backend shares (`build_answer`: the Choice's label the most probable, the
    entropy confidence), once they are shown to be a distribution over exactly the question's
    options that agrees with the ``choice`` or ``score`` the server named, within what
    rounding explains (module docstring). Its ``confidence`` is the server's (a Noul's, which
    the wire does not carry, the reference formula's). A Noul's probabilities are
    ``1 - noul`` and ``noul``.

    :raises ProtocolError: an answer missing, extra or of another type, keyed otherwise than the
        question's options, not summing to 1, or disagreeing with itself (``question_id`` names
        the question).
    """
    asked = {question_id for question_id, _ in questions}
    extra = [question_id for question_id in sent if question_id not in asked]
    if extra:
        raise ProtocolError(f"/v1/systemone: answers to questions not asked: {extra}")
    answers: dict[str, Answer] = {}
    for question_id, question in questions:
        if question_id not in sent:
            raise _refused(question_id, "missing from the response")
        answers[question_id] = _answer_from_system_one(question_id, question, sent[question_id])
    return answers
