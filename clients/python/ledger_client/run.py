"""A client-driven run: propose tool calls, run them inside attempts, recover after a crash."""

import hashlib
import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, Protocol, Type

from .errors import (
    AlreadySettled,
    AttemptClosed,
    LedgerError,
    NeedsRecovery,
    OutcomeNotReported,
    StaleDecision,
    TransportError,
)
from .models import IN_DOUBT_STATES, TERMINAL_STATES, Action, BegunAttempt, Completed, Directive, Event, Next

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client


class ToolHandler(Protocol):
    """What :meth:`Run.resume` needs of a tool: its hands after a crash."""

    def query(self, dedup_key: str) -> str:
        """``happened``, ``not_happened`` or ``unknown`` for the call of ``dedup_key``."""
        ...

    def cancel(self, dedup_key: str) -> bool:
        """Cancel the call of ``dedup_key``; whether the tool confirms it never took effect."""
        ...

    def execute(self, arguments: Any, dedup_key: str) -> Any:
        """Call the tool with ``arguments`` and ``dedup_key`` and return its output."""
        ...


log = logging.getLogger("ledger_client")

#: Directives that need nothing of the agent now (a person decides, or the call is ours).
_WAITING = ("wait_approval", "review")


def begin_key(scope: str, attempt_no: int) -> str:
    """The begin's idempotency key of attempt ``attempt_no`` of the call named by ``scope``.

    Derived, so sending the begin again after a broken connection gets the
    same attempt and token, and a later attempt gets a key of its own.
    """
    h = hashlib.sha256(scope.encode("utf-8")).hexdigest()[:40]
    return "begin:%s:%d" % (h, attempt_no)


