"""The example agent against the real ledger binary: one note per action, counted in its own file.

Run from the repository: python3 -m unittest discover -s examples/python-agent
"""

import os
import sqlite3
import subprocess
import sys
import threading
import unittest
import uuid
from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python", "tests"))

from harness import LedgerServer  # noqa: E402

from ledger_client import Client, LedgerError  # noqa: E402

AGENT_PY = os.path.join(HERE, "agent.py")


class Approver(threading.Thread):
    """A person who approves every pending note of the tenant, over HTTP."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(url, token=token)
        self.stop = threading.Event()
        self.approved: List[str] = []

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                for p in self.client.approvals("pending"):
                    self.client.approve(p["action_id"], p["action_digest"], reason="a note is fine")
                    self.approved.append(p["action_id"])
            except LedgerError:
                continue  # decided meanwhile


class ExampleAgentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = LedgerServer(config_file=os.path.join(HERE, "config.yaml"), agent="notes-agent").start()
        cls.approver = Approver(cls.server.url, cls.server.approver_token)
        cls.approver.start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.approver.stop.set()
        cls.server.close()

    def setUp(self) -> None:
        self.effects = os.path.join(self.server.dir, "notes-%s.db" % uuid.uuid4().hex[:8])
        self.client = Client(self.server.url, token=self.server.agent_token)

    def agent(self, key: str, text: str, *extra: str) -> Tuple[int, str, str]:
        p = subprocess.run([sys.executable, AGENT_PY, "--ledger", self.server.url, "--token", self.server.agent_token,
                            "--effects", self.effects, "--key", key, "--text", text, "--approval-timeout", "20", *extra],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def notes(self) -> List[Tuple[str, str]]:
        db = sqlite3.connect(self.effects)
        try:
            return list(db.execute("SELECT dedup_key, text FROM notes ORDER BY id"))
        finally:
            db.close()

    def appends(self, run_id: str) -> List[dict]:
        return [a for a in self.client.get_run(run_id)["actions"] if a["tool"] == "notes.append"]

    def test_one_note_per_action(self) -> None:
        k1, k2 = "note-" + uuid.uuid4().hex, "note-" + uuid.uuid4().hex
        rc, out, err = self.agent(k1, "hello")
        self.assertEqual(rc, 0, err)
        run1, state = out.split()
        self.assertEqual(state, "completed")
        self.assertIn("waiting for a person to approve notes.append", err)

        rc, out, err = self.agent(k1, "hello")  # the same key: the same run, nothing written again
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), [run1, "completed"])

        rc, out, err = self.agent(k2, "world")
        self.assertEqual(rc, 0, err)
        run2 = out.split()[0]
        self.assertNotEqual(run1, run2)

        notes = self.notes()
        self.assertEqual([t for _, t in notes], ["hello", "world"])
        for run_id in (run1, run2):
            acts = self.appends(run_id)
            self.assertEqual([a["state"] for a in acts], ["succeeded"])
            self.assertEqual([a["approvals"][0]["decided_by"] for a in acts], ["alice"])
            self.assertEqual(sum(1 for dk, _ in notes if dk == acts[0]["dedup_key"]), 1)

    def test_a_crash_after_the_effect_writes_the_note_once(self) -> None:
        k = "note-" + uuid.uuid4().hex
        rc, out, err = self.agent(k, "crash", "--crash-after-effect")
        self.assertEqual(rc, 3, err)
        self.assertEqual(len(self.notes()), 1)

        rc, out, err = self.agent(k, "crash")  # restarted: resume asks the tool, which says it happened
        self.assertEqual(rc, 0, err)
        run_id, state = out.split()
        self.assertEqual(state, "completed")
        notes = self.notes()
        self.assertEqual(len(notes), 1, "the note was written twice")
        acts = self.appends(run_id)
        self.assertEqual([a["state"] for a in acts], ["succeeded"])
        self.assertEqual(len(acts[0]["attempts"]), 1)
        self.assertEqual(notes[0][0], acts[0]["dedup_key"])


if __name__ == "__main__":
    unittest.main()


class ReadmeSnippetTest(unittest.TestCase):
    """The top README's "Bring your own agent" block, run as it stands, against the real server."""

    def test_readme_snippet_completes_a_run(self) -> None:
        root = os.path.abspath(os.path.join(HERE, "..", ".."))
        with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        start = readme.index("## Bring your own agent")
        block = readme[readme.index("```python\n", start) + len("```python\n"):]
        block = block[:block.index("```")]
        self.assertLessEqual(len(block.strip().splitlines()), 10, "under ten lines of set-up")
        dev = 'Client("http://127.0.0.1:8080")'
        self.assertIn(dev, block)
        server = LedgerServer(config_file=os.path.join(HERE, "config.yaml"), agent="notes-agent").start()
        approver = Approver(server.url, server.approver_token)
        approver.start()
        try:
            # The same block with this server's URL and the agent's token in place of dev mode's.
            code = block.replace(dev, "Client(%r, token=%r)" % (server.url, server.agent_token))
            p = subprocess.run([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            self.assertEqual(len(approver.approved), 1, "one write, approved by a person")
        finally:
            approver.stop.set()
            server.close()
