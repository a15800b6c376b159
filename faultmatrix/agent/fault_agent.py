#!/usr/bin/env python3
"""The fault matrix's client-driven agent: one call (a write, or a read) through the ledger, killed where told.

The runner of ``ledger faultmatrix run`` starts it with the ledger's URL, an
agent token, the run's key, the write tool to call and the path of the
agent's own effect store. It submits the run, proposes one write (a rule
approves it), begins an attempt, writes the effect in its own SQLite store,
completes the attempt and finishes the run.

With ``--fault-at POINT`` it kills itself with a real SIGKILL at that point
(no cleanup, no flush): ``before_attempt_recorded`` (approved, before the
begin), ``after_attempt_recorded`` (the begin answered, before the tool acts),
``after_tool_call`` (the effect is in the store, the complete not sent) or
``after_result_recorded`` (the complete answered, before the finish).
Started again without it, it resumes the run through ``/next`` with the
tool's query, cancel and execute backed by its store, and finishes the run.

With ``--pause-at POINT`` it writes ``PAUSE_DIR/paused`` at that point and
waits for ``PAUSE_DIR/go``: the runner kills the server meanwhile, and the
agent goes on while the server is down, retrying and resuming until the
server is back.

The write tool's guarantees come from ``--query``, ``--dedup``, ``--cancel``:
with dedup a write is an INSERT OR IGNORE by dedup key, without it a plain
INSERT, so a blind retry shows as two rows.

With ``--read`` the one call is a read instead (``--tool`` names a read
tool): it counts the effects of its dedup key and writes none, and each call
leaves a row in the store's ``reads`` table, so a read run again shows. The
points are the same (``after_tool_call``: the read answered, the complete
not sent).

Killed with ``--fault-at`` and never started again, it is an agent that
never comes back: the runner leaves the run to the ledger and to a person.

Only the Python standard library and the repository's clients/python are
used (on PYTHONPATH, or found beside this file in a checkout).
"""

import argparse
import os
import signal
import sqlite3
import sys
import time
from typing import Any, Dict, Optional

try:
    import ledger_client
except ImportError:  # run from a checkout: clients/python beside faultmatrix/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    import ledger_client

from ledger_client import AlreadySettled, AttemptClosed, Client, LedgerError, Run, TransportError

POINTS = ("before_attempt_recorded", "after_attempt_recorded", "after_tool_call", "after_result_recorded")
TERMINAL = ("completed", "stopped", "failed")


