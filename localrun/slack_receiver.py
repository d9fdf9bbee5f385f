"""Slack on 127.0.0.1, for the demo, the tests and the benchmarks: an incoming webhook (`webhook_url`, also `url`) and
the Web API (`base` + ``/api/<method>``), keeping every JSON body it is sent.

    with SlackReceiver(on_message=print) as slack:
        secret = {"webhook_url": slack.webhook_url}
        ...
        slack.texts()                      # what was posted, in arrival order (`posts`: the bodies, `paths`: where)
        slack.status = 500                 # answer the next posts with an error (`scripted`: one answer a request)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

BIND_ADDRESS = "127.0.0.1"
WEBHOOK_PATH = "/services/T00000000/B00000000/localrun"
# Slack's own paths: incoming webhooks (hooks.slack.com/services/...), a press's response_url (.../actions/...), and
# the Web API (slack.com/api/<method>); a post anywhere else is refused.
SLACK_PATHS = ("/services/", "/actions/", "/api/")
MAX_BODY_BYTES = 1 << 20
ERROR_REPLY = b"internal_error"  # what a webhook answers an error with
# How often a local server looks whether it was asked to stop (serve_forever's default, 0.5 s, made each stop wait
# a quarter of a second on average: hundreds of tests stop one).
STOP_POLL_S = 0.02


@dataclass(frozen=True)
class SlackMessage:
    """One POST: when it arrived, where, and its JSON payload (text, blocks, ...)."""

    t: float
    payload: dict[str, Any]
    path: str = WEBHOOK_PATH

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES or not self.path.startswith(SLACK_PATHS):
            self._reply(400, b"invalid_payload")
            return
        try:
            payload = json.loads(self.rfile.read(length))
        except ValueError:
            self._reply(400, b"invalid_payload")
            return
        if not isinstance(payload, dict):
            self._reply(400, b"invalid_payload")
            return
        status, headers = self.server.receive(SlackMessage(t=time.time(), payload=payload, path=self.path))
        self._reply(status, self.server.reply if status == 200 else ERROR_REPLY, headers)

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: SlackReceiver) -> None:
        super().__init__((BIND_ADDRESS, 0), _Handler)
        self.receiver = receiver
        self._lock = threading.Lock()

    @property
    def reply(self) -> bytes:
        return self.receiver.reply

    def receive(self, message: SlackMessage) -> tuple[int, dict[str, str]]:
        """Keep `message`; the answer: the next scripted one, else the receiver's `status`."""
        receiver = self.receiver
        with self._lock:
            receiver.messages.append(message)
            answer = receiver.scripted.pop(0) if receiver.scripted else (receiver.status, {})
        if receiver.on_message is not None:
            receiver.on_message(message)
        return answer


class SlackReceiver:
    """Receives posts on a free local port: `messages` (`posts`, `paths`) in arrival order; answers `status` (`reply`
    on 200), or first the `scripted` answers, (status, headers) one per request."""

    def __init__(self, on_message: Callable[[SlackMessage], None] | None = None) -> None:
        self.on_message = on_message
        self.messages: list[SlackMessage] = []
        self.status = 200
        self.reply = b"ok"  # a webhook's answer; the Web API answers JSON
        self.scripted: list[tuple[int, dict[str, str]]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def posts(self) -> list[dict[str, Any]]:
        """Every body posted, in arrival order."""
        return [m.payload for m in self.messages]

    @property
    def paths(self) -> list[str]:
        return [m.path for m in self.messages]

    def texts(self) -> list[str]:
        return [post["text"] for post in self.posts]

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("SlackReceiver is not started")
        return int(self._server.server_address[1])

    @property
    def base(self) -> str:
        return f"http://{BIND_ADDRESS}:{self.port}"

    @property
    def webhook_url(self) -> str:
        return f"{self.base}{WEBHOOK_PATH}"

    url = webhook_url

    def start(self) -> SlackReceiver:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(STOP_POLL_S,), name="slack-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; the received messages stay readable."""
        if self._server is None or self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._thread = None

    def __enter__(self) -> SlackReceiver:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
