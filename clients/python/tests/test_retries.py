"""What the client sends again, and what it sends once, when an answer is lost.

The real server (bin/ledger serve) sits behind a proxy of the test's own that
fails chosen requests: it answers 502 itself, or passes the request on and
then loses the server's answer (a 502, or the connection dropped), as a load
balancer or a restarting server does. A complete, a heartbeat and a finish
answer a replay the same, so the client sends them again and the server
records each once; an abandon or an observation is sent once.
"""

import http.client
import json
import os
import sys
import threading
import unittest
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import AGENT, LedgerServer  # noqa: E402

from ledger_client import AttemptClosed, Client, LedgerError, OutcomeConflict  # noqa: E402

SERVER: Optional[LedgerServer] = None
AUDITOR = ""  # a token that may read timelines

#: What a read's succeeded outcome records, once.
RECORDED_ONCE = ["attempt.succeeded", "observation.recorded", "attempt.effect_not_happened", "action.succeeded"]

#: Hop-by-hop headers, which a proxy does not pass on.
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host",
       "content-length"}


class FaultyProxy:
    """An HTTP proxy in front of ``upstream`` that fails the requests it is told to.

    ``fail(route, *faults)`` queues faults for the next requests whose last
    path segment is ``route`` (``complete``, ``heartbeat`` …), one a request:

    - ``"502"``: answer 502 (not JSON) without passing the request on;
    - ``"500"``: answer the server's own 500 problem without passing it on
      (a store that failed before it wrote);
    - ``"502-after"``: pass it on, then answer 502 instead of the answer;
    - ``"drop-after"``: pass it on, then close the connection unanswered.

    ``sent[route]`` counts the requests the proxy got for each route.
    """

    def __init__(self, upstream: str) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.faults: Dict[str, List[str]] = {}
        self.sent: Dict[str, int] = {}
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                route = urllib.parse.urlsplit(self.path).path.rstrip("/").rsplit("/", 1)[-1]
                fault = proxy._take(route)
                if fault == "502":
                    self.answer(502, [("Content-Type", "text/html")], b"<html>502 Bad Gateway</html>")
                    return
                if fault == "500":
                    problem = {"type": "about:blank", "title": "Internal error", "status": 500, "code": "internal",
                               "detail": "a session of the store ended"}
                    self.answer(500, [("Content-Type", "application/problem+json")], json.dumps(problem).encode())
                    return
                status, headers, answer = proxy._forward(self.command, self.path, self.headers, body)
                if fault == "502-after":
                    self.answer(502, [("Content-Type", "text/plain")], b"bad gateway")
                elif fault == "drop-after":
                    self.close_connection = True
                else:
                    self.answer(status, headers, answer)

            def answer(self, status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            do_GET = do_POST = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail(self, route: str, *faults: str) -> None:
        with self.lock:
            self.faults.setdefault(route, []).extend(faults)

    def count(self, route: str) -> int:
        with self.lock:
            return self.sent.get(route, 0)

    def _take(self, route: str) -> str:
        with self.lock:
            self.sent[route] = self.sent.get(route, 0) + 1
            queued = self.faults.get(route) or []
            return queued.pop(0) if queued else ""

    def _forward(self, method: str, path: str, headers: Any, body: Optional[bytes]) -> Tuple[int, List[Tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            hdrs = {k: v for k, v in headers.items() if k.lower() not in HOP}
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP], data
        finally:
            conn.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def setUpModule() -> None:
    global SERVER, AUDITOR
    SERVER = LedgerServer()
    AUDITOR = SERVER.make_token("auditor-1", ["auditor"])
    SERVER.start()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.close()


def key(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class RetryTest(unittest.TestCase):
    def setUp(self) -> None:
        assert SERVER is not None
        self.proxy = FaultyProxy(SERVER.url)
        self.addCleanup(self.proxy.close)
        self.agent = Client(self.proxy.url, token=SERVER.agent_token)
        self.direct = Client(SERVER.url, token=SERVER.agent_token)

    def begun(self, label: str) -> Tuple[Any, Any, Any]:
        """A run of the tests' agent, its first action (a read: approved at once) and an attempt begun on it."""
        run = self.agent.start_run(AGENT, {"task": label}, key=key(label))
        action = self.agent.propose(run.id, "notes.read", {"text": label}, step_key=label + "-1")
        self.assertEqual(action.state, "approved")
        return run, action, self.agent.begin(action.id, key(label + "-begin"))

    def completions(self, run_id: str) -> List[str]:
        """The types of the run's events since its first attempt started: what completing it recorded."""
        assert SERVER is not None
        types = [str(e.get("type")) for e in Client(SERVER.url, token=AUDITOR).timeline(run_id).get("events") or []]
        return types[types.index("attempt.started") + 1:]

    def test_a_complete_whose_answer_was_lost_is_sent_again_and_recorded_once(self) -> None:
        # The server records the outcome, the answer is lost twice over;
        # the third answer is the replay's, the same 200.
        self.proxy.fail("complete", "502-after", "drop-after")
        run = self.agent.start_run(AGENT, {"task": "lost"}, key=key("lost"))
        with run.call("notes.read", {"text": "hello"}, step_key="read-1") as call:
            done = call.succeeded({"text": "hello"})
        self.assertEqual(self.proxy.count("complete"), 3)
        self.assertEqual(done.action.state, "succeeded")
        self.assertEqual(done.attempt.get("status"), "succeeded")
        a = self.direct.get_action(done.action.id)
        self.assertEqual([t["status"] for t in a.attempts], ["succeeded"])
        self.assertEqual(self.completions(run.id), RECORDED_ONCE)

    def test_a_complete_the_server_failed_is_sent_again(self) -> None:
        # The store failed before it wrote (a 500), or a proxy answered for
        # the server: nothing was recorded; the next try records it.
        run, _, att = self.begun("failed")
        self.proxy.fail("complete", "500", "502")
        done = self.agent.complete(att.id, att.token, "succeeded", output={"ok": True})
        self.assertEqual(self.proxy.count("complete"), 3)
        self.assertEqual(done.action.state, "succeeded")
        self.assertEqual(self.completions(run.id), RECORDED_ONCE)

    def test_conflicts_are_not_sent_again(self) -> None:
        run, _, att = self.begun("conflict")
        self.agent.complete(att.id, att.token, "succeeded", output={"ok": True})
        with self.assertRaises(OutcomeConflict):
            self.agent.complete(att.id, att.token, "failed", error={"code": "x", "message": "no"})
        self.assertEqual(self.proxy.count("complete"), 2)

        action = self.agent.propose(run.id, "notes.read", {"text": "again"}, step_key="conflict-2")
        att2 = self.agent.begin(action.id, key("conflict-begin-2"))
        self.direct.abandon(att2.id, reason="lost it")
        with self.assertRaises(AttemptClosed):
            self.agent.complete(att2.id, att2.token, "succeeded", output={"ok": True})
        self.assertEqual(self.proxy.count("complete"), 3)

    def test_a_heartbeat_and_a_finish_are_sent_again(self) -> None:
        run, _, att = self.begun("beat")
        self.proxy.fail("heartbeat", "502", "drop-after")
        hb = self.agent.heartbeat(att.id, att.token, progress={"step": 1})
        self.assertGreater(hb.lease_remaining_s, 0)
        self.assertEqual(self.proxy.count("heartbeat"), 3)
        self.agent.complete(att.id, att.token, "succeeded", output={"ok": True})

        self.proxy.fail("finish", "502-after")
        view = self.agent.finish(run.id, "completed", output={"done": True})
        self.assertEqual(view.get("state"), "completed")
        self.assertEqual(self.proxy.count("finish"), 2)

    def test_an_abandon_and_an_observation_are_sent_once(self) -> None:
        _, action, att = self.begun("once")
        self.proxy.fail("abandon", "502")
        with self.assertRaises(LedgerError) as caught:
            self.agent.abandon(att.id, reason="lost it")
        self.assertEqual(caught.exception.status, 502)
        self.assertEqual(self.proxy.count("abandon"), 1)
        self.assertEqual(self.direct.get_action(action.id).state, "running", "the abandon never arrived")

        self.proxy.fail("observations", "502")
        with self.assertRaises(LedgerError):
            self.agent.observe(att.id, "dec_x", "query", effect="happened")
        self.assertEqual(self.proxy.count("observations"), 1)

    def test_retries_give_up(self) -> None:
        _, _, att = self.begun("give-up")
        self.proxy.fail("complete", "502", "502", "502", "502")
        with self.assertRaises(LedgerError) as caught:
            self.agent.complete(att.id, att.token, "succeeded", output={"ok": True})
        self.assertEqual(caught.exception.status, 502)
        self.assertEqual(self.proxy.count("complete"), 1 + self.agent.retries)


if __name__ == "__main__":
    unittest.main()