class Store:
    """The write tool's own effect store: one row per effect, keyed by dedup key.

    ``calls`` records each call as it starts, ``cancels`` the tombstones: a
    cancel refuses the calls of its key that had started before it (one in
    flight when the cancel came), never a later retry of the same key.
    """

    def __init__(self, path: str, dedup: bool) -> None:
        self.path = path
        self.dedup = dedup
        db = self._db()
        try:
            db.executescript("""
                CREATE TABLE IF NOT EXISTS effects (
                    seq INTEGER PRIMARY KEY AUTOINCREMENT, dedup_key TEXT NOT NULL,
                    dedup INTEGER NOT NULL, text TEXT NOT NULL);
                CREATE UNIQUE INDEX IF NOT EXISTS effects_dedup ON effects (dedup_key) WHERE dedup = 1;
                CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, dedup_key TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS cancels (dedup_key TEXT PRIMARY KEY, up_to_call INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS reads (seq INTEGER PRIMARY KEY AUTOINCREMENT, dedup_key TEXT NOT NULL);
            """)
        finally:
            db.close()

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def write(self, dedup_key: str, text: str) -> Dict[str, Any]:
        """One call of the write tool under ``dedup_key``."""
        db = self._db()
        try:
            call = db.execute("INSERT INTO calls (dedup_key) VALUES (?)", (dedup_key,)).lastrowid
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT count(*) FROM cancels WHERE dedup_key = ? AND up_to_call >= ?",
                              (dedup_key, call)).fetchone()[0]:
                    db.execute("COMMIT")
                    raise RuntimeError("dedup key %s was cancelled before the call took effect" % dedup_key)
                verb = "INSERT OR IGNORE" if self.dedup else "INSERT"
                cur = db.execute(verb + " INTO effects (dedup_key, dedup, text) VALUES (?, ?, ?)",
                                 (dedup_key, 1 if self.dedup else 0, text))
                db.execute("COMMIT")
            except sqlite3.Error:
                db.execute("ROLLBACK")
                raise
            return {"call": call, "deduplicated": cur.rowcount == 0}
        finally:
            db.close()

    def read(self, dedup_key: str) -> Dict[str, Any]:
        """One call of the read tool under ``dedup_key``: the effects of the key, none made."""
        db = self._db()
        try:
            call = db.execute("INSERT INTO reads (dedup_key) VALUES (?)", (dedup_key,)).lastrowid
            n = db.execute("SELECT count(*) FROM effects WHERE dedup_key = ?", (dedup_key,)).fetchone()[0]
            return {"read": call, "effects": int(n)}
        finally:
            db.close()

    def count(self, dedup_key: str) -> int:
        db = self._db()
        try:
            return int(db.execute("SELECT count(*) FROM effects WHERE dedup_key = ?", (dedup_key,)).fetchone()[0])
        finally:
            db.close()

    def cancel(self, dedup_key: str) -> bool:
        """Refuse the calls of ``dedup_key`` begun so far; confirmed only if none took effect."""
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            if db.execute("SELECT count(*) FROM effects WHERE dedup_key = ?", (dedup_key,)).fetchone()[0]:
                db.execute("COMMIT")
                return False
            db.execute("INSERT INTO cancels (dedup_key, up_to_call) VALUES (?, "
                       "(SELECT COALESCE(MAX(seq), 0) FROM calls WHERE dedup_key = ?)) "
                       "ON CONFLICT (dedup_key) DO UPDATE SET up_to_call = excluded.up_to_call", (dedup_key, dedup_key))
            db.execute("COMMIT")
            return True
        finally:
            db.close()


class Hands:
    """The tool's hands for recovery, as far as its guarantees go (a read's execute reads)."""

    def __init__(self, store: Store, query: bool, cancel: bool, read: bool) -> None:
        self.store = store
        self.can_query = query
        self.can_cancel = cancel
        self.read = read

    def query(self, dedup_key: str) -> str:
        if not self.can_query:
            raise RuntimeError("this tool cannot be queried")
        return "happened" if self.store.count(dedup_key) > 0 else "not_happened"

    def cancel(self, dedup_key: str) -> bool:
        if not self.can_cancel:
            raise RuntimeError("this tool cannot cancel")
        return self.store.cancel(dedup_key)

    def execute(self, arguments: Any, dedup_key: str) -> Any:
        return call_tool(self.store, self.read, dedup_key, arguments)


def call_tool(store: Store, read: bool, dedup_key: str, arguments: Any) -> Dict[str, Any]:
    """One call of the agent's tool: a read of the key, or a write of the arguments' text."""
    if read:
        return store.read(dedup_key)
    return store.write(dedup_key, str(arguments["text"]))


class Points:
    """Where to die (``--fault-at``) or wait for the runner (``--pause-at``)."""

    def __init__(self, fault_at: Optional[str], pause_at: Optional[str], pause_dir: str) -> None:
        self.fault_at = fault_at
        self.pause_at = pause_at
        self.pause_dir = pause_dir

    def reach(self, point: str) -> None:
        say("at " + point)
        if point == self.fault_at:
            say("SIGKILL at " + point)
            os.kill(os.getpid(), signal.SIGKILL)
        if point == self.pause_at:
            self.pause_at = None  # once
            open(os.path.join(self.pause_dir, "paused"), "w").close()
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(self.pause_dir, "go")):
                if time.monotonic() > deadline:
                    raise SystemExit("the runner never said go")
                time.sleep(0.02)
            say("going on after the pause at " + point)


