"""Ticket triage over HTTP: a FastAPI app that shares one typevet_async session.

    pip install 'typevet_async[local]' fastapi uvicorn
    TYPEVET_BASE_URL=http://127.0.0.1:8080 uvicorn --app-dir examples webapp:app

``POST /triage`` takes ``{"subject": ..., "message": ...}`` and answers three typed questions
about it, with their probabilities. The session is configured by ``TYPEVET_*`` variables
(`tv.Session.from_env`: without ``TYPEVET_BASE_URL`` it starts the embedded llama.cpp server),
opened once in the lifespan and shared by every request; ``TRIAGE_TIMEOUT`` (seconds, default
30) bounds each request, the wait for a free slot included.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, get_args

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import typevet_async as tv

log = logging.getLogger("triage")

Team = Literal["billing", "shipping", "technical"]
Urgency = Literal["can wait", "this week", "today", "right now"]  # levels, lowest first

#: Built once: the session binds each question's controls once and reuses them for every ticket.
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Does the customer ask for a refund?"),
    "team": tv.Choice(
        {
            "billing": "charges, invoices, refunds",
            "shipping": "deliveries, parcels, tracking",
            "technical": "the app or the website not working",
        },
        instructions="Which team should handle the ticket?",
    ),
    "urgency": tv.Score(list(get_args(Urgency)), instructions="How urgent is the ticket?"),
}


class Ticket(BaseModel):
    subject: str = Field(max_length=200, examples=["Charged twice"])
    # Characters are not tokens (Gemma reads each digit as one): a ticket longer than the
    # server's context per request (2,048 tokens by default) is refused there, a 422 too.
    message: str = Field(min_length=1, max_length=4000, examples=["I was charged twice."])


class Triage(BaseModel):
    refund: float = Field(description="P(the customer asks for a refund)")
    team: Team = Field(description="the most probable team")
    team_probabilities: dict[Team, float]
    urgency: float = Field(description="expected level, 0 (can wait) to 3 (right now)")
    urgency_probabilities: dict[Urgency, float]

    @classmethod
    def from_judgment(cls, judgment: tv.Judgment) -> Triage:
        refund, team, urgency = judgment["refund"], judgment["team"], judgment["urgency"]
        assert isinstance(refund, tv.NoulAnswer)  # the question's type decides its answer's
        assert isinstance(team, tv.ChoiceAnswer)
        assert isinstance(urgency, tv.ScoreAnswer)
        return cls.model_validate(
            {
                "refund": refund.noul,
                "team": team.choice,
                "team_probabilities": team.probabilities,
                "urgency": urgency.score,
                "urgency_probabilities": dict(
                    zip(urgency.legend, urgency.probabilities.values(), strict=True)
                ),
            }
        )


class Problem(BaseModel):
    detail: str


#: SDK errors -> HTTP statuses; the first match wins. `UnsupportedTemplateError` and a wrong
#: model pin fail at startup (the probe), not here.
ERROR_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (tv.InvalidInputError, 422),
    (TimeoutError, 504),  # DeadlineExceededError (our timeout), RequestTimeoutError (one request)
    (tv.BackendError, 502),  # the model server failed, or could not be reached
    (tv.SessionStateError, 503),  # shutting down
    (tv.TypevetError, 500),
)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    502: {"model": Problem, "description": "The model server failed or could not be reached"},
    503: {"model": Problem, "description": "The app is shutting down"},
    504: {"model": Problem, "description": "The ticket was not judged within the timeout"},
}


def problems(errors: Sequence[Any]) -> JSONResponse:
    """A 422 in FastAPI's shape, ``{"detail": [{"type", "loc", "msg"}]}``."""
    detail = [{"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]} for e in errors]
    return JSONResponse({"detail": detail}, status_code=422)


def get_session(request: Request) -> tv.Session:
    session: tv.Session = request.app.state.session
    return session


def create_app(
    session_factory: Callable[[], tv.Session] = tv.Session.from_env,
    *,
    timeout: float | None = 30.0,
) -> FastAPI:
    """The app; ``session_factory`` builds its one session (opened at startup, closed at
    shutdown) and ``timeout`` bounds each request's judgment, in seconds (None: no bound)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with session_factory() as session:
            await session.probe()  # an unreachable server, a wrong model or template: no start
            app.state.session = session
            yield
        # Closed: every connection of its pool (and the embedded server, if it started one).

    app = FastAPI(title="Ticket triage", lifespan=lifespan)

    @app.post("/triage", responses=ERROR_RESPONSES)
    async def triage(
        ticket: Ticket, session: Annotated[tv.Session, Depends(get_session)]
    ) -> Triage:
        judgment = await session.judge(ticket.model_dump(), QUESTIONS, timeout=timeout)
        return Triage.from_judgment(judgment)

    @app.exception_handler(RequestValidationError)
    async def invalid_ticket(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's own 422 body without its "input" echo: a ticket is not repeated back (nor
        # logged), and a lone surrogate in it ("\ud800" in the JSON) could not be encoded.
        return problems(error.errors())

    @app.exception_handler(tv.TypevetError)
    async def sdk_error(request: Request, error: tv.TypevetError) -> JSONResponse:
        status = next(code for kind, code in ERROR_STATUS if isinstance(error, kind))
        if isinstance(error, tv.ServerError) and error.status == 400:
            status = 422  # the server refused this ticket: more tokens than its context holds
        if status == 422:  # the ticket, refused by the SDK (nothing sent) or by the server
            return problems([{"type": "value_error", "loc": ("body",), "msg": str(error)}])
        log.warning("triage failed: %s: %s", type(error).__name__, error)
        detail = f"{type(error).__name__}: {error}"  # redacted by the SDK: no key, no password
        return JSONResponse({"detail": detail}, status_code=status)

    return app


app = create_app(timeout=float(os.environ.get("TRIAGE_TIMEOUT", "30")))
