"""Content-free priors (`typevet_async._core.statistics.content_free`): read once per question and
session, kept, and shared by the judgments that need one at the same time.

A question's prior is read on every content-free state (`CONTENT_FREE_STATES`) the way the
session reads the question (its framing, rotations and label prior; no calibration map, no
images, and no off-menu guard: a state that says nothing may well be answered off the menu,
and that mass is the prior's to report, not an answer's to raise), and averaged. The first
judgment to need it reads it; a judgment that needs it while it is being read waits for that
read instead of sending its own; a read that fails (or is cancelled) is not kept, so the next
judgment that needs the prior reads it again.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence

import anyio

from typevet_async._concurrency.fanout import gather_in_order
from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Usage
from typevet_async._core.statistics.calibration import Reading
from typevet_async._core.statistics.content_free import (
    CONTENT_FREE_STATES,
    ContentFreePrior,
    content_free_off_menu_mass,
    content_free_prior,
)

__all__ = ["PRIOR_CACHE_SIZE", "Answered", "PriorCache", "ReadAnswer", "content_free_priors"]

#: Priors a session keeps (least recently used beyond it are read again).
PRIOR_CACHE_SIZE = 1024

#: One question's answer about one state: its probabilities in option order, its read's
#: off-menu mass (None: unknown), and what the reads cost the server.
Answered = tuple[tuple[float, ...], float | None, Usage]
ReadAnswer = Callable[[str, Question, str], Awaitable[Answered]]


class PriorCache:
    """Each question's prior, by what decides it (the question and how it is read)."""

    def __init__(self, size: int = PRIOR_CACHE_SIZE) -> None:
        self._size = size
        self._priors: collections.OrderedDict[Hashable, ContentFreePrior] = (
            collections.OrderedDict()
        )
        self._reading: dict[Hashable, anyio.Event] = {}
        #: Priors read (not found kept), for tests and diagnostics.
        self.reads = 0

    def known(self, key: Hashable) -> ContentFreePrior | None:
        """The prior kept for ``key`` (None: not read yet)."""
        prior = self._priors.get(key)
        if prior is not None:
            self._priors.move_to_end(key)
        return prior

    async def get(
        self, key: Hashable, read: Callable[[], Awaitable[ContentFreePrior]]
    ) -> ContentFreePrior:
        """The prior for ``key``: kept, or awaited from the read in flight, or read now."""
        while True:
            prior = self.known(key)
            if prior is not None:
                return prior
            reading = self._reading.get(key)
            if reading is None:
                break
            await reading.wait()  # then kept, or failed: read it here
        done = self._reading[key] = anyio.Event()
        try:
            prior = await read()
            self.reads += 1
            self._priors[key] = prior
            while len(self._priors) > self._size:
                self._priors.popitem(last=False)
            return prior
        finally:
            del self._reading[key]
            done.set()


async def content_free_priors(
    cache: PriorCache,
    questions: Sequence[tuple[str, Question]],
    readings: Mapping[str, Reading],
    answer_to: ReadAnswer,
) -> tuple[dict[str, ContentFreePrior], Usage]:
    """Each question's prior by id, from ``cache`` or read now: ``answer_to(question_id,
    question, state)`` on every content-free state, averaged (`content_free_prior`, and the
    reads' off-menu mass: `content_free_off_menu_mass`), and the usage of the reads made here
    (none for a prior kept or read by another judgment). A question is kept by itself and how
    it is read (``readings``), not by its id."""
    kept = {qid: cache.known((question, readings[qid])) for qid, question in questions}
    if all(prior is not None for prior in kept.values()):  # the hot path: no task, no read
        return {qid: prior for qid, prior in kept.items() if prior is not None}, Usage()
    spent: list[Usage] = []

    async def prior(pair: tuple[str, Question]) -> ContentFreePrior:
        question_id, question = pair

        async def read() -> ContentFreePrior:
            answers = await gather_in_order(
                CONTENT_FREE_STATES, lambda state: answer_to(question_id, question, state)
            )
            spent.extend(usage for _, _, usage in answers)
            return ContentFreePrior(
                content_free_prior([probabilities for probabilities, _, _ in answers]),
                content_free_off_menu_mass([off_menu for _, off_menu, _ in answers]),
            )

        return await cache.get((question, readings[question_id]), read)

    priors = await gather_in_order(questions, prior)
    usage = sum(spent, Usage())
    return {question_id: p for (question_id, _), p in zip(questions, priors, strict=True)}, usage
