"""Ships lines to a CloudWatch Logs stream in batches, as SageMaker's log agent does for a training container.

shipper = LogShipper(logs, "/aws/sagemaker/TrainingJobs", "my-job/algo-1-1700000000", on_error=print).start()
shipper.add(time.time(), "step 10 loss 3.2")
shipper.stop()   # flushes what is left
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from localrun.periodic import Periodic
from localrun.scenarios import LOG_FLUSH_INTERVAL_S

MAX_BATCH_EVENTS = 10_000  # PutLogEvents limits
MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD_BYTES = 26
MAX_MESSAGE_BYTES = 256 * 1024 - EVENT_OVERHEAD_BYTES


class LogShipper:
    """Buffers (time, line) pairs and puts them to one log stream every `LOG_FLUSH_INTERVAL_S`."""

    def __init__(self, logs: Any, group: str, stream: str, on_error: Callable[[str, BaseException], None]) -> None:
        self._logs = logs
        self.group = group
        self.stream = stream
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ticker = Periodic(f"logs:{stream}", LOG_FLUSH_INTERVAL_S, self.flush, on_error)
        self.shipped = 0

    def start(self) -> LogShipper:
        """Create the group (if new) and the stream, then ship in the background."""
        with contextlib.suppress(self._logs.exceptions.ResourceAlreadyExistsException):
            self._logs.create_log_group(logGroupName=self.group)
        self._logs.create_log_stream(logGroupName=self.group, logStreamName=self.stream)
        self._ticker.start()
        return self

    def add(self, t: float, line: str) -> None:
        """Queue one line; empty lines are dropped (CloudWatch rejects empty messages)."""
        if not line.strip():
            return
        message = line.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore")
        with self._lock:
            self._pending.append({"timestamp": int(t * 1000), "message": message})

    def flush(self) -> None:
        """Put everything queued so far, in order, within the API's batch limits."""
        with self._lock:
            pending, self._pending = self._pending, []
        batch: list[dict[str, Any]] = []
        size = 0
        for event in pending:
            event_size = len(event["message"].encode()) + EVENT_OVERHEAD_BYTES
            if batch and (len(batch) == MAX_BATCH_EVENTS or size + event_size > MAX_BATCH_BYTES):
                self._put(batch)
                batch, size = [], 0
            batch.append(event)
            size += event_size
        if batch:
            self._put(batch)

    def _put(self, events: list[dict[str, Any]]) -> None:
        self._logs.put_log_events(logGroupName=self.group, logStreamName=self.stream, logEvents=events)
        self.shipped += len(events)

    def stop(self) -> None:
        """Stop the background thread and ship what is left."""
        self._ticker.stop()
        self.flush()
