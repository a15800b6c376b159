"""The run's event stream (Server-Sent Events), read with http.client."""

import http.client
import json
import socket
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

from .errors import TransportError, from_problem
from .models import TERMINAL_RUN_STATES, Event

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

#: Event types that end a run's stream.
TERMINAL_EVENT_TYPES = tuple("run." + s for s in TERMINAL_RUN_STATES)

#: How long a stream may stay silent before the client reconnects, in seconds.
IDLE_TIMEOUT_S = 90.0


def _connect(client: "Client", path: str, last_event_id: Optional[int]) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    u = urllib.parse.urlsplit(client.base_url)
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=IDLE_TIMEOUT_S)
    else:
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=IDLE_TIMEOUT_S)
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache", "User-Agent": client.user_agent}
    if client.token:
        headers["Authorization"] = "Bearer " + client.token
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    try:
        conn.request("GET", (u.path.rstrip("/") or "") + path, headers=headers)
        resp = conn.getresponse()
    except BaseException:
        conn.close()
        raise
    if resp.status != 200:
        raw = resp.read()
        conn.close()
        try:
            body: Dict[str, Any] = json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError:
            body = {"detail": raw[:200].decode("utf-8", "replace")}
        raise from_problem(resp.status, body if isinstance(body, dict) else {})
    return conn, resp


def _read(resp: http.client.HTTPResponse) -> Iterator[Event]:
    """The events of one connection, per the SSE format: fields up to a blank line."""
    data_lines = []
    ev_type = ""
    ev_id: Optional[str] = None
    while True:
        line = resp.readline()
        if not line:
            return  # the server closed the stream
        text = line.decode("utf-8").rstrip("\r\n")
        if text == "":
            if data_lines:
                raw = "\n".join(data_lines)
                try:
                    data: Any = json.loads(raw)
                except ValueError:
                    data = raw
                seq = int(ev_id) if ev_id is not None and ev_id.isdigit() else 0
                yield Event(seq, ev_type or "message", data)
            data_lines, ev_type, ev_id = [], "", None
            continue
        if text.startswith(":"):
            continue  # a comment: the server keeps the connection alive
        name, _, value = text.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data_lines.append(value)
        elif name == "event":
            ev_type = value
        elif name == "id":
            ev_id = value


def stream(client: "Client", run_id: str, last_event_id: Optional[int] = None, reconnect: bool = True) -> Iterator[Event]:
    """The events of run ``run_id`` after ``last_event_id``, resuming a broken stream.

    The generator ends after the run's terminal event, or, with
    ``reconnect=False``, when the first connection ends.
    """
    path = "/v1/runs/" + urllib.parse.quote(run_id, safe="") + "/events"
    failures = 0
    while True:
        got = False
        try:
            conn, resp = _connect(client, path, last_event_id)
            try:
                for ev in _read(resp):
                    if ev.id and last_event_id is not None and ev.id <= last_event_id:
                        continue  # seen already: a server that resumed too early
                    got = True
                    failures = 0
                    if ev.id:
                        last_event_id = ev.id
                    yield ev
                    if ev.type in TERMINAL_EVENT_TYPES:
                        return
            finally:
                resp.close()
                conn.close()
        except (OSError, http.client.HTTPException, socket.timeout) as e:
            failures += 1
            if not reconnect or failures > client.retries:
                raise TransportError("events of %s: %s" % (run_id, e)) from e
            time.sleep(min(0.2 * (2 ** (failures - 1)), 2.0))
            continue
        if not reconnect:
            return
        if not got:
            # A stream that ended without an event: the run may have ended
            # before the event we resumed after was its last.
            state = str(client.get_run(run_id).get("state", ""))
            if state in TERMINAL_RUN_STATES:
                return
            failures += 1
            if failures > client.retries + 5:
                raise TransportError("events of %s: the stream keeps ending without events" % run_id)
            time.sleep(min(0.2 * failures, 2.0))