def say(msg: str) -> None:
    print("fault_agent[%d]: %s" % (os.getpid(), msg), file=sys.stderr, flush=True)


def drive(client: Client, o: argparse.Namespace, store: Store, points: Points) -> Run:
    """One pass of the agent's loop: submit (or replay), resume, the call (a write or a read), finish."""
    run = client.start_run(o.agent, {"text": "fault matrix"}, key=o.run_key)
    if run.replayed:
        run.refresh()
    say("run %s (%s)%s" % (run.id, run.state, ", resumed" if run.replayed else ""))
    if run.state in TERMINAL:
        return run
    nxt = run.resume({o.tool: Hands(store, o.query, o.cancel, o.read)})
    kinds = nxt.kinds()
    say("resume: %s" % kinds)
    if "stop" in kinds or "review" in kinds or "wait_approval" in kinds:
        return run.refresh()  # ended, or a person decides now

    step = "read" if o.read else "write"
    action = run.propose(o.tool, {"text": "fault matrix"}, step_key=step)
    if action.state == "succeeded":
        say("the %s of this run succeeded already" % step)
    else:
        action = client.await_decision(action, timeout=20)
        points.reach("before_attempt_recorded")
        try:
            with run.attempt(action) as call:
                points.reach("after_attempt_recorded")
                out = call_tool(store, o.read, call.dedup_key, call.arguments)
                points.reach("after_tool_call")
                call.succeeded(out)
        except AlreadySettled:
            pass
        points.reach("after_result_recorded")
    return run.finish("completed", output={"effects": store.count(action.dedup_key)})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledger", required=True, help="the ledger's URL")
    p.add_argument("--token", required=True, help="a token of role agent bound to --agent")
    p.add_argument("--agent", required=True, help="the agent's name in the ledger's config")
    p.add_argument("--run-key", required=True, help="the run's idempotency key")
    p.add_argument("--tool", required=True, help="the write tool to call (with --read, the read tool)")
    p.add_argument("--effects", required=True, help="the tool's own SQLite effect store")
    p.add_argument("--query", action="store_true", help="the tool can be queried")
    p.add_argument("--dedup", action="store_true", help="the tool dedups by key")
    p.add_argument("--cancel", action="store_true", help="the tool can cancel")
    p.add_argument("--read", action="store_true", help="the one call is a read of --tool, not a write")
    p.add_argument("--fault-at", default=os.environ.get("FAULT_AT") or None, choices=POINTS,
                   help="SIGKILL this process at this point (env FAULT_AT)")
    p.add_argument("--pause-at", choices=POINTS, help="wait for the runner at this point")
    p.add_argument("--pause-dir", default=".", help="where the pause's files are")
    p.add_argument("--deadline", type=float, default=60, help="give up retrying after this many seconds")
    o = p.parse_args()
    client = Client(o.ledger, token=o.token, timeout=5)
    store = Store(o.effects, o.dedup)
    points = Points(o.fault_at, o.pause_at, o.pause_dir)
    deadline = time.monotonic() + o.deadline
    while True:
        try:
            run = drive(client, o, store, points)
            break
        except (TransportError, AttemptClosed) as e:
            # The server is down or recovery moved on: go round again, as a
            # restarted agent would (submit replays, resume settles).
            if time.monotonic() > deadline:
                say("giving up: %s" % e)
                return 1
            say("retrying after: %s" % e)
            time.sleep(0.3)
        except LedgerError as e:
            if e.status is not None and e.status >= 500 and time.monotonic() < deadline:
                say("retrying after: %s" % e)
                time.sleep(0.3)
                continue
            say("ledger: %s" % e)
            return 1
    print("%s %s" % (run.id, run.state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