class Run:
    """One run of a client-driven agent, as its agent drives it.

    ``id``, ``agent`` and ``state`` are as last read; ``data`` the whole
    JSON. ``replayed`` says the submit was a replay of an earlier one.
    """

    def __init__(self, client: "Client", data: Mapping[str, Any], replayed: bool = False) -> None:
        self.client = client
        self.data: Dict[str, Any] = dict(data)
        self.id = str(data.get("id", ""))
        self.agent = str(data.get("agent", ""))
        self.state = str(data.get("state", ""))
        self.replayed = replayed

    def __repr__(self) -> str:
        return "Run(id=%r, agent=%r, state=%r)" % (self.id, self.agent, self.state)

    def refresh(self) -> "Run":
        """Read the run again."""
        self._update(self.client.get_run(self.id))
        return self

    def _update(self, data: Mapping[str, Any]) -> None:
        self.data = dict(data)
        self.state = str(data.get("state", self.state))

    def propose(
        self,
        tool: str,
        arguments: Any,
        step_key: str,
        usage: Optional[Mapping[str, int]] = None,
        supersedes: Optional[str] = None,
    ) -> Action:
        """Propose one tool call under the agent's ``step_key`` (replay-safe)."""
        return self.client.propose(self.id, tool, arguments, step_key, usage=usage, supersedes=supersedes)

    def next(self) -> Next:
        """What the agent must do now (``GET /next``)."""
        n = self.client.next(self.id)
        if n.run_state:
            self.state = n.run_state
        return n

    def finish(
        self,
        outcome: str,
        output: Any = None,
        stop_reason: Optional[str] = None,
        usage: Optional[Mapping[str, int]] = None,
    ) -> "Run":
        """End the run: ``completed``, or ``failed`` with a ``stop_reason`` of the failed family."""
        self._update(self.client.finish(self.id, outcome, output=output, stop_reason=stop_reason, usage=usage))
        return self

    def events(self, last_event_id: Optional[int] = None) -> Iterator[Event]:
        """The run's events as they happen, until its terminal event (SSE, resumed on a break)."""
        return self.client.events(self.id, last_event_id=last_event_id)

    def call(
        self,
        tool: str,
        arguments: Any,
        step_key: str,
        usage: Optional[Mapping[str, int]] = None,
        supersedes: Optional[str] = None,
        approval_timeout: Optional[float] = None,
        heartbeat_interval: Optional[float] = None,
        on_wait: Optional[Callable[[Action], None]] = None,
    ) -> "ToolCall":
        """One tool call inside an attempt, as a context manager::

            with run.call("payments.send", {"to": "acct_1"}, step_key="pay-1") as call:
                receipt = pay(call.arguments, idempotency_key=call.dedup_key)
                call.succeeded(receipt)

        On entry it proposes, waits for the decision (raising
        :class:`~ledger_client.Denied` or :class:`~ledger_client.Expired` on a
        "no"), begins an attempt and heartbeats until the body reports. A
        body that raises without reporting is reported ``failed`` (with the
        effect ``unknown`` for a write: the client never guesses that a write
        did not happen) and the exception goes on.

        ``approval_timeout`` bounds the wait for a decision (``None``: until
        decided); ``on_wait(action)`` is called once when the action must
        wait for a person. ``heartbeat_interval`` defaults to a third of the
        lease.
        """
        return ToolCall(self, tool, arguments, step_key, usage=usage, supersedes=supersedes,
                        approval_timeout=approval_timeout, heartbeat_interval=heartbeat_interval, on_wait=on_wait)

    def attempt(self, action: Action, key: Optional[str] = None, heartbeat_interval: Optional[float] = None) -> "ToolCall":
        """An attempt of an approved ``action`` as a context manager, like :meth:`call` without the proposal."""
        return ToolCall(self, action.tool, None, "", action=action, key=key, heartbeat_interval=heartbeat_interval)

    def resume(self, handlers: Mapping[str, ToolHandler], max_rounds: int = 50) -> Next:
        """Follow ``/next`` until the run needs nothing of the agent, or reaches ``propose``.

        Only a restarted agent calls it, before it goes on with its loop:
        an attempt in flight that this process does not hold is one the
        crash lost, so it is abandoned and recovery decides by the tool's
        guarantees. ``handlers`` maps each tool's name to its hands:
        ``query(dedup_key)`` answers ``happened``, ``not_happened`` or
        ``unknown``; ``cancel(dedup_key)`` whether the tool confirms the call
        never took effect; ``execute(arguments, dedup_key)`` calls the tool
        again (``execute`` and ``resend``) and returns its output. A handler
        that raises is reported as a failed query or cancel (recorded as
        unknown, never as an answer).

        Returns the last ``/next``: its directives are ``propose``, ``stop``,
        or ones a person must settle (``wait_approval``, ``review``), or
        attempts this process holds (``in_flight``).
        """
        for _ in range(max_rounds):
            nxt = self.next()
            acted = False
            for d in nxt.directives:
                kind = d.directive
                if kind in ("propose", "stop"):
                    return nxt
                if kind in _WAITING:
                    continue
                if kind == "in_flight":
                    if not d.attempt_id or self.client.holds(d.attempt_id):
                        continue
                    try:
                        self.client.abandon(d.attempt_id, reason="the agent restarted and lost this call")
                        acted = True
                    except AttemptClosed:
                        # Closed meanwhile: recovery waits (a query too early
                        # to trust, a failed query asked again later).
                        continue
                    continue
                handler = handlers.get(d.tool)
                if handler is None:
                    raise LedgerError("no handler for tool %r (directive %s of action %s)" % (d.tool, kind, d.action_id),
                                      code="no_handler")
                try:
                    if kind == "query":
                        self._answer_query(d, handler)
                    elif kind == "cancel":
                        self._answer_cancel(d, handler)
                    elif kind in ("execute", "resend"):
                        self._execute(d, handler)
                    else:
                        log.warning("resume: unknown directive %r of action %s; left alone", kind, d.action_id)
                        continue
                except StaleDecision:
                    pass  # another process answered first, or the facts changed: ask /next again
                acted = True
            if not acted:
                return nxt
        return self.next()

    def _answer_query(self, d: Directive, handler: ToolHandler) -> None:
        try:
            effect = handler.query(d.dedup_key)
        except Exception as e:  # the tool could not say: never an answer
            self.client.observe(d.attempt_id, d.decision_id, "query", error=_error_of(e, "query_failed"), run_id=self.id)
            return
        if effect not in ("happened", "not_happened", "unknown"):
            raise ValueError("query of %s answered %r: want happened, not_happened or unknown" % (d.tool, effect))
        self.client.observe(d.attempt_id, d.decision_id, "query", effect=effect, run_id=self.id)

    def _answer_cancel(self, d: Directive, handler: ToolHandler) -> None:
        try:
            confirmed = bool(handler.cancel(d.dedup_key))
        except Exception as e:
            self.client.observe(d.attempt_id, d.decision_id, "cancel", error=_error_of(e, "cancel_failed"), run_id=self.id)
            return
        self.client.observe(d.attempt_id, d.decision_id, "cancel", confirmed=confirmed, run_id=self.id)

    def _execute(self, d: Directive, handler: ToolHandler) -> None:
        action = self.client.get_action(d.action_id)
        if action.state != "approved":
            return  # moved meanwhile: /next says what now
        with self.attempt(action) as call:
            call.succeeded(handler.execute(call.arguments, call.dedup_key))


