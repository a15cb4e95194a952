"""Several endpoints of one model behind one backend: fleet checks, routing and failover.

A session over replicas (``Session.llama_cpp([url1, url2])``, ``Session.vllm([...])``,
``Session.system_one([...])``) holds one `AsyncFleet` over one backend per endpoint, all of
one kind and one configuration. The session and its pipelines see one backend.

- **One model, everywhere.** `probe` probes every endpoint. Those that answer must agree on
  what an answer depends on: the models served, the template (family and rendering), the
  vocabulary size and every control's token id; an endpoint that differs is refused with a
  `ConfigurationError` naming it. An endpoint that cannot be reached at the probe starts
  cooling down (below); one must answer.
- **Routing.** Each read goes to the endpoint with the fewest reads outstanding (among those
  equally busy, the one picked longest ago), at most its slots at once (llama.cpp's
  ``/props`` ``total_slots``, capped by the fleet's ``slots`` and the backend's own limit).
  When every endpoint that is up is full, reads wait for a slot in the order they came (a
  read that frees a slot cannot take it back ahead of them), for as long as it takes: a busy
  endpoint is not a gone one, and only the caller's deadline bounds that wait. Where the
  backend reuses cached prefixes, a judgment's reads stay on the endpoint its first read went
  to (`ScoringRequest.judgment`), while it has a free slot.
- **Failover.** A transient failure (a connection error, a timeout, HTTP 408, 429, 5xx but
  501) cools the endpoint down, for ``cooldown`` seconds doubling with each failure in a row
  up to ``max_cooldown``, or for as long as the server's ``Retry-After`` asks (up to the
  retry policy's ``max_retry_after``) where that is longer, and the read, which is idempotent,
  is sent to another endpoint. Each failed try counts against ``max_retries`` (the member
  backends themselves send one attempt: the fleet does the retrying, by `retrying`); waiting
  does not: when no endpoint is up, the next try waits for one to come back (its cooldown
  over, its health check passed) for up to ``max_retry_after`` seconds with none up, without
  spending a retry, so a fleet is never less patient than one endpoint. The diagnostics name the
  endpoint that answered (`Diagnostics.endpoint`), and a read that fails for good names the
  last one tried.
- **Coming back.** Once its cooldown is over, an endpoint is probed again in the background;
  it takes reads again only if that probe passes and still agrees with the fleet.
- **Logs.** One record per change of an endpoint's state (`fleet_endpoints`); the health
  checks in between, and their probes' own retries, are DEBUG: an outage is two lines.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import attrs
import orjson
from tenacity import RetryCallState

import typevet_async._telemetry as telemetry
from typevet_async._backends.base import (
    AnswerTokenizing,
    Backend,
    Capabilities,
    ReadIdentifying,
    RemoteJudging,
)
from typevet_async._backends.fleet_endpoints import Endpoint, differences
from typevet_async._backends.retrying import (
    RetryPolicy,
    is_transient,
    retrying,
    transient_but_no_timeout,
)
from typevet_async._concurrency.fanout import gather_settled
from typevet_async._core.generation.records import ChatOutput, GenerationRequest
from typevet_async._core.prompts.questions import Question
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.reading.probe import Probe
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import ConfigurationError, TransportError, TypevetError
from typevet_async._options import UNSET, Unset, resolve

__all__ = ["AsyncFleet"]

T = TypeVar("T")

#: Judgments whose endpoint a fleet remembers (least recently used beyond it are forgotten).
PIN_CACHE_SIZE = 4096


class _NoEndpointUp(TransportError):
    """No endpoint came back within the fleet's patience: final, not retried again."""


