"""A local Lambda runtime: invokes the real handler functions one at a time, as the Lambda service would.

Each invocation gets a Lambda context; whatever the function writes to stdout or stderr (Powertools' JSON logs,
EMF metrics, warnings) is captured and shipped to the function's log group in moto's CloudWatch Logs, as Lambda does,
instead of scrolling through the terminal view.

    runtime = LambdaRuntime(logs, {"on_alarm": on_alarm.handler})
    result = runtime.invoke("on_alarm", event)
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localrun.local_aws import ACCOUNT_ID, REGION

FUNCTION_PREFIX = "stallwatch-"
MEMORY_MB = 512
TIMEOUT_S = 60

Handler = Callable[[dict[str, Any], Any], Any]


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{FUNCTION_PREFIX}{name}"


@dataclass(frozen=True)
class LambdaContext:
    """The attributes of Lambda's context object that handlers and Powertools read."""

    function_name: str
    invoked_function_arn: str
    aws_request_id: str
    log_group_name: str
    log_stream_name: str
    deadline: float
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = MEMORY_MB

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.time()) * 1000))


@dataclass(frozen=True)
class Invocation:
    """One finished invocation: its result or error, and its captured log lines."""

    function: str
    request_id: str
    result: Any
    error: BaseException | None
    log_lines: tuple[str, ...]


@contextlib.contextmanager
def _captured_output() -> Iterator[io.StringIO]:
    """Route stdout and stderr, and logging handlers that write to them, into a buffer for the invocation."""
    buffer = io.StringIO()
    original = sys.stdout
    retargeted = [
        handler
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
        and handler.stream in (original, sys.__stdout__, sys.stderr, sys.__stderr__)
    ]
    previous = [handler.setStream(buffer) for handler in retargeted]
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        for handler, stream in zip(retargeted, previous, strict=True):
            handler.setStream(stream if stream is not None else original)


class LambdaRuntime:
    """Invokes registered handlers serially (one function instance) and ships their output to CloudWatch Logs."""

    def __init__(self, logs: Any, handlers: dict[str, Handler]) -> None:
        self._logs = logs
        self._handlers = handlers
        self._lock = threading.Lock()
        self._streams: set[str] = set()
        self._stream_name = f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}"

    def invoke(self, function: str, event: dict[str, Any]) -> Invocation:
        """Run one invocation; an exception from the handler is returned in `error`, as Lambda reports it."""
        handler = self._handlers[function]
        request_id = str(uuid.uuid4())
        group = f"/aws/lambda/{FUNCTION_PREFIX}{function}"
        context = LambdaContext(
            function_name=f"{FUNCTION_PREFIX}{function}",
            invoked_function_arn=function_arn(function),
            aws_request_id=request_id,
            log_group_name=group,
            log_stream_name=self._stream_name,
            deadline=time.time() + TIMEOUT_S,
        )
        result: Any = None
        error: BaseException | None = None
        with self._lock, _captured_output() as buffer:
            start = time.time()
            try:
                result = handler(event, context)
            except Exception as exc:  # the runtime reports a failed invocation instead of crashing
                error = exc
        lines = [f"START RequestId: {request_id}", *buffer.getvalue().splitlines()]
        if error is not None:
            lines.append(f"[ERROR] {type(error).__name__}: {error}")
        lines.append(f"END RequestId: {request_id}")
        self._ship(group, start, lines)
        return Invocation(function, request_id, result, error, tuple(lines))

    def _ship(self, group: str, t: float, lines: list[str]) -> None:
        if group not in self._streams:
            with contextlib.suppress(self._logs.exceptions.ResourceAlreadyExistsException):
                self._logs.create_log_group(logGroupName=group)
            self._logs.create_log_stream(logGroupName=group, logStreamName=self._stream_name)
            self._streams.add(group)
        events = [{"timestamp": int(t * 1000), "message": line} for line in lines if line.strip()]
        self._logs.put_log_events(logGroupName=group, logStreamName=self._stream_name, logEvents=events)
