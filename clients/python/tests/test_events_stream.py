"""The event stream's reading and resuming, against a stream that breaks on purpose.

The real server rarely drops a stream mid-run, so this test serves one that
does: the first connection ends after two events, and the client must come
back with ``Last-Event-ID`` and read on from the third.
"""

import json
import os
import socket
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))

from ledger_client import Client, TransportError  # noqa: E402


def frame(seq: int, typ: str, data: dict) -> bytes:
    return ("id: %d\nevent: %s\ndata: %s\n\n" % (seq, typ, json.dumps(data))).encode()


class BreakingStream(BaseHTTPRequestHandler):
    """Events 1–2, then the connection drops; from Last-Event-ID 2 on, event 3 (terminal)."""

    last_ids: List[Optional[str]] = []
    auth: List[Optional[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/runs/run_1":
            body = json.dumps({"id": "run_1", "state": "running"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path != "/v1/runs/run_1/events":
            self.send_response(404)
            self.send_header("Content-Type", "application/problem+json")
            body = json.dumps({"type": "about:blank", "title": "Not Found", "status": 404, "code": "not_found",
                               "detail": "no such run"}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        last = self.headers.get("Last-Event-ID")
        BreakingStream.last_ids.append(last)
        BreakingStream.auth.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        if last is None:
            self.wfile.write(b": keep-alive comment\n\n")
            self.wfile.write(frame(1, "run.running", {"seq": 1}))
            # A data field over two lines is one value, joined by a newline.
            self.wfile.write(b"id: 2\nevent: action.approved\ndata: {\"seq\":\ndata:  2}\n\n")
            self.wfile.flush()
            return  # the stream breaks before the run ended
        self.wfile.write(frame(3, "run.completed", {"seq": 3}))
        self.wfile.write(frame(4, "never.read", {"seq": 4}))
        self.wfile.flush()


class EventStreamTest(unittest.TestCase):
    def setUp(self) -> None:
        BreakingStream.last_ids = []
        BreakingStream.auth = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), BreakingStream)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def tearDown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def test_a_broken_stream_resumes_after_the_last_event(self) -> None:
        events = list(Client(self.url, token="lgr_test").events("run_1"))
        self.assertEqual([(e.id, e.type) for e in events], [(1, "run.running"), (2, "action.approved"), (3, "run.completed")])
        self.assertEqual(events[1].data, {"seq": 2})
        self.assertEqual(BreakingStream.last_ids, [None, "2"])
        self.assertEqual(BreakingStream.auth, ["Bearer lgr_test", "Bearer lgr_test"])

    def test_without_reconnect_the_first_connection_is_all(self) -> None:
        events = list(Client(self.url).events("run_1", reconnect=False))
        self.assertEqual([e.id for e in events], [1, 2])

    def test_a_resumed_stream_starts_after_the_given_id(self) -> None:
        events = list(Client(self.url).events("run_1", last_event_id=2))
        self.assertEqual([e.id for e in events], [3])

    def test_a_problem_document_raises(self) -> None:
        from ledger_client import NotFound

        with self.assertRaises(NotFound):
            list(Client(self.url).events("run_2"))

    def test_an_unreachable_server_raises_a_transport_error(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        c = Client("http://127.0.0.1:%d" % port, retries=1)
        with self.assertRaises(TransportError):
            list(c.events("run_1"))
        with self.assertRaises(TransportError):
            c.get_run("run_1")


if __name__ == "__main__":
    unittest.main()