class AsyncFleet:
    """One backend over several endpoints of one model (see the module's docstring)."""

    def __init__(
        self,
        members: Sequence[tuple[str, Backend]],
        *,
        retry: RetryPolicy,
        endpoint_slots: int | None = None,
        cooldown: float = 1.0,
        max_cooldown: float = 30.0,
    ) -> None:
        """:param members: (name, backend) per endpoint, the name shown in errors and
        diagnostics (the redacted base URL); at least two, of one kind.
        :param endpoint_slots: the most reads one endpoint takes at once (None: what it declares).
        """
        if len(members) < 2:
            raise ConfigurationError("a fleet needs at least two endpoints")
        kinds = {type(backend) for _, backend in members}
        if len(kinds) != 1:
            raise ConfigurationError("every endpoint of a fleet must be of one kind")
        self._endpoints = [Endpoint(n, name, backend) for n, (name, backend) in enumerate(members)]
        self._retry = retry
        self._slots = endpoint_slots
        self._cooldown = (cooldown, max_cooldown)
        first = members[0][1].capabilities
        limits = [backend.capabilities.max_concurrency for _, backend in members]
        total = None if None in limits else sum(limit for limit in limits if limit is not None)
        self._capabilities = attrs.evolve(first, max_concurrency=total)
        self._probe: Probe | None = None
        #: Judgment -> the endpoint its first read went to (least recently used first).
        self._pins: collections.OrderedDict[int, Endpoint] = collections.OrderedDict()
        #: Set (and replaced) whenever a slot frees or an endpoint changes state.
        self._changed = asyncio.Event()
        #: The tries waiting for a slot, first come first served (`_acquire`).
        self._queue: collections.deque[object] = collections.deque()
        self._checks: set[asyncio.Task[None]] = set()
        self._picks = 0

    def __repr__(self) -> str:
        return f"AsyncFleet({[e.name for e in self._endpoints]!r})"

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def model(self) -> str | None:
        return self._endpoints[0].backend.model

    @property
    def endpoints(self) -> list[str]:
        """The endpoints' names, in the order given."""
        return [endpoint.name for endpoint in self._endpoints]

    def read_identity(self) -> str | None:
        """What decides this fleet's reads (`ReadIdentifying`): every endpoint's identity
        (sorted: the same fleet given in another order is the same). Its endpoints agree on
        the model, template and controls (`probe`), but a read is still kept under all of
        them together, never under one. None if an endpoint's reads may not be cached."""
        members = []
        for endpoint in self._endpoints:
            backend = endpoint.backend
            identity = backend.read_identity() if isinstance(backend, ReadIdentifying) else None
            if identity is None:
                return None
            members.append(identity)
        return orjson.dumps({"backend": "fleet", "endpoints": sorted(members)}).decode()

    def endpoint_states(self) -> dict[str, str]:
        """Each endpoint's routing state: ``up``, ``cooling``, ``checking`` or ``excluded``."""
        return {endpoint.name: endpoint.state for endpoint in self._endpoints}

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Open every endpoint's pool; if one cannot open, those opened are closed again."""
        opened: list[Endpoint] = []
        try:
            for endpoint in self._endpoints:
                await endpoint.backend.open()
                opened.append(endpoint)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for endpoint in opened:
                    await endpoint.backend.aclose()
            raise

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            for task in list(self._checks):
                task.cancel()
            await asyncio.gather(*self._checks, return_exceptions=True)
            for endpoint in self._endpoints:
                await endpoint.backend.aclose()

    async def probe(self) -> Probe:
        """Every endpoint's probe; those that answer must agree (the first answering is the
        fleet's). An endpoint that fails transiently cools down; any other failure is raised.

        :raises ConfigurationError: an endpoint differs from the others (named), or serves
            another model than the pin.
        :raises BackendError: no endpoint could be probed (the first's error).
        """
        with telemetry.quiet_retries():  # an endpoint that fails is logged once, below
            outcomes = await gather_settled(self._endpoints, lambda e: e.backend.probe())
        for endpoint, outcome in zip(self._endpoints, outcomes, strict=True):
            if isinstance(outcome, TypevetError) and not is_transient(outcome):
                outcome.add_note(f"endpoint: {endpoint.name}")
                raise outcome
        answered = [
            (endpoint, outcome)
            for endpoint, outcome in zip(self._endpoints, outcomes, strict=True)
            if isinstance(outcome, Probe)
        ]
        if not answered:
            first = outcomes[0]
            assert isinstance(first, TypevetError)
            first.add_note(f"no endpoint of {self.endpoints} could be probed")
            raise first
        reference_endpoint, reference = answered[0]
        for endpoint, outcome in zip(self._endpoints, outcomes, strict=True):
            if isinstance(outcome, TypevetError):
                self._cool(endpoint, error=outcome)
                continue
            found = differences(reference, outcome)
            if found:
                raise ConfigurationError(
                    f"endpoint {endpoint.name} differs from {reference_endpoint.name}: "
                    f"{'; '.join(found)}. An answer must not depend on which endpoint read it"
                )
            self._set_slots(endpoint, outcome)
        # A prompt is refused only where it fits no endpoint: the longest context, if all say.
        contexts = [probe.context_tokens for _, probe in answered]
        longest = None if None in contexts else max(c for c in contexts if c is not None)
        reference = attrs.evolve(reference, context_tokens=longest)
        self._probe = reference
        return reference

    def _set_slots(self, endpoint: Endpoint, probe: Probe) -> None:
        limits = [
            limit
            for limit in (endpoint.backend.capabilities.max_concurrency, probe.slots, self._slots)
            if limit is not None
        ]
        endpoint.slots = min(limits) if limits else None

    # -- the backend's calls, routed ---------------------------------------------------------

    async def read(
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        pin = request.judgment if self._capabilities.prefix_reuse else None

        async def one(backend: Backend) -> CandidateRead:
            return await backend.read(request, probe, max_retries=0)

        read, endpoint, failed = await self._routed(one, max_retries, pin=pin)
        return attrs.evolve(read, endpoint=endpoint.name, attempts=read.attempts + failed)

    async def judge(
        self,
        state: Any,
        questions: Sequence[tuple[str, Question]],
        probe: Probe,
        *,
        max_retries: int | Unset,
    ) -> Judgment:
        async def one(backend: Backend) -> Judgment:
            if not isinstance(backend, RemoteJudging):
                raise ConfigurationError(f"{type(backend).__name__} does not judge remotely")
            return await backend.judge(state, questions, probe, max_retries=0)

        judgment, _, _ = await self._routed(one, max_retries)
        return judgment

    async def answer_tokens(self, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        async def one(backend: Backend) -> tuple[list[int], list[list[int]]]:
            if not isinstance(backend, AnswerTokenizing):
                raise ConfigurationError(
                    f"{type(backend).__name__} cannot tokenize answers: no two-token codes"
                )
            return await backend.answer_tokens(answers)

        tokens, _, _ = await self._routed(one, UNSET)  # the fleet's retry policy
        return tokens

    async def special_runs(self, runs: Sequence[str]) -> frozenset[str] | None:
        async def one(backend: Backend) -> frozenset[str] | None:
            return await backend.special_runs(runs)

        verdict, _, _ = await self._routed(one, UNSET)  # the fleet's retry policy
        return verdict

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        async def one(backend: Backend) -> ChatOutput:
            return await backend.generate(request, max_retries=0)

        # Not retried after a timeout: it would generate from scratch, as long again.
        output, _, _ = await self._routed(one, max_retries, retry_timeouts=False)
        return output

    async def _routed(
        self,
        call: Callable[[Backend], Awaitable[T]],
        max_retries: int | Unset,
        *,
        pin: int | None = None,
        retry_timeouts: bool = True,
    ) -> tuple[T, Endpoint, int]:
        """``call`` on a chosen endpoint, and on others after transient failures: its result,
        the endpoint that gave it, and how many tries failed before."""
        failed = 0
        transient = is_transient if retry_timeouts else transient_but_no_timeout

        def retryable(error: BaseException) -> bool:
            return transient(error) and not isinstance(error, _NoEndpointUp)

        async def attempt() -> tuple[T, Endpoint, int]:
            nonlocal failed
            endpoint = await self._acquire(pin)
            try:
                result = await call(endpoint.backend)
            except TypevetError as error:
                if retryable(error):
                    failed += 1
                    self._cool(endpoint, getattr(error, "retry_after", None), error=error)
                error.add_note(f"endpoint: {endpoint.name}")
                raise
            finally:
                self._release(endpoint)
            endpoint.failures = 0
            return result, endpoint, failed

        return await retrying(
            attempt,
            retries=resolve(max_retries, self._retry.max_retries),
            retryable=retryable,
            wait=self._wait,
        )

    # -- routing -----------------------------------------------------------------------------

    async def _acquire(self, pin: int | None) -> Endpoint:
        """The endpoint for the next try, its slot taken. While every endpoint that is up is
        full, the wait for a slot, in turn and without limit (the caller's deadline bounds it);
        while none is up, the wait for one to come back (its cooldown over and its health
        check passed). Neither spends a retry.

        :raises TransportError: every endpoint is excluded, or none was up for the retry
            policy's ``max_retry_after`` seconds in a row (final: not retried).
        """
        patience = self._retry.max_retry_after
        #: Since when (`time.monotonic`) this try has seen no endpoint up.
        none_up_since: float | None = None
        turn: object | None = None  # this try's place in the queue, once it waits
        try:
            while True:
                self._start_due_checks()
                if not self._queue or self._queue[0] is turn:
                    endpoint = self._pick(pin)
                    if endpoint is not None:
                        return endpoint
                if turn is None:
                    turn = object()
                    self._queue.append(turn)
                now = time.monotonic()
                timeout = self._next_due(now)
                if any(e.state == "up" for e in self._endpoints):
                    none_up_since = None  # up but full: a slot will free, wait for it
                else:
                    states = ", ".join(f"{e.name}: {e.state}" for e in self._endpoints)
                    if all(e.state == "excluded" for e in self._endpoints):
                        raise _NoEndpointUp(f"no endpoint is left ({states})")
                    if none_up_since is None:
                        none_up_since = now
                    left = none_up_since + patience - now
                    if left <= 0:
                        raise _NoEndpointUp(
                            f"no endpoint came back within {patience:g} s ({states})"
                        )
                    timeout = left if timeout is None else min(timeout, left)
                changed = self._changed
                # a slot freed, the queue moved or a state changed; else look again when a
                # cooldown ends (a health check signals when it is done)
                with anyio.move_on_after(math.inf if timeout is None else timeout):
                    await changed.wait()
        finally:
            if turn is not None:
                self._queue.remove(turn)
                self._signal()  # the next in the queue may go now

    def _pick(self, pin: int | None) -> Endpoint | None:
        """The endpoint a try goes to (its pin's while it has room, else the least busy with
        room), its slot taken; None if no endpoint that is up has room."""
        endpoint = self._pinned(pin)
        if endpoint is None:
            free = [e for e in self._endpoints if e.has_room()]
            if not free:
                return None
            endpoint = min(free, key=lambda e: (e.outstanding, e.last_pick))
            if pin is not None:
                self._pins[pin] = endpoint
                if len(self._pins) > PIN_CACHE_SIZE:
                    self._pins.popitem(last=False)
        self._picks += 1
        endpoint.last_pick = self._picks
        endpoint.outstanding += 1
        return endpoint

    def _next_due(self, now: float) -> float | None:
        """Seconds until the first cooldown ends (None: no endpoint is cooling)."""
        due = [e.until - now for e in self._endpoints if e.state == "cooling"]
        return max(0.0, min(due)) if due else None

    def _pinned(self, pin: int | None) -> Endpoint | None:
        if pin is None:
            return None
        endpoint = self._pins.get(pin)
        if endpoint is None or not endpoint.has_room():
            return None
        self._pins.move_to_end(pin)
        return endpoint

    def _release(self, endpoint: Endpoint) -> None:
        endpoint.outstanding -= 1
        self._signal()

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _cool(
        self,
        endpoint: Endpoint,
        retry_after: float | None = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        """Out of the rotation until its health check, due after its cooldown, passes."""
        endpoint.failures += 1
        base, ceiling = self._cooldown
        seconds = min(ceiling, base * 2 ** (endpoint.failures - 1))
        if retry_after is not None:  # the server said how long: never less
            seconds = max(seconds, min(retry_after, self._retry.max_retry_after))
        endpoint.out(seconds, error)
        self._signal()

    def _wait(self, retry_state: RetryCallState) -> float:
        """Before a retry: none (the next try's `_acquire` waits for an endpoint itself)."""
        return 0.0

    def _start_due_checks(self) -> None:
        now = time.monotonic()
        for endpoint in self._endpoints:
            if endpoint.state == "cooling" and endpoint.until <= now:
                endpoint.state = "checking"
                task = asyncio.get_running_loop().create_task(self._check(endpoint))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)

    async def _check(self, endpoint: Endpoint) -> None:
        """The health check of an endpoint whose cooldown is over: probed again, back if the
        probe passes and agrees with the fleet, excluded for good if it disagrees."""
        try:
            with telemetry.quiet_retries():
                probe = await endpoint.backend.probe()
        except TypevetError as error:
            self._cool(endpoint, error=error)
            return
        reference = self._probe
        found = [] if reference is None else differences(reference, probe)
        if found:
            endpoint.exclude(found)
        else:
            self._set_slots(endpoint, probe)
            endpoint.back()
        self._signal()
