"""The HTTP client of the ledger's API and of its agent protocol."""

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .errors import Denied, Expired, NotExecuted, TransportError, from_problem
from .models import UNDECIDED_STATES, Action, BegunAttempt, Completed, Event, Heartbeat, Next
from . import events as _events

if TYPE_CHECKING:  # pragma: no cover
    from .run import Run

#: Longest wait of one long poll the server honours, in seconds.
MAX_WAIT_S = 60

#: The statuses after which a request that is safe to send again is sent
#: again: the server failed (its store, say) or was overloaded, or a proxy
#: in front of it did, and nothing says the request was refused.
RETRIED_STATUSES = frozenset((429, 500, 502, 503, 504))


class Response:
    """One answer: its status, headers (lower-case names) and decoded JSON body."""

    def __init__(self, status: int, headers: Dict[str, str], body: Any) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def replayed(self) -> bool:
        """Whether the server answered a replay of an earlier request (``Idempotent-Replayed``)."""
        return self.headers.get("idempotent-replayed", "").lower() == "true"


class Client:
    """A client of one ledger server.

    ``base_url`` is the server's root (``http://127.0.0.1:8080``); ``token`` its
    bearer token (``None`` in dev mode). ``timeout`` bounds each request, in
    seconds (a long poll gets its wait on top). Requests that are safe to send
    again — reads, writes with an idempotency key (start a run, propose,
    begin), and the writes the server answers the same when they come again
    (complete, heartbeat, finish) — are sent again up to ``retries`` times
    when the connection fails (refused, reset, no answer within ``timeout``)
    or the server answers 500, 502, 503, 504, 429 or ``request_in_progress``:
    after ``Retry-After`` when the answer gives one, else after 0.2 s, 0.4 s,
    0.8 s … (at most 2 s). Any other answer (a 409 ``attempt_closed`` or
    ``outcome_conflict``, say) is raised at once, and a request that is not
    safe to send again (abandon, observe, approve …) is sent once.

    One client may be shared by threads: each request opens its own
    connection. It remembers the attempts it holds (begun and not yet
    completed here), so :meth:`Run.resume` leaves them alone.
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        timeout: float = 10.0,
        retries: int = 3,
        user_agent: str = "ledger-client-python/0.1",
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://, not %r" % base_url)
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.user_agent = user_agent
        self._held: Dict[str, float] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ HTTP

    def _headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {"Accept": "application/json, application/problem+json", "User-Agent": self.user_agent}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if extra:
            h.update(extra)
        return h

    def url(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        """The absolute URL of ``path`` with ``query``."""
        u = self.base_url + path
        if query:
            u += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return u

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
        idempotency_key: Optional[str] = None,
        timeout: Optional[float] = None,
        expect: Tuple[int, ...] = (200, 201, 202),
        replayable: bool = False,
    ) -> Response:
        """Send one request and decode its JSON answer.

        A problem document raises the :class:`LedgerError` its code names.
        ``body`` (any JSON value) is sent as ``application/json``.
        ``replayable`` says that the server answers this request the same
        when it comes again, so that it is retried as a read is (see
        :class:`Client`); so is a request with an ``idempotency_key``.
        """
        hdrs = self._headers(headers)
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        if idempotency_key is not None:
            hdrs["Idempotency-Key"] = idempotency_key
        safe = method in ("GET", "HEAD") or idempotency_key is not None or replayable
        url = self.url(path, query)
        limit = self.timeout if timeout is None else timeout
        tries = 0
        while True:
            tries += 1
            req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
            try:
                with urllib.request.urlopen(req, timeout=limit) as resp:
                    status = resp.status
                    rh = {k.lower(): v for k, v in resp.headers.items()}
                    raw = resp.read()
            except urllib.error.HTTPError as e:
                status = e.code
                rh = {k.lower(): v for k, v in (e.headers or {}).items()}
                try:
                    raw = e.read()
                finally:
                    e.close()
            except (urllib.error.URLError, HTTPException, ConnectionError, socket.timeout, OSError) as e:
                if safe and tries <= self.retries:
                    time.sleep(_backoff(tries))
                    continue
                raise TransportError("%s %s: %s" % (method, path, e)) from e
            decoded = _decode(raw, rh.get("content-type", ""), method, path, status)
            if status in expect:
                return Response(status, rh, decoded)
            retry_after = _retry_after(rh.get("retry-after"))
            err = from_problem(status, decoded if isinstance(decoded, dict) else {}, retry_after)
            retryable = status in RETRIED_STATUSES or err.code == "request_in_progress"
            if safe and retryable and tries <= self.retries:
                time.sleep(min(retry_after, 5.0) if retry_after is not None else _backoff(tries))
                continue
            raise err

    # ------------------------------------------------------------------ runs

    def start_run(
        self,
        agent: str,
        input: Any,
        key: str,
        budgets: Optional[Mapping[str, int]] = None,
    ) -> "Run":
        """Submit a run of ``agent`` with ``input`` under the idempotency key ``key``.

        Sending it again with the same key and body gives the same run, never
        a second one: keep the key until you have the answer.
        """
        from .run import Run

        body: Dict[str, Any] = {"agent": agent, "input": input}
        if budgets:
            body["budgets"] = dict(budgets)
        r = self.request("POST", "/v1/runs", body, idempotency_key=key, expect=(201,))
        return Run(self, r.body, replayed=r.replayed)

    def run(self, run_id: str) -> "Run":
        """A handle on an existing run, read from the server."""
        from .run import Run

        return Run(self, self.get_run(run_id))

    def get_run(self, run_id: str) -> Dict[str, Any]:
        """``GET /v1/runs/{run_id}``: the run with its actions."""
        return self.request("GET", "/v1/runs/" + _seg(run_id)).body

    def timeline(self, run_id: str) -> Dict[str, Any]:
        """``GET /v1/runs/{run_id}/timeline``: the run's events and the chain's verdict."""
        return self.request("GET", "/v1/runs/" + _seg(run_id) + "/timeline").body

    def cancel_run(self, run_id: str, reason: Optional[str] = None) -> Dict[str, Any]:
        """``POST /v1/runs/{run_id}/cancel``: request the run's cancellation."""
        body = {"reason": reason} if reason else {}
        return self.request("POST", "/v1/runs/" + _seg(run_id) + "/cancel", body, expect=(202,)).body

    # --------------------------------------------------------------- actions

    def propose(
        self,
        run_id: str,
        tool: str,
        arguments: Any,
        step_key: str,
        usage: Optional[Mapping[str, int]] = None,
        supersedes: Optional[str] = None,
    ) -> Action:
        """``POST /v1/runs/{run_id}/actions``: propose one tool call under ``step_key``."""
        body: Dict[str, Any] = {"tool": tool, "arguments": arguments}
        if usage is not None:
            body["usage"] = dict(usage)
        if supersedes:
            body["supersedes"] = supersedes
        r = self.request("POST", "/v1/runs/" + _seg(run_id) + "/actions", body, idempotency_key=step_key, expect=(201,))
        return Action.from_json(r.body, replayed=r.replayed)

    def get_action(self, action_id: str, version: Optional[int] = None, wait: Optional[float] = None) -> Action:
        """``GET /v1/actions/{action_id}``; with ``wait`` and ``version``, one long poll."""
        query: Dict[str, Any] = {}
        timeout = None
        if wait is not None:
            wait = max(0.0, min(float(wait), MAX_WAIT_S))
            query["wait"] = "%gs" % wait
            timeout = self.timeout + wait
        if version is not None:
            query["version"] = str(version)
        r = self.request("GET", "/v1/actions/" + _seg(action_id), query=query or None, timeout=timeout)
        return Action.from_json(r.body)

    def wait_action(
        self,
        action_id: str,
        version: int,
        wait: float = 30,
        timeout: Optional[float] = None,
    ) -> Action:
        """Long-poll the action until a person or a rule has decided it.

        ``version`` is the version last seen; each poll waits up to ``wait``
        seconds. ``timeout`` bounds the whole wait (``None``: until decided);
        past it the action is answered as it stands, still undecided.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            w = wait
            if deadline is not None:
                w = max(0.0, min(w, deadline - time.monotonic()))
            a = self.get_action(action_id, version=version, wait=w)
            if a.state not in UNDECIDED_STATES:
                return a
            version = a.version
            if deadline is not None and time.monotonic() >= deadline:
                return a

    def await_decision(self, action: Action, wait: float = 30, timeout: Optional[float] = None) -> Action:
        """The action once approved; raises :class:`Denied`, :class:`Expired` or :class:`NotExecuted` otherwise."""
        a = action
        if not a.decided:
            a = self.wait_action(a.id, a.version, wait=wait, timeout=timeout)
        if a.state in UNDECIDED_STATES:
            raise NotExecuted("action %s is still %s after the wait" % (a.id, a.state), code="not_decided", action=a.raw)
        if a.state == "denied":
            raise Denied("action %s was denied%s" % (a.id, _why(a)), code="denied", action=a.raw)
        if a.state == "expired":
            raise Expired("action %s expired before anyone decided" % a.id, code="expired", action=a.raw)
        if a.state in ("cancelled", "superseded"):
            raise NotExecuted("action %s was %s" % (a.id, a.state), code=a.state, action=a.raw)
        return a

    def approve(self, action_id: str, action_digest: str, reason: Optional[str] = None) -> Dict[str, Any]:
        """``POST /v1/actions/{action_id}/approve`` (role approver): approve exactly this digest."""
        return self._decide("approve", action_id, action_digest, reason)

    def deny(self, action_id: str, action_digest: str, reason: Optional[str] = None) -> Dict[str, Any]:
        """``POST /v1/actions/{action_id}/deny`` (role approver)."""
        return self._decide("deny", action_id, action_digest, reason)

    def _decide(self, verb: str, action_id: str, digest: str, reason: Optional[str]) -> Dict[str, Any]:
        body: Dict[str, Any] = {"action_digest": digest}
        if reason:
            body["reason"] = reason
        return self.request("POST", "/v1/actions/" + _seg(action_id) + "/" + verb, body).body

    def resolve(self, action_id: str, outcome: str, note: Optional[str] = None) -> Dict[str, Any]:
        """``POST /v1/actions/{action_id}/resolve`` (role approver): settle an action in review."""
        body: Dict[str, Any] = {"outcome": outcome}
        if note:
            body["note"] = note
        return self.request("POST", "/v1/actions/" + _seg(action_id) + "/resolve", body).body

    def approvals(self, state: str = "pending", limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """``GET /v1/approvals``: the first page of approvals in ``state``."""
        q: Dict[str, Any] = {"state": state}
        if limit is not None:
            q["limit"] = str(limit)
        return list(self.request("GET", "/v1/approvals", query=q).body.get("approvals") or [])

    # -------------------------------------------------------------- attempts

    def begin(self, action_id: str, key: str) -> BegunAttempt:
        """``POST /v1/actions/{action_id}/attempts``: begin an attempt, durably, under ``key``.

        A replay of the same key answers the same attempt and token.
        """
        r = self.request("POST", "/v1/actions/" + _seg(action_id) + "/attempts", {}, idempotency_key=key, expect=(200, 201))
        att = BegunAttempt.from_json(r.body, replayed=r.replayed)
        self._hold(att.id)
        return att

    def heartbeat(self, attempt_id: str, token: str, progress: Any = None, retry: bool = True) -> Heartbeat:
        """``POST /v1/attempts/{attempt_id}/heartbeat``: renew the lease.

        A heartbeat renews the lease from the server's clock, so one sent
        again renews it again, to the same end: it is retried as a read is
        (see :class:`Client`). ``retry=False`` sends it once, as the
        heartbeats of :meth:`Run.call` are: the next beat is their retry,
        and the call's end never waits for a backoff.
        """
        body: Dict[str, Any] = {"attempt_token": token}
        if progress is not None:
            body["progress"] = progress
        b = self.request("POST", "/v1/attempts/" + _seg(attempt_id) + "/heartbeat", body, replayable=retry).body
        return Heartbeat(float(b.get("lease_remaining_s", 0) or 0), bool(b.get("cancel_requested", False)))

    def complete(
        self,
        attempt_id: str,
        token: str,
        status: str,
        effect: Optional[str] = None,
        output: Any = None,
        error: Optional[Mapping[str, str]] = None,
    ) -> Completed:
        """``POST /v1/attempts/{attempt_id}/complete``: report what the call did.

        Sending the same outcome again answers the same, so it is retried as
        a read is (see :class:`Client`): a complete whose answer was lost is
        recorded once. ``attempt_closed`` and ``outcome_conflict`` are raised
        at once.
        """
        body: Dict[str, Any] = {"attempt_token": token, "status": status}
        if effect is not None:
            body["effect"] = effect
        if output is not None:
            body["output"] = output
        if error is not None:
            body["error"] = dict(error)
        try:
            b = self.request("POST", "/v1/attempts/" + _seg(attempt_id) + "/complete", body, replayable=True).body
        finally:
            self._release(attempt_id)
        return Completed(dict(b.get("attempt") or {}), Action.from_json(b.get("action") or {}), b)

    def abandon(self, attempt_id: str, reason: Optional[str] = None) -> Completed:
        """``POST /v1/attempts/{attempt_id}/abandon``: "I lost this call"; recovery decides."""
        body = {"reason": reason} if reason else {}
        b = self.request("POST", "/v1/attempts/" + _seg(attempt_id) + "/abandon", body).body
        self._release(attempt_id)
        return Completed(dict(b.get("attempt") or {}), Action.from_json(b.get("action") or {}), b)

    def observe(
        self,
        attempt_id: str,
        decision_id: str,
        kind: str,
        effect: Optional[str] = None,
        confirmed: Optional[bool] = None,
        detail: Any = None,
        error: Optional[Mapping[str, str]] = None,
        run_id: str = "",
    ) -> Next:
        """``POST /v1/attempts/{attempt_id}/observations``: answer a ``query`` or ``cancel`` directive.

        Returns what ``/next`` says now.
        """
        body: Dict[str, Any] = {"decision_id": decision_id, "kind": kind}
        if effect is not None:
            body["effect"] = effect
        if confirmed is not None:
            body["confirmed"] = confirmed
        if detail is not None:
            body["detail"] = detail
        if error is not None:
            body["error"] = dict(error)
        b = self.request("POST", "/v1/attempts/" + _seg(attempt_id) + "/observations", body, expect=(200, 201)).body
        return Next.from_json({"directives": b.get("next") or [], "run_id": run_id}, run_id=run_id)

    def next(self, run_id: str) -> Next:
        """``GET /v1/runs/{run_id}/next``: what the agent must do now."""
        return Next.from_json(self.request("GET", "/v1/runs/" + _seg(run_id) + "/next").body, run_id=run_id)

    def finish(
        self,
        run_id: str,
        outcome: str,
        output: Any = None,
        stop_reason: Optional[str] = None,
        usage: Optional[Mapping[str, int]] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/runs/{run_id}/finish``: the agent's loop is done (``completed`` or ``failed``).

        A replay of the same finish answers the same, so it is retried as a
        read is (see :class:`Client`).
        """
        body: Dict[str, Any] = {"outcome": outcome}
        if output is not None:
            body["output"] = output
        if stop_reason:
            body["stop_reason"] = stop_reason
        if usage is not None:
            body["usage"] = dict(usage)
        return self.request("POST", "/v1/runs/" + _seg(run_id) + "/finish", body, replayable=True).body

    def events(self, run_id: str, last_event_id: Optional[int] = None, reconnect: bool = True) -> Iterator[Event]:
        """``GET /v1/runs/{run_id}/events``: the run's events, oldest first, as they happen.

        A broken stream is resumed after the last event seen
        (``Last-Event-ID``); the generator ends after the run's terminal
        event.
        """
        return _events.stream(self, run_id, last_event_id, reconnect)

    # --------------------------------------------------------------- helpers

    def _hold(self, attempt_id: str) -> None:
        with self._lock:
            self._held[attempt_id] = time.monotonic()

    def _release(self, attempt_id: str) -> None:
        with self._lock:
            self._held.pop(attempt_id, None)

    def holds(self, attempt_id: str) -> bool:
        """Whether this client began the attempt and has not completed or abandoned it."""
        with self._lock:
            return attempt_id in self._held


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _why(a: Action) -> str:
    for p in reversed(a.approvals):
        if p.get("state") == "denied" and p.get("reason"):
            return ": " + str(p["reason"])
    reason = a.gate.get("reason")
    return ": " + str(reason) if reason else ""


def _backoff(tries: int) -> float:
    """The wait before sending a request again after its ``tries``-th try failed."""
    return min(0.2 * (2 ** (tries - 1)), 2.0)


def _retry_after(v: Optional[str]) -> Optional[float]:
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        return None


def _decode(raw: bytes, ctype: str, method: str, path: str, status: int) -> Any:
    if not raw or method == "HEAD":
        return {}
    if "json" not in ctype:
        if status >= 400:
            return {"detail": raw[:200].decode("utf-8", "replace")}
        raise TransportError("%s %s: answer of type %r, not JSON" % (method, path, ctype), status=status)
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise TransportError("%s %s: answer is not JSON: %s" % (method, path, e), status=status) from e


__all__ = ["Client", "Response", "MAX_WAIT_S"]
