"""The ledger's answers, as light read-only objects.

Each keeps the whole JSON it was read from in ``raw``, so a field this
version of the client does not name is still at hand.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

#: Action states in which a person (or a rule) has yet to decide.
UNDECIDED_STATES = ("proposed", "awaiting_approval")

#: Action states that never change again.
TERMINAL_STATES = ("succeeded", "failed", "denied", "expired", "cancelled", "abandoned", "superseded")

#: Action states whose effect is open or in doubt: only recovery moves them on.
IN_DOUBT_STATES = ("running", "uncertain", "needs_review")

#: Run states that never change again.
TERMINAL_RUN_STATES = ("completed", "stopped", "failed")


@dataclass(frozen=True)
class Action:
    """A proposed tool call as the ledger records it.

    ``arguments`` are redacted where the tool marks secrets; the canonical
    arguments to execute come with the attempt (:class:`BegunAttempt`).
    ``replayed`` says the answer was a replay of an earlier proposal.
    """

    id: str
    run_id: str
    tool: str
    state: str
    version: int
    effect: str
    action_digest: str
    dedup_key: str
    arguments: Any
    gate: Dict[str, Any]
    attempts: List[Dict[str, Any]]
    approvals: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(repr=False)
    replayed: bool = False

    @classmethod
    def from_json(cls, body: Dict[str, Any], replayed: bool = False) -> "Action":
        """The action of a JSON object (an answer's ``action``, or the answer itself)."""
        return cls(
            id=str(body.get("id", "")),
            run_id=str(body.get("run_id", "")),
            tool=str(body.get("tool", "")),
            state=str(body.get("state", "")),
            version=int(body.get("version", 0) or 0),
            effect=str(body.get("effect", "")),
            action_digest=str(body.get("action_digest", "")),
            dedup_key=str(body.get("dedup_key", "")),
            arguments=body.get("arguments"),
            gate=dict(body.get("gate") or {}),
            attempts=list(body.get("attempts") or []),
            approvals=list(body.get("approvals") or []),
            raw=body,
            replayed=replayed,
        )

    @property
    def decided(self) -> bool:
        """Whether a person or a rule has decided (the action is past approval)."""
        return self.state not in UNDECIDED_STATES

    @property
    def terminal(self) -> bool:
        """Whether the action will never change again."""
        return self.state in TERMINAL_STATES

    @property
    def pending_approval(self) -> Optional[Dict[str, Any]]:
        """The approval the action waits for, if any."""
        for a in self.approvals:
            if a.get("state") == "pending":
                return a
        return None


@dataclass(frozen=True)
class BegunAttempt:
    """An attempt begun: durable in the ledger before this answer came.

    Execute exactly ``arguments`` (the canonical, approved ones) and give the
    tool ``dedup_key``. ``token`` is the attempt's secret: heartbeats and the
    outcome present it.
    """

    id: str
    attempt_no: int
    token: str
    dedup_key: str
    arguments: Any
    action_digest: str
    lease_remaining_s: float
    raw: Dict[str, Any] = field(repr=False)
    replayed: bool = False

    @classmethod
    def from_json(cls, body: Dict[str, Any], replayed: bool = False) -> "BegunAttempt":
        """The attempt of a begin's answer."""
        att = body.get("attempt") or {}
        return cls(
            id=str(att.get("id", "")),
            attempt_no=int(att.get("attempt_no", 0) or 0),
            token=str(body.get("attempt_token", "")),
            dedup_key=str(body.get("dedup_key", "")),
            arguments=body.get("arguments"),
            action_digest=str(body.get("action_digest", "")),
            lease_remaining_s=float(body.get("lease_remaining_s", 0) or 0),
            raw=body,
            replayed=replayed,
        )


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat's answer: the lease left, and whether the run's cancel was accepted."""

    lease_remaining_s: float
    cancel_requested: bool


@dataclass(frozen=True)
class Directive:
    """One thing ``/next`` tells the agent to do, with the decision it rests on."""

    directive: str
    decision_id: str
    action_id: str
    attempt_id: str
    tool: str
    dedup_key: str
    lease_remaining_s: Optional[float]
    stop_reason: str
    rationale: str
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: Dict[str, Any]) -> "Directive":
        """The directive of a JSON object."""
        lease = body.get("lease_remaining_s")
        return cls(
            directive=str(body.get("directive", "")),
            decision_id=str(body.get("decision_id", "")),
            action_id=str(body.get("action_id", "") or ""),
            attempt_id=str(body.get("attempt_id", "") or ""),
            tool=str(body.get("tool", "") or ""),
            dedup_key=str(body.get("dedup_key", "") or ""),
            lease_remaining_s=None if lease is None else float(lease),
            stop_reason=str(body.get("stop_reason", "") or ""),
            rationale=str(body.get("rationale", "") or ""),
            raw=body,
        )


@dataclass(frozen=True)
class Next:
    """What ``/next`` says: the run's state and one directive per open action."""

    run_id: str
    run_state: str
    directives: List[Directive]
    raw: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: Dict[str, Any], run_id: str = "") -> "Next":
        """The answer of ``/next`` (or the ``next`` of an observation's answer)."""
        return cls(
            run_id=str(body.get("run_id", run_id) or run_id),
            run_state=str(body.get("run_state", "") or ""),
            directives=[Directive.from_json(d) for d in body.get("directives") or []],
            raw=body,
        )

    def kinds(self) -> List[str]:
        """The directives' kinds, in order."""
        return [d.directive for d in self.directives]


@dataclass(frozen=True)
class Event:
    """One event of a run's stream: ``id`` is its ``seq``, ``type`` e.g. ``action.approved``."""

    id: int
    type: str
    data: Any


@dataclass(frozen=True)
class Completed:
    """A complete's answer: the attempt and the action after it."""

    attempt: Dict[str, Any]
    action: Action
    raw: Dict[str, Any] = field(repr=False)
