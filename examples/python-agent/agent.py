#!/usr/bin/env python3
"""A notes agent of its own, in Python, that puts each tool call through the ledger.

Its two tools run here, in the agent's process, and keep their effects in the
agent's own SQLite file: notes.list reads the notes, notes.append writes one,
once per dedup key, and can say whether a dedup key's note was written (the
tool's `query` guarantee). The ledger gates every call (a note waits for a
person's approval), records each attempt before the call, and after a crash
tells the restarted agent what is safe: run the agent again with the same
--key and it resumes the same run without writing the note twice.

    python3 examples/python-agent/agent.py --ledger http://127.0.0.1:8080 --token "$TOKEN" --text "hello"

The ledger must declare the agent and its tools: see config.yaml beside this file.
"""

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import threading
from typing import Any, Dict, List, Optional

try:
    import ledger_client
except ImportError:  # run from a checkout without installing the client
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import ledger_client

from ledger_client import AlreadySettled, Client, Run


class Notes:
    """The agent's tools: a notes file of its own, one row per note written.

    Every execution inserts a row, so a note written twice would show twice:
    the test counts rows to check that the ledger let each action act once.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, dedup_key TEXT NOT NULL, text TEXT NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def list(self) -> List[str]:
        """The texts of the notes, oldest first (the read tool)."""
        with self._lock:
            db = self._db()
            try:
                return [r[0] for r in db.execute("SELECT text FROM notes ORDER BY id")]
            finally:
                db.close()

    def append(self, text: str, dedup_key: str) -> Dict[str, Any]:
        """Write one note under ``dedup_key`` (the write tool)."""
        with self._lock:
            db = self._db()
            try:
                cur = db.execute("INSERT INTO notes (dedup_key, text) VALUES (?, ?)", (dedup_key, text))
                return {"note_id": cur.lastrowid}
            finally:
                db.close()

    def written(self, dedup_key: str) -> bool:
        """Whether the note of ``dedup_key`` was written (the tool's query)."""
        with self._lock:
            db = self._db()
            try:
                return db.execute("SELECT count(*) FROM notes WHERE dedup_key = ?", (dedup_key,)).fetchone()[0] > 0
            finally:
                db.close()


class AppendHands:
    """notes.append's hands for recovery: what resume asks of the tool after a crash."""

    def __init__(self, notes: Notes) -> None:
        self.notes = notes

    def query(self, dedup_key: str) -> str:
        return "happened" if self.notes.written(dedup_key) else "not_happened"

    def cancel(self, dedup_key: str) -> bool:
        return False  # a written note cannot be taken back

    def execute(self, arguments: Any, dedup_key: str) -> Any:
        return self.notes.append(str(arguments["text"]), dedup_key)


class ListHands:
    """notes.list's hands: a read needs no recovery, but resume may run it again."""

    def __init__(self, notes: Notes) -> None:
        self.notes = notes

    def query(self, dedup_key: str) -> str:
        return "unknown"

    def cancel(self, dedup_key: str) -> bool:
        return False

    def execute(self, arguments: Any, dedup_key: str) -> Any:
        return {"notes": self.notes.list()}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ask_for_approval(action: ledger_client.Action) -> None:
    """Tell the person at the terminal how to approve the action's exact digest."""
    say("waiting for a person to approve %s %s: ledger approve %s --digest %s" %
        (action.tool, json.dumps(action.arguments), action.id, action.action_digest))


def run_agent(client: Client, agent: str, notes: Notes, text: str, key: str,
              approval_timeout: Optional[float] = None, crash_after_effect: bool = False) -> Run:
    """One run of the notes agent: read the notes, append one, finish.

    The run's key and each step's key are fixed, so running it again after a
    crash resumes the same run and replays the same steps.
    """
    run = client.start_run(agent, {"text": text}, key=key)
    if run.replayed:
        run.refresh()  # a replayed submit answers as it did the first time
    say("run %s (%s)%s" % (run.id, run.state, ", resumed" if run.replayed else ""))
    if run.state in ("completed", "stopped", "failed"):
        return run
    # After a crash: settle whatever the last process left in flight.
    nxt = run.resume({"notes.append": AppendHands(notes), "notes.list": ListHands(notes)})
    if nxt.kinds() == ["stop"]:
        return run.refresh()

    # The "model" of this example is a fixed plan: look, then write.
    try:
        with run.call("notes.list", {}, step_key="list") as call:
            call.succeeded({"notes": notes.list()})
    except AlreadySettled:
        pass

    try:
        with run.call("notes.append", {"text": text}, step_key="append", approval_timeout=approval_timeout,
                      on_wait=ask_for_approval) as call:
            # The action waited here until a person approved its exact digest.
            out = notes.append(call.arguments["text"], call.dedup_key)
            if crash_after_effect:
                say("crashing after the note was written, before the ledger heard of it")
                os._exit(3)
            call.succeeded(out)
            say("note written under %s" % call.dedup_key)
    except AlreadySettled:
        say("the note of this run was written already")

    return run.finish("completed", output={"notes": len(notes.list())})


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledger", default=os.environ.get("LEDGER_SERVER", "http://127.0.0.1:8080"),
                   help="the ledger's URL (env LEDGER_SERVER)")
    p.add_argument("--token", default=os.environ.get("LEDGER_TOKEN"),
                   help="a token of role agent bound to --agent (env LEDGER_TOKEN); none in dev mode")
    p.add_argument("--agent", default="notes-agent", help="the agent's name in the ledger's config")
    p.add_argument("--effects", default="notes.db", help="the notes tool's own SQLite file")
    p.add_argument("--text", default="hello from a Python agent", help="the note to write")
    p.add_argument("--key", help="the run's idempotency key (default: derived from --text)")
    p.add_argument("--approval-timeout", type=float, help="give up waiting for approval after this many seconds")
    p.add_argument("--crash-after-effect", action="store_true", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    key = o.key or "note-" + hashlib.sha256(o.text.encode("utf-8")).hexdigest()[:16]
    client = Client(o.ledger, token=o.token)
    notes = Notes(o.effects)
    try:
        run = run_agent(client, o.agent, notes, o.text, key, o.approval_timeout, o.crash_after_effect)
    except ledger_client.Denied as e:
        say("denied: %s" % e)
        return 1
    except ledger_client.LedgerError as e:
        say("ledger: %s" % e)
        return 1
    print("%s %s" % (run.id, run.state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
