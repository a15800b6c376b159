"""The Python client against the real ledger binary (bin/ledger serve).

Run from clients/python: python3 -m unittest discover (bin/ledger built, or $LEDGER_BIN)
"""

import os
import sys
import threading
import time
import unittest
import uuid
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import AGENT, LedgerServer  # noqa: E402

import ledger_client  # noqa: E402
from ledger_client import (  # noqa: E402
    AttemptClosed,
    Client,
    Denied,
    Forbidden,
    InvalidArguments,
    OutcomeNotReported,
    StepKeyReused,
    Unauthorized,
    UnknownTool,
)

SERVER: Optional[LedgerServer] = None


def setUpModule() -> None:
    global SERVER
    SERVER = LedgerServer().start()


def tearDownModule() -> None:
    if SERVER is not None:
        SERVER.close()


def server() -> LedgerServer:
    assert SERVER is not None
    return SERVER


def key(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class Approver:
    """A person at the approvals page: decides the action once it waits, over HTTP."""

    def __init__(self, decide: str = "approve") -> None:
        self.client = Client(server().url, token=server().approver_token)
        self.decide = decide
        self.decided: List[str] = []
        self.stop = threading.Event()
        self.errors: List[Exception] = []

    def decide_when_pending(self, action_id_of: Callable[[], Optional[str]], timeout: float = 20) -> threading.Thread:
        def work() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not self.stop.wait(0.05):
                try:
                    aid = action_id_of()
                    if aid:
                        a = self.client.get_action(aid)
                        if a.state == "awaiting_approval":
                            getattr(self.client, self.decide)(a.id, a.action_digest, reason="checked by a test")
                            self.decided.append(a.id)
                            return
                except ledger_client.LedgerError as e:
                    self.errors.append(e)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        return t

    def pending_action(self, run_id: str) -> Callable[[], Optional[str]]:
        """The id of the run's action that waits for approval, once there is one."""
        def find() -> Optional[str]:
            for p in self.client.approvals("pending"):
                if p.get("run_id") == run_id:
                    return str(p["action_id"])
            return None
        return find


class Recorder:
    """A tool's hands for resume: answers queries with a fixed effect, counts every call."""

    def __init__(self, effect: str = "happened", confirm: bool = False) -> None:
        self.effect = effect
        self.confirm = confirm
        self.queries: List[str] = []
        self.cancels: List[str] = []
        self.executed: List[Dict[str, Any]] = []

    def query(self, dedup_key: str) -> str:
        self.queries.append(dedup_key)
        return self.effect

    def cancel(self, dedup_key: str) -> bool:
        self.cancels.append(dedup_key)
        return self.confirm

    def execute(self, arguments: Any, dedup_key: str) -> Any:
        self.executed.append({"arguments": arguments, "dedup_key": dedup_key})
        return {"done": dedup_key}


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.agent = Client(server().url, token=server().agent_token)
        self.approver = Approver()
        self.addCleanup(self.approver.stop.set)

    def start(self, label: str) -> ledger_client.Run:
        run = self.agent.start_run(AGENT, {"task": label}, key=key(label))
        self.assertEqual(run.state, "running")
        return run

    def approve_later(self, run: ledger_client.Run) -> threading.Thread:
        return self.approver.decide_when_pending(self.approver.pending_action(run.id))

    # ---------------------------------------------------------------- calls

    def test_read_round_trip(self) -> None:
        run = self.start("read")
        with run.call("notes.read", {"text": "hello"}, step_key="read-1") as call:
            self.assertEqual(call.arguments, {"text": "hello"})
            self.assertTrue(call.dedup_key)
            self.assertFalse(call.cancel_requested)
            done = call.succeeded({"text": "hello"})
        self.assertEqual(done.action.state, "succeeded")
        self.assertEqual(done.attempt.get("status"), "succeeded")
        self.assertEqual(self.approver.decided, [])
        self.assertEqual(run.next().kinds(), ["propose"])
        run.finish("completed", output={"summary": "read one note"})
        self.assertEqual(run.state, "completed")
        self.assertEqual(run.finish("completed", output={"summary": "read one note"}).state, "completed")

    def test_write_approved_over_http_then_executed(self) -> None:
        run = self.start("write")
        effects: List[str] = []
        t = self.approve_later(run)
        with run.call("notes.write", {"text": "pay"}, step_key="write-1", approval_timeout=20) as call:
            self.assertEqual(call.action.state, "approved")
            effects.append(call.dedup_key)
            done = call.succeeded({"id": "note-1"})
        t.join()
        self.assertEqual(len(effects), 1)
        self.assertEqual(done.action.state, "succeeded")
        self.assertEqual(self.approver.decided, [done.action.id])
        a = self.agent.get_action(done.action.id)
        self.assertEqual([p["state"] for p in a.approvals], ["granted"])
        self.assertEqual(a.approvals[0]["decided_by"], "alice")
        self.assertEqual(a.dedup_key, effects[0])
        run.finish("completed")

    def test_denial_raises_denied_and_the_body_never_runs(self) -> None:
        run = self.start("deny")
        self.approver.decide = "deny"
        t = self.approve_later(run)
        ran = []
        with self.assertRaises(Denied) as cm:
            with run.call("notes.write", {"text": "no"}, step_key="deny-1", approval_timeout=20):
                ran.append(True)
        t.join()
        self.assertEqual(ran, [])
        self.assertIsNone(cm.exception.status)
        self.assertEqual(cm.exception.code, "denied")
        assert cm.exception.action is not None
        self.assertEqual(cm.exception.action["state"], "denied")
        self.assertIsInstance(cm.exception, ledger_client.NotExecuted)

    def test_replay_of_a_step_key_gives_the_same_action(self) -> None:
        k = key("replay")
        run = self.agent.start_run(AGENT, {"task": "replay"}, key=k)
        again = self.agent.start_run(AGENT, {"task": "replay"}, key=k)
        self.assertEqual(again.id, run.id)
        self.assertFalse(run.replayed)
        self.assertTrue(again.replayed)
        first = run.propose("notes.read", {"text": "a", "n": 1}, step_key="step-1")
        second = run.propose("notes.read", {"n": 1, "text": "a"}, step_key="step-1")
        self.assertEqual(second.id, first.id)
        self.assertFalse(first.replayed)
        self.assertTrue(second.replayed)
        self.assertEqual(second.dedup_key, first.dedup_key)

    def test_step_key_reused_for_another_body(self) -> None:
        run = self.start("reused")
        first = run.propose("notes.read", {"text": "a"}, step_key="step-1")
        with self.assertRaises(StepKeyReused) as cm:
            run.propose("notes.read", {"text": "b"}, step_key="step-1")
        e = cm.exception
        self.assertEqual((e.status, e.code), (422, "step_key_reused"))
        assert e.action is not None
        self.assertEqual(e.action["id"], first.id)
        self.assertIn("urn:request:", e.instance)

    def test_problem_documents_raise_their_classes(self) -> None:
        run = self.start("problems")
        with self.assertRaises(UnknownTool) as unknown:
            run.propose("no.such", {"text": "a"}, step_key="p-1")
        self.assertEqual(unknown.exception.status, 422)
        with self.assertRaises(InvalidArguments) as invalid:
            run.propose("notes.read", {"n": "three"}, step_key="p-2")
        self.assertTrue(invalid.exception.errors)
        a = run.propose("notes.write", {"text": "x"}, step_key="p-3")
        with self.assertRaises(Forbidden):
            self.agent.approve(a.id, a.action_digest)
        with self.assertRaises(Unauthorized):
            Client(server().url, token="lgr_" + "A" * 43).get_run(run.id)

    def test_a_body_that_raises_reports_unknown_for_a_write(self) -> None:
        run = self.start("raises")
        t = self.approve_later(run)
        box: Dict[str, Any] = {}
        with self.assertRaises(RuntimeError):
            with run.call("notes.write", {"text": "boom"}, step_key="boom-1", approval_timeout=20) as call:
                box["call"] = call
                raise RuntimeError("the tool's connection broke")
        t.join()
        call = box["call"]
        assert call.result is not None
        self.assertEqual(call.result.attempt["status"], "failed")
        self.assertEqual(call.result.attempt["effect"], "unknown")
        self.assertEqual(call.result.attempt["error"]["code"], "RuntimeError")
        self.assertEqual(call.result.action.state, "uncertain")
        # The tool can be queried: recovery asks the agent, never guesses.
        self.assertEqual(run.next().kinds(), ["query"])

    def test_a_read_that_raises_reports_failed_without_an_effect(self) -> None:
        run = self.start("read-raises")
        box: Dict[str, Any] = {}
        with self.assertRaises(ValueError):
            with run.call("notes.read", {"text": "x"}, step_key="rr-1") as call:
                box["call"] = call
                raise ValueError("bad file")
        result = box["call"].result
        self.assertEqual(result.attempt["status"], "failed")
        self.assertEqual(result.action.state, "failed")

    def test_a_body_that_reports_nothing(self) -> None:
        run = self.start("silent")
        with self.assertRaises(OutcomeNotReported):
            with run.call("notes.read", {"text": "x"}, step_key="silent-1"):
                pass
        self.assertEqual(run.next().kinds(), ["propose"])

    # ------------------------------------------------------------- leases

    def test_heartbeats_keep_a_long_call_alive_past_its_lease(self) -> None:
        run = self.start("slow")
        t = self.approve_later(run)
        with run.call("notes.slow", {"text": "slow"}, step_key="slow-1", approval_timeout=20) as call:
            self.assertLessEqual(call.attempt.lease_remaining_s, 1.0)
            time.sleep(3.5)  # three and a half leases
            self.assertFalse(call.lease_lost)
            done = call.succeeded({"ok": True})
        t.join()
        self.assertEqual(done.action.state, "succeeded")

    def test_without_heartbeats_the_lease_lapses(self) -> None:
        run = self.start("lapse")
        t = self.approve_later(run)
        with self.assertRaises(AttemptClosed):
            with run.call("notes.slow", {"text": "slow"}, step_key="lapse-1", approval_timeout=20,
                          heartbeat_interval=60) as call:
                time.sleep(3.5)
                call.succeeded({"ok": True})
        t.join()

    def test_a_heartbeat_tells_the_call_of_the_runs_cancel(self) -> None:
        run = self.start("cancel")
        t = self.approve_later(run)
        with run.call("notes.slow", {"text": "stop me"}, step_key="cancel-1", approval_timeout=20) as call:
            self.assertFalse(call.cancel_requested)
            self.agent.cancel_run(run.id, reason="changed my mind")
            deadline = time.monotonic() + 5
            while not call.cancel_requested and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertTrue(call.cancel_requested)
            done = call.cancelled(effect="not_happened")
        t.join()
        self.assertEqual(done.attempt["status"], "cancelled")
        self.assertEqual(run.next().kinds(), ["stop"])

    # ------------------------------------------------------------ recovery

    def crash_after_begin(self, tool: str, label: str) -> Dict[str, Any]:
        """An agent that begins an attempt and dies: its process state is gone, the attempt open."""
        run = self.start(label)
        t = self.approve_later(run)
        action = run.propose(tool, {"text": label}, step_key=label + "-1")
        crashed = Client(server().url, token=server().agent_token)
        action = crashed.await_decision(action, timeout=20)
        t.join()
        begun = crashed.begin(action.id, ledger_client.begin_key(label, 1))
        del crashed  # the process died with the call in flight
        return {"run_id": run.id, "action_id": action.id, "attempt_id": begun.id, "dedup_key": begun.dedup_key}

    def test_resume_of_a_queryable_write_asks_the_tool(self) -> None:
        lost = self.crash_after_begin("notes.write", "crash-query")
        hands = Recorder(effect="happened")
        restarted = Client(server().url, token=server().agent_token)
        nxt = restarted.run(lost["run_id"]).resume({"notes.write": hands})
        self.assertEqual(nxt.kinds(), ["propose"])
        self.assertEqual(hands.queries, [lost["dedup_key"]])
        self.assertEqual(hands.executed, [])
        a = restarted.get_action(lost["action_id"])
        self.assertEqual(a.state, "succeeded")
        self.assertEqual(len(a.attempts), 1)

    def test_resume_of_a_queryable_write_that_did_not_happen_sends_it_again(self) -> None:
        lost = self.crash_after_begin("notes.write", "crash-nothappened")
        hands = Recorder(effect="not_happened")
        restarted = Client(server().url, token=server().agent_token)
        nxt = restarted.run(lost["run_id"]).resume({"notes.write": hands})
        self.assertEqual(nxt.kinds(), ["propose"])
        self.assertEqual(hands.queries, [lost["dedup_key"]])
        self.assertEqual(hands.executed, [{"arguments": {"text": "crash-nothappened"}, "dedup_key": lost["dedup_key"]}])
        a = restarted.get_action(lost["action_id"])
        self.assertEqual(a.state, "succeeded")
        self.assertEqual(len(a.attempts), 2)

    def test_resume_of_a_dedup_write_resends_under_the_same_key(self) -> None:
        lost = self.crash_after_begin("notes.send", "crash-dedup")
        hands = Recorder()
        restarted = Client(server().url, token=server().agent_token)
        nxt = restarted.run(lost["run_id"]).resume({"notes.send": hands})
        self.assertEqual(nxt.kinds(), ["propose"])
        self.assertEqual(hands.queries, [])
        self.assertEqual(hands.executed, [{"arguments": {"text": "crash-dedup"}, "dedup_key": lost["dedup_key"]}])
        a = restarted.get_action(lost["action_id"])
        self.assertEqual(a.state, "succeeded")
        self.assertEqual([t["status"] for t in a.attempts], ["uncertain", "succeeded"])

    def test_resume_of_a_write_without_guarantees_goes_to_review(self) -> None:
        lost = self.crash_after_begin("notes.plain", "crash-plain")
        hands = Recorder()
        restarted = Client(server().url, token=server().agent_token)
        run = restarted.run(lost["run_id"])
        nxt = run.resume({"notes.plain": hands})
        self.assertEqual(nxt.kinds(), ["review"])
        self.assertEqual((hands.queries, hands.cancels, hands.executed), ([], [], []))
        self.assertEqual(restarted.get_action(lost["action_id"]).state, "needs_review")
        # A person settles it; the agent goes on.
        self.approver.client.resolve(lost["action_id"], "happened", note="seen in the notes file")
        self.assertEqual(run.resume({"notes.plain": hands}).kinds(), ["propose"])

    def test_resume_leaves_an_attempt_this_process_holds(self) -> None:
        run = self.start("held")
        with run.call("notes.read", {"text": "x"}, step_key="held-1") as call:
            nxt = run.resume({})
            self.assertEqual(nxt.kinds(), ["in_flight"])
            self.assertEqual(nxt.directives[0].attempt_id, call.attempt.id)
            call.succeeded({})
        self.assertEqual(run.next().kinds(), ["propose"])

    def test_a_step_in_doubt_is_not_begun_again(self) -> None:
        lost = self.crash_after_begin("notes.write", "crash-again")
        run = self.agent.run(lost["run_id"])
        with self.assertRaises(ledger_client.NeedsRecovery):
            with run.call("notes.write", {"text": "crash-again"}, step_key="crash-again-1"):
                self.fail("the body ran for an attempt in flight")

    # -------------------------------------------------------------- events

    def test_events_stream_live_and_resume_after_an_id(self) -> None:
        run = self.start("events")
        seen: List[ledger_client.Event] = []
        reader = threading.Thread(target=lambda: seen.extend(run.events()), daemon=True)
        reader.start()
        with run.call("notes.read", {"text": "e"}, step_key="ev-1") as call:
            call.succeeded({"text": "e"})
        run.finish("completed")
        reader.join(20)
        self.assertFalse(reader.is_alive(), "the stream did not end after the run's terminal event")
        ids = [e.id for e in seen]
        self.assertEqual(ids, sorted(ids))
        self.assertEqual(len(set(ids)), len(ids))
        types = [e.type for e in seen]
        self.assertEqual(types[-1], "run.completed")
        self.assertIn("action.succeeded", types)
        self.assertTrue(all(isinstance(e.data, dict) for e in seen))
        rest = list(run.events(last_event_id=seen[2].id))
        self.assertEqual([e.id for e in rest], ids[3:])


if __name__ == "__main__":
    unittest.main()
