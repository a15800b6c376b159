"""The errors of the client.

Every problem document the ledger answers with (``application/problem+json``)
is raised as a :class:`LedgerError`, or the subclass its stable ``code`` names.
Branch on the class or on ``code``, never on ``detail``, which is for people.
"""

from typing import Any, Dict, List, Optional, Type


class LedgerError(Exception):
    """A refusal of the ledger, or of the client on the ledger's behalf.

    ``status`` is the HTTP status (``None`` when no request failed: a
    person's "no" raised by :meth:`Run.call`, say). ``code`` is the stable
    problem code. ``action``, ``recorded``, ``stop_reason`` and ``errors`` are
    the extra members some codes carry (the recorded action of
    ``step_key_reused``, the recorded outcome of ``outcome_conflict``, the
    stop reason of ``run_stopped``, the failing locations of
    ``invalid_arguments`` and ``schema_violation``).
    """

    def __init__(
        self,
        detail: str,
        *,
        status: Optional[int] = None,
        code: str = "",
        title: str = "",
        instance: str = "",
        action: Optional[Dict[str, Any]] = None,
        recorded: Optional[Dict[str, Any]] = None,
        stop_reason: str = "",
        errors: Optional[List[Dict[str, Any]]] = None,
        retry_after: Optional[float] = None,
        body: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.instance = instance
        self.action = action
        self.recorded = recorded
        self.stop_reason = stop_reason
        self.errors: List[Dict[str, Any]] = list(errors or [])
        self.retry_after = retry_after
        self.body: Dict[str, Any] = dict(body or {})

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        head = " ".join(parts)
        text = self.detail or self.title
        if self.instance:
            text = "%s (%s)" % (text, self.instance)
        return "%s: %s" % (head, text) if head else text


# Codes of the agent protocol (docs/agent-protocol.md).


class StepKeyReused(LedgerError):
    """The step key was used in this run for another body; ``action`` is the recorded one."""


class InvalidArguments(LedgerError):
    """The arguments fail the tool's schema; ``errors`` lists each location."""


class UnknownTool(LedgerError):
    """No tool of that name is declared."""


class ToolNotAllowed(LedgerError):
    """The tool exists, but this run's agent may not call it."""


class ActionInDoubt(LedgerError):
    """An earlier write of the run is running, uncertain or in review."""


class RunStopped(LedgerError):
    """The run has ended, or this step made a budget or loop policy stop it (``stop_reason``)."""


class RunCancelled(LedgerError):
    """The run's cancel was accepted: no new attempt starts."""


class NotClientDriven(LedgerError):
    """The run's agent is not driven by a client."""


class NotApproved(LedgerError):
    """The action is not approved (awaiting, denied, expired, ...)."""


class ApprovalStale(LedgerError):
    """The approval passed its ``execute_by``: a new approval is needed."""


class AttemptOpen(LedgerError):
    """The action already has an open attempt: follow ``/next``."""


class AttemptClosed(LedgerError):
    """The attempt's lease lapsed or it is closed; a late outcome is kept as evidence."""


class BadAttemptToken(LedgerError):
    """The attempt token is not this attempt's."""


class OutcomeConflict(LedgerError):
    """Another outcome was recorded for the attempt; ``recorded`` holds it."""


class OutcomeNotAllowed(LedgerError):
    """The outcome is not one the tool's effect allows."""


class StaleDecision(LedgerError):
    """The decision answered is no longer the current one: follow ``/next``."""


class InvalidFinish(LedgerError):
    """The finish's outcome or stop reason is not allowed."""


# Codes of the whole API (docs/api.md).


class Invalid(LedgerError):
    """A malformed request: ``invalid``, ``invalid_json``, ``schema_violation``, ``idempotency_key_invalid``."""


class Unauthorized(LedgerError):
    """No, a malformed or an unknown bearer token."""


class Forbidden(LedgerError):
    """The token's role does not allow it, or separation of duties forbids it."""


class NotFound(LedgerError):
    """Unknown id, another tenant's object, or no such route."""


class Conflict(LedgerError):
    """The stored state does not allow it."""


class IdempotencyKeyReused(LedgerError):
    """The idempotency key was used with another body; nothing changed."""


class RequestInProgress(LedgerError):
    """The same idempotency key is still being processed; retry after ``retry_after``."""


class RateLimited(LedgerError):
    """Over a rate limit or a cap; retry after ``retry_after``."""


class ServerError(LedgerError):
    """A fault of the server (5xx); its cause is in the server's log under ``instance``."""


class TransportError(LedgerError):
    """The ledger could not be reached, or its answer was not a readable one."""


# Raised by the client itself: a person's decision, or a step the client
# will not take.


class NotExecuted(LedgerError):
    """The action will not run: a person or a rule said no, or it was cancelled or superseded.

    ``action`` is the action as it stands.
    """


class Denied(NotExecuted):
    """The action was denied (by an approver, or by a rule)."""


class Expired(NotExecuted):
    """The action's approval expired before anyone decided."""


class AlreadySettled(LedgerError):
    """The step key's action already ran to an end (``action``); it is not run again."""


class NeedsRecovery(LedgerError):
    """The step key's action has an attempt open, uncertain or in review: call :meth:`Run.resume`."""


class OutcomeNotReported(LedgerError):
    """The body of :meth:`Run.call` ended without reporting what the call did.

    The client reported the safe default (``failed``, and ``unknown`` for a write).
    """


_BY_CODE: Dict[str, Type[LedgerError]] = {
    "step_key_reused": StepKeyReused,
    "invalid_arguments": InvalidArguments,
    "unknown_tool": UnknownTool,
    "tool_not_allowed": ToolNotAllowed,
    "action_in_doubt": ActionInDoubt,
    "run_stopped": RunStopped,
    "run_cancelled": RunCancelled,
    "not_client_driven": NotClientDriven,
    "not_approved": NotApproved,
    "approval_stale": ApprovalStale,
    "attempt_open": AttemptOpen,
    "attempt_closed": AttemptClosed,
    "bad_attempt_token": BadAttemptToken,
    "outcome_conflict": OutcomeConflict,
    "outcome_not_allowed": OutcomeNotAllowed,
    "stale_decision": StaleDecision,
    "invalid_finish": InvalidFinish,
    "invalid": Invalid,
    "invalid_json": Invalid,
    "schema_violation": Invalid,
    "idempotency_key_invalid": Invalid,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "forbidden_role": Forbidden,
    "agent_not_bound": Forbidden,
    "not_found": NotFound,
    "route_not_found": NotFound,
    "conflict": Conflict,
    "idempotency_key_reused": IdempotencyKeyReused,
    "request_in_progress": RequestInProgress,
    "rate_limited": RateLimited,
    "too_many_pending_approvals": RateLimited,
}


def error_class(code: str, status: Optional[int]) -> Type[LedgerError]:
    """The class that stands for a problem ``code`` (by ``status`` when the code is unknown)."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls
    if status is None:
        return LedgerError
    if status >= 500:
        return ServerError
    return {
        400: Invalid,
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        409: Conflict,
        429: RateLimited,
    }.get(status, LedgerError)


def from_problem(status: int, body: Dict[str, Any], retry_after: Optional[float] = None) -> LedgerError:
    """The error a problem document stands for."""
    code = str(body.get("code") or "")
    cls = error_class(code, status)
    action = body.get("action")
    recorded = body.get("recorded")
    errors = body.get("errors")
    return cls(
        str(body.get("detail") or body.get("title") or "status %d" % status),
        status=status,
        code=code,
        title=str(body.get("title") or ""),
        instance=str(body.get("instance") or ""),
        action=action if isinstance(action, dict) else None,
        recorded=recorded if isinstance(recorded, dict) else None,
        stop_reason=str(body.get("stop_reason") or ""),
        errors=errors if isinstance(errors, list) else None,
        retry_after=retry_after,
        body=body,
    )