class ToolCall:
    """One tool call inside an attempt: see :meth:`Run.call`.

    Inside the ``with`` block: ``arguments`` (the canonical, approved ones:
    execute exactly these), ``dedup_key`` (give it to the tool),
    ``action``, ``attempt``, and ``cancel_requested`` (the run's cancel was
    accepted: stop if the tool can, and report what happened). Report with
    :meth:`succeeded`, :meth:`failed`, :meth:`timed_out` or
    :meth:`cancelled`.
    """

    def __init__(
        self,
        run: Run,
        tool: str,
        arguments: Any,
        step_key: str,
        usage: Optional[Mapping[str, int]] = None,
        supersedes: Optional[str] = None,
        approval_timeout: Optional[float] = None,
        heartbeat_interval: Optional[float] = None,
        action: Optional[Action] = None,
        key: Optional[str] = None,
        on_wait: Optional[Callable[[Action], None]] = None,
    ) -> None:
        self.run = run
        self.tool = tool
        self.step_key = step_key
        self._proposed_arguments = arguments
        self._usage = usage
        self._supersedes = supersedes
        self._approval_timeout = approval_timeout
        self._interval = heartbeat_interval
        self._key = key
        self._on_wait = on_wait
        self.action: Optional[Action] = action
        self.attempt: Optional[BegunAttempt] = None
        self.result: Optional[Completed] = None
        self.lease_lost = False
        self.progress: Any = None
        self._cancel = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._reported = False

    # The attempt's facts, once begun.

    @property
    def arguments(self) -> Any:
        """The canonical, approved arguments: execute exactly these."""
        return self._begun().arguments

    @property
    def dedup_key(self) -> str:
        """The key the tool must get, so that a resend is recognised as the same call."""
        return self._begun().dedup_key

    @property
    def cancel_requested(self) -> bool:
        """Whether a heartbeat said the run's cancel was accepted."""
        return self._cancel.is_set()

    @property
    def write(self) -> bool:
        """Whether the tool is a write (its outcome carries an effect)."""
        return self.action is not None and self.action.effect == "write"

    def _begun(self) -> BegunAttempt:
        if self.attempt is None:
            raise RuntimeError("the attempt has not begun: use the call inside its with block")
        return self.attempt

    # Entering: propose, wait, begin, heartbeat.

    def __enter__(self) -> "ToolCall":
        client = self.run.client
        if self.action is None:
            self.action = self.run.propose(self.tool, self._proposed_arguments, self.step_key,
                                           usage=self._usage, supersedes=self._supersedes)
        a = self.action
        if a.state in TERMINAL_STATES and a.state not in ("denied", "expired", "cancelled", "superseded"):
            raise AlreadySettled("the action of step %r is already %s" % (self.step_key or a.id, a.state),
                                 code="already_settled", action=a.raw)
        if a.state in IN_DOUBT_STATES:
            raise NeedsRecovery("the action of step %r is %s: resume the run first" % (self.step_key or a.id, a.state),
                                code="needs_recovery", action=a.raw)
        if not a.decided and self._on_wait is not None:
            self._on_wait(a)
        a = client.await_decision(a, timeout=self._approval_timeout)
        self.action = a
        key = self._key or begin_key("%s\x00%s" % (self.run.id, self.step_key or a.id), len(a.attempts) + 1)
        self.attempt = client.begin(a.id, key)
        interval = self._interval
        if interval is None:
            interval = max(self.attempt.lease_remaining_s / 3.0, 0.05) if self.attempt.lease_remaining_s else 10.0
        self._thread = threading.Thread(target=self._beat, args=(interval,), name="ledger-heartbeat-" + self.attempt.id,
                                        daemon=True)
        self._thread.start()
        return self

    def _beat(self, interval: float) -> None:
        att = self._begun()
        client = self.run.client
        while not self._stop.wait(interval):
            try:
                hb = client.heartbeat(att.id, att.token, self.progress, retry=False)
            except AttemptClosed:
                self.lease_lost = True
                log.warning("attempt %s: the lease lapsed or the attempt was closed; its outcome will be kept as late", att.id)
                return
            except (TransportError, LedgerError) as e:
                log.warning("attempt %s: heartbeat failed: %s", att.id, e)
                continue
            if hb.cancel_requested:
                self._cancel.set()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()

    # Reporting.

    def report(self, status: str, effect: Optional[str] = None, output: Any = None, error: Any = None) -> Completed:
        """Report the call's outcome (the table of docs/agent-protocol.md): stops the heartbeat, completes."""
        att = self._begun()
        if self._reported:
            raise RuntimeError("attempt %s: the outcome was reported already" % att.id)
        self._reported = True
        self._stop_heartbeat()
        if not self.write:
            effect = None
        self.result = self.run.client.complete(att.id, att.token, status, effect=effect, output=output,
                                               error=None if error is None else _error_of(error, status))
        self.action = self.result.action
        return self.result

    def succeeded(self, output: Any = None) -> Completed:
        """The call did what was asked (a write's effect happened)."""
        return self.report("succeeded", "happened", output)

    def failed(self, effect: str = "unknown", error: Any = None, output: Any = None) -> Completed:
        """The call failed. For a write say what the world saw: ``not_happened`` only when the tool vouches
        for it, ``happened`` if it acted anyway, else ``unknown`` (the default)."""
        return self.report("failed", effect, output, error)

    def timed_out(self, error: Any = None) -> Completed:
        """The call took too long to say; a write's effect is unknown."""
        return self.report("timed_out", "unknown", None, error)

    def cancelled(self, effect: str = "unknown", error: Any = None) -> Completed:
        """The call was stopped on the run's cancel; ``not_happened`` only when the tool confirms it."""
        return self.report("cancelled", effect, None, error)

    # Leaving: the safe default when the body said nothing.

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._stop_heartbeat()
        if self._reported or self.attempt is None:
            return
        why: Any = exc if exc is not None else {"code": "not_reported", "message": "the agent reported no outcome"}
        try:
            self.report("failed", "unknown", None, why)
        except LedgerError as e:
            if exc is None:
                raise
            log.warning("attempt %s: could not report the failure: %s", self.attempt.id, e)
        if exc is None:
            raise OutcomeNotReported(
                "attempt %s: the call's body reported no outcome; reported failed%s" %
                (self.attempt.id, " with effect unknown" if self.write else ""),
                code="outcome_not_reported", action=self.action.raw if self.action else None)


def _error_of(e: Any, default_code: str) -> Dict[str, str]:
    if isinstance(e, Mapping):
        return {"code": str(e.get("code") or default_code), "message": str(e.get("message") or "")[:2000]}
    if isinstance(e, BaseException):
        return {"code": type(e).__name__, "message": str(e)[:2000]}
    return {"code": default_code, "message": str(e)[:2000]}
