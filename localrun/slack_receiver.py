"""A local stand-in for Slack's incoming webhooks: an HTTP server on 127.0.0.1 that keeps what it is sent.

with SlackReceiver(on_message=print) as slack:
    secret = {"webhook_url": slack.webhook_url}
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
MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class SlackMessage:
    """One webhook POST: when it arrived and its JSON payload (text, blocks, ...)."""

    t: float
    payload: dict[str, Any]

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))


class _WebhookHandler(BaseHTTPRequestHandler):
    server: _WebhookServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES or self.path != WEBHOOK_PATH:
            self._reply(400, "invalid_payload")
            return
        try:
            payload = json.loads(self.rfile.read(length))
        except ValueError:
            self._reply(400, "invalid_payload")
            return
        if not isinstance(payload, dict):
            self._reply(400, "invalid_payload")
            return
        self.server.receive(SlackMessage(t=time.time(), payload=payload))
        self._reply(200, "ok")  # what Slack answers

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""


class _WebhookServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, on_message: Callable[[SlackMessage], None] | None) -> None:
        super().__init__((BIND_ADDRESS, 0), _WebhookHandler)
        self.messages: list[SlackMessage] = []
        self._lock = threading.Lock()
        self._on_message = on_message

    def receive(self, message: SlackMessage) -> None:
        with self._lock:
            self.messages.append(message)
        if self._on_message is not None:
            self._on_message(message)


class SlackReceiver:
    """Receives webhook posts on a free local port; `messages` holds them in arrival order."""

    def __init__(self, on_message: Callable[[SlackMessage], None] | None = None) -> None:
        self._on_message = on_message
        self._server: _WebhookServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("SlackReceiver is not started")
        return int(self._server.server_address[1])

    @property
    def webhook_url(self) -> str:
        return f"http://{BIND_ADDRESS}:{self.port}{WEBHOOK_PATH}"

    @property
    def messages(self) -> list[SlackMessage]:
        return list(self._server.messages) if self._server is not None else []

    def start(self) -> SlackReceiver:
        self._server = _WebhookServer(self._on_message)
        self._thread = threading.Thread(target=self._server.serve_forever, name="slack-receiver", daemon=True)
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
