"""A stand-in W&B server on 127.0.0.1 for the WandbLogger tests: it answers the few GraphQL calls
wandb's service makes to start a run (Viewer, RunResumeStatus, UpsertBucket, CreateRunFiles, ...)
and takes the file stream, enough for a real online run; ``stop()`` takes it away in the middle of
a fit (the port then refuses connections). It records the paths it was sent to."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _answer(variables: dict) -> dict:
    """One ``data`` object that holds what each of the calls reads (the rest of it is ignored)."""
    entity = {"id": "RW50aXR5OjE=", "name": "me"}
    run = {"id": "UnVuOjE=", "name": variables.get("name", "run"), "displayName": "run", "sweepName": None,
           "historyLineCount": 0, "eventsLineCount": 0, "config": "{}", "summaryMetrics": "{}",
           "project": {"id": "UHJvamVjdDox", "name": "p", "entity": entity}}
    return {"viewer": {"id": "VXNlcjox", "entity": "me", "username": "me", "flags": "{}", "teams": {"edges": []}},
            "upsertBucket": {"bucket": run, "inserted": True}, "model": {"bucket": None},
            "serverInfo": {"latestLocalVersionInfo": None, "features": []},
            "createRunFiles": {"runID": "UnVuOjE=", "files": []}}


class _Handler(BaseHTTPRequestHandler):
    server: StandInServer

    def log_message(self, *args) -> None:
        pass

    def _reply(self, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # http.server's name
        self.server.paths.append(self.path)
        self._reply({})

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        self.server.paths.append(self.path)
        if self.path.endswith("/graphql"):
            self._reply({"data": _answer(json.loads(body).get("variables") or {})})
        else:  # the file stream, wandb's own telemetry
            self._reply({"exitcode": None, "limits": {}})

    do_PUT = do_POST


class StandInServer(ThreadingHTTPServer):
    """``with StandInServer() as server:`` a server at ``server.url`` until ``stop()``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.paths: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join(timeout=10)
        self.server_close()

    def __exit__(self, *exc) -> None:
        self.stop()
