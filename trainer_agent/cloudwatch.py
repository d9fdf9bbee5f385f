"""CloudWatch PutMetricData from a background thread: batched, bounded queue, drops rather than blocks, retries.

sink = CloudWatchSink()   # boto3 is imported on the sink's thread; AWS_ENDPOINT_URL is honoured
"""

from __future__ import annotations

import queue
import random
import threading
import time
from datetime import datetime, timezone
from typing import Any

from trainer_agent.contract import DIM_HOST, DIM_JOB, HOST_METRICS, JOB_METRICS, NAMESPACE, SCOPE_JOB
from trainer_agent.emf import storage_resolution
from trainer_agent.log import cause_key, logger, warn_once
from trainer_agent.window import Window

QUEUE_WINDOWS = 256
"""Windows held while CloudWatch is slow or unreachable; more are dropped."""
MAX_DATUMS_PER_CALL = 1000
"""PutMetricData's limit on metrics per request."""
MAX_ATTEMPTS = 4
BACKOFF_S = 0.5
"""First retry delay; doubled per attempt, with jitter."""
POLL_S = 0.2
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalFailure",
        "InternalServiceError",
        "ServiceUnavailable",
    }
)


class CloudWatchSink:
    """Publishes each window's metrics to CloudWatch under the contract's namespace and dimensions."""

    def __init__(
        self,
        *,
        namespace: str = NAMESPACE,
        region: str | None = None,
        client: Any = None,
        queue_windows: int = QUEUE_WINDOWS,
        require_credentials: bool = False,
    ) -> None:
        if queue_windows < 1:
            raise ValueError(f"queue_windows must be >= 1, not {queue_windows}")
        self.namespace = namespace
        self.dropped = 0
        """Windows dropped (queue full, CloudWatch failing, no boto3 or no credentials)."""
        self.sent = 0
        """Metric datums CloudWatch accepted."""
        self._region = region
        self._client = client
        self._require_credentials = require_credentials
        self._queue: queue.Queue[list[dict[str, Any]]] = queue.Queue(maxsize=queue_windows)
        self._closing = threading.Event()
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._start_lock = threading.RLock()
        self._full_key = cause_key("cloudwatch-full")

    def emit(self, window: Window) -> None:
        """Queue the window's datums; never waits."""
        self._ensure_thread()
        try:
            self._queue.put_nowait(self.datums(window))
        except queue.Full:
            self.dropped += 1
            warn_once(self._full_key, "CloudWatch queue full (%d windows); dropping windows", QUEUE_WINDOWS)

    def datums(self, window: Window) -> list[dict[str, Any]]:
        """The PutMetricData MetricData entries of a window."""
        units = JOB_METRICS if window.scope == SCOPE_JOB else HOST_METRICS
        dimensions = [{"Name": DIM_JOB, "Value": window.job}]
        if window.scope != SCOPE_JOB:
            dimensions.append({"Name": DIM_HOST, "Value": window.host})
        timestamp = datetime.fromtimestamp(window.t, timezone.utc)
        resolution = storage_resolution(window.interval_s)
        return [
            {
                "MetricName": name,
                "Dimensions": dimensions,
                "Timestamp": timestamp,
                "Value": value,
                "Unit": units[name],
                "StorageResolution": resolution,
            }
            for name, value in window.metrics.items()
        ]

    def close(self, timeout_s: float) -> None:
        """Send what is queued, for at most timeout_s, then stop."""
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning(
                    "CloudWatch sink did not finish within %.1f s; %d windows unsent", timeout_s, self._queue.qsize()
                )

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="stallwatch-cloudwatch", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        client = self._make_client()
        while True:
            try:
                batch = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            windows = 1
            while len(batch) < MAX_DATUMS_PER_CALL and not self._queue.empty():
                batch += self._queue.get_nowait()
                windows += 1
            if client is None or not self._send(client, batch):
                self.dropped += windows

    def _make_client(self) -> Any:
        try:
            if self._client is not None:
                return self._client
            import boto3  # imported here to keep startup light, and because it is optional
            from botocore.config import Config

            session = boto3.session.Session(region_name=self._region)
            if self._require_credentials and session.get_credentials() is None:
                logger.info("no AWS credentials found; CloudWatch sink is off")
                return None
            config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S, retries={"max_attempts": 1})
            return session.client("cloudwatch", config=config)
        except Exception as error:  # no boto3, no region: the windows are dropped, the loop goes on
            warn_once("cloudwatch-client", "CloudWatch sink is off: %r", error)
            return None

    def _send(self, client: Any, batch: list[dict[str, Any]]) -> bool:
        for start in range(0, len(batch), MAX_DATUMS_PER_CALL):
            chunk = batch[start : start + MAX_DATUMS_PER_CALL]
            if not self._send_chunk(client, chunk):
                return False
            self.sent += len(chunk)
        return True

    def _send_chunk(self, client: Any, chunk: list[dict[str, Any]]) -> bool:
        attempt = 0
        while True:
            try:
                client.put_metric_data(Namespace=self.namespace, MetricData=chunk)
                return True
            except Exception as error:  # botocore raises many types; retry only what a retry can fix
                attempt += 1
                delay = BACKOFF_S * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
                if not _retryable(error) or attempt == MAX_ATTEMPTS or time.monotonic() + delay > self._deadline:
                    warn_once(f"cloudwatch-put:{type(error).__name__}", "PutMetricData failed, dropping: %r", error)
                    return False
                time.sleep(delay)


def _retryable(error: Exception) -> bool:
    """Throttling, server errors and connection problems are retried; bad requests and missing credentials not."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code", "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in RETRYABLE_CODES or status >= 500
    return type(error).__name__ in {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
    }
