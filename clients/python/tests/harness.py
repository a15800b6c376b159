"""A real ledger server for the tests: bin/ledger serve on a free port, over a fresh database.

The binary is the repository's bin/ledger (``make build``), or $LEDGER_BIN.
Each server gets a config file declaring the client agent and its tools, and
a tokens file with an agent-role token and an approver token, both made by
``ledger token new``.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))

AGENT = "py-agent"
TENANT = "acme"


def ledger_bin() -> str:
    """The ledger binary the tests run."""
    path = os.environ.get("LEDGER_BIN") or os.path.join(REPO, "bin", "ledger")
    if not os.access(path, os.X_OK):
        raise RuntimeError("no ledger binary at %s: run `make build` (or set LEDGER_BIN)" % path)
    return path


def _schema(props: Dict[str, Any], required: List[str]) -> Dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": props, "required": required, "additionalProperties": False}


def _tool(name: str, effect: str, query: bool = False, dedup: bool = False, cancel: bool = False,
          **extra: Any) -> Dict[str, Any]:
    t: Dict[str, Any] = {
        "name": name, "version": "1", "effect": effect, "executor": "client",
        "arguments_schema": _schema({"text": {"type": "string"}, "n": {"type": "integer"}}, ["text"]),
        "guarantees": {"query": query, "dedup": dedup, "cancel": cancel},
        "timeout_ms": 30000,
    }
    t.update(extra)
    return t


#: The tools the tests' agent may call, one per guarantee worth telling apart.
TOOLS = [
    _tool("notes.read", "read"),
    _tool("notes.write", "write", query=True),        # recovery asks the tool
    _tool("notes.send", "write", dedup=True),         # recovery resends under the same key
    _tool("notes.plain", "write"),                    # nothing: recovery sends it to a person
    _tool("notes.slow", "write", query=True, heartbeat_timeout_ms=1000, max_duration_ms=20000),
]


def default_config(tools: Optional[List[Dict[str, Any]]] = None, agent: str = AGENT) -> Dict[str, Any]:
    """A config file declaring ``agent`` (driver client) with ``tools``."""
    tools = TOOLS if tools is None else tools
    return {
        "schema_version": "1.0",
        "tools": tools,
        "agents": [{"name": agent, "driver": "client", "tools": [t["name"] for t in tools], "tenants": [TENANT],
                    "policies": {"repeat_limit": 50, "no_progress_window": 50, "consecutive_errors": 50}}],
    }


class LedgerServer:
    """One ``ledger serve`` process, with its database and tokens file in a temporary directory.

    The config is ``config`` (a dict, written there) or the file ``config_file``.
    """

    def __init__(self, config: Optional[Dict[str, Any]] = None, agent: str = AGENT,
                 config_file: Optional[str] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="ledger-py-")
        self.db = os.path.join(self.dir, "ledger.db")
        self.tokens_path = os.path.join(self.dir, "tokens.json")
        if config_file is not None:
            self.config_path = config_file
        else:
            self.config_path = os.path.join(self.dir, "config.json")
            with open(self.config_path, "w") as f:
                json.dump(config or default_config(agent=agent), f, indent=2)
        self.agent_token = self.make_token("py-agent-1", ["agent"], agents=[agent])
        self.approver_token = self.make_token("alice", ["approver"])
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.url = ""
        self.log: List[str] = []
        self._drain: Optional[threading.Thread] = None

    def make_token(self, principal: str, roles: List[str], agents: Optional[List[str]] = None) -> str:
        """A fresh token added to the tokens file, made by ``ledger token new``."""
        args = [ledger_bin(), "token", "new", "--principal", principal, "--tenant", TENANT, "--json",
                "--add-to", self.tokens_path]
        for r in roles:
            args += ["--role", r]
        for a in agents or []:
            args += ["--agent", a]
        out = subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return str(json.loads(out.stdout.decode())["token"])

    def start(self, timeout: float = 30.0) -> "LedgerServer":
        """Start the server and wait until it says where it listens."""
        env = dict(os.environ)
        env.setdefault("LEDGER_REDACTION_KEY", "py-client-tests-redaction-key-0123456789")
        args = [ledger_bin(), "serve", "--db", self.db, "--addr", "127.0.0.1:0", "--tokens", self.tokens_path,
                "--config", self.config_path, "--log-format", "json", "--rate-limit", "0"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        found = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.log.append(line)
                if not found.is_set():
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict) and rec.get("url") and str(rec.get("msg", "")).startswith("listening"):
                        self.url = str(rec["url"])
                        found.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("ledger serve did not start:\n" + "\n".join(self.log[-30:]))
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            if self._drain is not None:
                self._drain.join(5)  # the log up to the process's end
            self.proc.stderr.close()
        self.proc = None

    def close(self) -> None:
        """Stop the server and remove its files."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LedgerServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
