"""ledger_client: the Python client of the ledger's agent protocol.

An agent of your own keeps its loop, its model and its tools, and puts each
tool call through the ledger: the ledger decides (rules, approvals, budgets),
records every attempt durably before the call, and after a crash tells the
agent what is safe to do. The protocol is described in the repository's
docs/agent-protocol.md.

    from ledger_client import Client

    client = Client("http://127.0.0.1:8080", token="lgr_...")
    run = client.start_run("my-agent", {"task": "pay the invoice"}, key="invoice-42")
    with run.call("payments.send", {"to": "acct_1", "cents": 500}, step_key="pay-1") as call:
        call.succeeded(pay(call.arguments, idempotency_key=call.dedup_key))
    run.finish("completed")

Standard library only; Python 3.9 or later.
"""

from .client import MAX_WAIT_S, Client, Response
from .errors import (
    ActionInDoubt,
    AlreadySettled,
    ApprovalStale,
    AttemptClosed,
    AttemptOpen,
    BadAttemptToken,
    Conflict,
    Denied,
    Expired,
    Forbidden,
    IdempotencyKeyReused,
    Invalid,
    InvalidArguments,
    InvalidFinish,
    LedgerError,
    NeedsRecovery,
    NotApproved,
    NotClientDriven,
    NotExecuted,
    NotFound,
    OutcomeConflict,
    OutcomeNotAllowed,
    OutcomeNotReported,
    RateLimited,
    RequestInProgress,
    RunCancelled,
    RunStopped,
    ServerError,
    StaleDecision,
    StepKeyReused,
    ToolNotAllowed,
    TransportError,
    Unauthorized,
    UnknownTool,
)
from .models import Action, BegunAttempt, Completed, Directive, Event, Heartbeat, Next
from .run import Run, ToolCall, ToolHandler, begin_key

__version__ = "0.1.0"

__all__ = [
    "MAX_WAIT_S",
    "Action",
    "ActionInDoubt",
    "AlreadySettled",
    "ApprovalStale",
    "AttemptClosed",
    "AttemptOpen",
    "BadAttemptToken",
    "BegunAttempt",
    "Client",
    "Completed",
    "Conflict",
    "Denied",
    "Directive",
    "Event",
    "Expired",
    "Forbidden",
    "Heartbeat",
    "IdempotencyKeyReused",
    "Invalid",
    "InvalidArguments",
    "InvalidFinish",
    "LedgerError",
    "NeedsRecovery",
    "Next",
    "NotApproved",
    "NotClientDriven",
    "NotExecuted",
    "NotFound",
    "OutcomeConflict",
    "OutcomeNotAllowed",
    "OutcomeNotReported",
    "RateLimited",
    "RequestInProgress",
    "Response",
    "Run",
    "RunCancelled",
    "RunStopped",
    "ServerError",
    "StaleDecision",
    "StepKeyReused",
    "ToolCall",
    "ToolHandler",
    "ToolNotAllowed",
    "TransportError",
    "Unauthorized",
    "UnknownTool",
    "begin_key",
]
