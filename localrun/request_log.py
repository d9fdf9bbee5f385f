"""Every AWS request a process makes, as JSON Lines: what the request-limits test reads of the demo's runs.

    python -m localrun --record-requests DIR        # the demo and its training processes, one file per process
    with recorded(requests.append): ...              # in-process: each call's (service, operation, params)
    read_requests(DIR)                               # [(service, operation, params), ...]

The calls are taken at botocore's one entry point of every API call (``BaseClient._make_api_call``), with the
parameters as the caller gave them, before botocore validates them: every client, thread and page. A training
process records through `SITE_DIR` on its ``PYTHONPATH`` (a ``sitecustomize`` that starts recording when
`RECORD_DIR_ENV` is set), so neither the agent nor the training script knows of it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from botocore.client import BaseClient

RECORD_DIR_ENV = "LOCALRUN_RECORD_REQUESTS"
SITE_DIR = Path(__file__).with_name("request_site")
DATETIME_KEY = "$datetime"
BYTES_KEY = "$bytes"

Call = tuple[str, str, dict[str, Any]]
_patch_lock = threading.Lock()


@contextlib.contextmanager
def recorded(on_call: Callable[[Call], None]) -> Iterator[None]:
    """Within the block, `on_call` gets every API call any boto3 client of this process makes."""
    with _patch_lock:
        original = BaseClient._make_api_call

        def record(self: BaseClient, operation_name: str, api_params: dict[str, Any]) -> Any:
            on_call((self.meta.service_model.service_name, operation_name, dict(api_params)))
            return original(self, operation_name, api_params)

        BaseClient._make_api_call = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        with _patch_lock:
            BaseClient._make_api_call = original  # type: ignore[method-assign]


@contextlib.contextmanager
def recorded_to(directory: Path) -> Iterator[None]:
    """Record this process's calls into `directory`, one JSON line per call."""
    directory.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    with (directory / f"requests-{os.getpid()}.jsonl").open("a", encoding="utf-8") as out:

        def write(call: Call) -> None:
            service, operation, params = call
            line = json.dumps({"service": service, "operation": operation, "params": params}, default=_encode)
            with lock:
                out.write(line + "\n")
                out.flush()

        with recorded(write):
            yield


def child_env(env: dict[str, str]) -> dict[str, str]:
    """A child process's environment: when it carries `RECORD_DIR_ENV` (the demo records), `SITE_DIR` first on its
    ``PYTHONPATH``, so the child records its calls too; else unchanged."""
    if not env.get(RECORD_DIR_ENV):
        return env
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE_DIR), env.get("PYTHONPATH")]))}


def record_from_env() -> None:
    """In a child process: record its calls for the rest of its life, if `RECORD_DIR_ENV` names a directory."""
    directory = os.environ.get(RECORD_DIR_ENV)
    if directory:
        recorder = recorded_to(Path(directory))
        recorder.__enter__()  # kept open until the process exits; each line is flushed as it is written


def read_requests(directory: Path) -> list[Call]:
    """Every call recorded in `directory`, datetimes as datetimes."""
    calls = []
    for path in sorted(directory.glob("requests-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                call = json.loads(line, object_hook=_decode)
                calls.append((call["service"], call["operation"], call["params"]))
    return calls


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {DATETIME_KEY: value.isoformat()}
    if isinstance(value, bytes | bytearray):
        return {BYTES_KEY: base64.b64encode(bytes(value)).decode()}
    return str(value)


def _decode(value: dict[str, Any]) -> Any:
    if DATETIME_KEY in value:
        return datetime.fromisoformat(value[DATETIME_KEY])
    if BYTES_KEY in value:
        return base64.b64decode(value[BYTES_KEY])
    return value
