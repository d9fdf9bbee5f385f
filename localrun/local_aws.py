"""Local AWS: a moto server on 127.0.0.1 with the project's SageMaker extension.

Everything that talks to AWS in the run (this process's handlers and the training subprocess) is
pointed at it through the standard environment (``AWS_ENDPOINT_URL``, fake credentials, no profile).

    with LocalAws() as aws:
        aws.client("cloudwatch").list_metrics()
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import boto3
from botocore.config import Config
from moto.moto_server.threaded_moto_server import ThreadedMotoServer

from localrun import (
    boto_models,
    moto_alarm_filters,
    moto_autoscaling,
    moto_ec2,
    moto_hyperpod,
    moto_logs_filter,
    moto_logs_insights,
    moto_metric_index,
    moto_metric_search,
    moto_sagemaker,
    moto_scheduler,
    moto_ssm,
    moto_threads,
)

REGION = moto_sagemaker.DEFAULT_REGION
# moto's own account, with fake credentials and no config or credentials file: nothing can reach a real account.
FAKE_ACCOUNT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
ACCOUNT_ID = moto_sagemaker.DEFAULT_ACCOUNT
BIND_ADDRESS = "127.0.0.1"
_CLIENT_CONFIG = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30)


@contextlib.contextmanager
def scoped_environ(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, remove) environment variables for the duration of the block, then restore them."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _set_env(key, value)
        yield
    finally:
        for key, value in saved.items():
            _set_env(key, value)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


class LocalAws:
    """A moto server on a free local port; `env` is what a process needs to use it and nothing else."""

    def __init__(self) -> None:
        self._server: ThreadedMotoServer | None = None
        self.endpoint_url = ""
        self.port = 0
        self._environ: contextlib.ExitStack | None = None
        self._client_lock = threading.Lock()  # boto3's default session is not thread-safe

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that send boto3 to this server with fake credentials, never to a real account."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, **FAKE_ACCOUNT}

    def start(self) -> LocalAws:
        """Start the server (port chosen by the OS) and point this process's environment at it."""
        boto_models.install()
        moto_sagemaker.install()
        moto_ec2.install()
        moto_metric_index.install()  # safe with moto_threads: one request at a time
        moto_metric_search.install()  # after the index: SEARCH reads each series through it
        moto_logs_insights.install()
        moto_threads.install()
        moto_alarm_filters.install()
        moto_logs_filter.install()
        moto_scheduler.install()
        moto_ssm.install()
        moto_ssm.run_in_background(True)  # the server serves one request at a time: a node's script must not hold it
        moto_autoscaling.install()
        moto_hyperpod.install()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log on the terminal
        self._server = ThreadedMotoServer(ip_address=BIND_ADDRESS, port=0, verbose=False)
        self._server.start()
        _, self.port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{BIND_ADDRESS}:{self.port}"
        self._environ = contextlib.ExitStack()
        self._environ.enter_context(scoped_environ({**self.env, "AWS_PROFILE": None}))
        return self

    def stop(self) -> None:
        """Stop the server (its socket is closed) and restore the environment."""
        if self._server is not None:
            self._server.stop()
            self._server = None
            moto_ssm.run_in_background(False)
        if self._environ is not None:
            self._environ.close()
            self._environ = None

    def client(self, service: str) -> Any:
        """A boto3 client bound to this server."""
        with self._client_lock:
            return boto3.client(service, endpoint_url=self.endpoint_url, region_name=REGION, config=_CLIENT_CONFIG)

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
