"""A small moto extension: Invoke runs the function's own handler in this process, as Lambda would run its asset.

moto 5.2.5 runs an invoked function in Docker (or answers a canned result without it). After `install()`, Invoke of a
function whose handler is one of the asset's (``handlers.<module>.handler``) imports that handler and calls it with
the function's environment variables (and this process's AWS settings, which point at moto), a Lambda context, and
the payload; it publishes the function's ``AWS/Lambda`` ``Invocations`` and ``Errors`` metrics, as Lambda does. A
handler that raises answers as Lambda does: ``FunctionError: Unhandled`` and the error's type and message. The
functions' container is cold on each invoke (the runtime is built again from its environment).

    from localrun import moto_lambda_invoke
    moto_lambda_invoke.install()
    boto3.client("lambda").invoke(FunctionName=name, Payload=b'{"stallwatch_test_alert": {...}}')
"""

from __future__ import annotations

import importlib
import json
import time
import traceback
import uuid
from datetime import UTC, datetime
from typing import Any

from moto.awslambda.models import LambdaFunction
from moto.cloudwatch.models import cloudwatch_backends

from localrun.lambda_runtime import LambdaContext
from localrun.local_aws import scoped_environ

HANDLER_PACKAGE = "handlers."  # the asset's entry points: anything else keeps moto's own behaviour
LAMBDA_NAMESPACE = "AWS/Lambda"
TIMEOUT_S = 900

_original: Any = None


def _handler(spec: str) -> Any:
    module, _, function = spec.rpartition(".")
    return getattr(importlib.import_module(module), function)


def _publish(function: LambdaFunction, errored: bool) -> None:
    """The invocation's AWS/Lambda metrics, by function name."""
    now = datetime.now(UTC).replace(tzinfo=None)  # moto keeps datapoints in naive UTC, as it parses requests
    dimensions = [{"Name": "FunctionName", "Value": function.function_name}]
    data = [
        {"MetricName": name, "Value": value, "Dimensions": dimensions, "Timestamp": now, "Unit": "Count"}
        for name, value in (("Invocations", 1.0), ("Errors", 1.0 if errored else 0.0))
    ]
    cloudwatch_backends[function.account_id][function.region].put_metric_data(LAMBDA_NAMESPACE, data)


def _invoke(self: LambdaFunction, body: str, request_headers: Any, response_headers: Any) -> str | bytes:
    if not self.handler.startswith(HANDLER_PACKAGE):
        return _original(self, body, request_headers, response_headers)
    from stallwatch.runtime import environment  # imported here: the asset's code, only for its own handlers

    event = json.loads(body) if body else {}
    context = LambdaContext(
        function_name=self.function_name,
        invoked_function_arn=self.function_arn,
        aws_request_id=str(uuid.uuid4()),
        log_group_name=f"/aws/lambda/{self.function_name}",
        log_stream_name=f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}",
        deadline=time.time() + TIMEOUT_S,
    )
    environment.runtime.cache_clear()  # a cold container: the runtime is read from this function's environment
    try:
        with scoped_environ(dict(self.environment_vars)):
            result = _handler(self.handler)(event, context)
    except Exception as exc:  # the function failed: Lambda answers with its error, not a crash of the service
        response_headers["x-amz-function-error"] = "Unhandled"
        _publish(self, errored=True)
        error = {
            "errorType": type(exc).__name__,
            "errorMessage": str(exc),
            "stackTrace": traceback.format_tb(exc.__traceback__),
        }
        return json.dumps(error)
    finally:
        environment.runtime.cache_clear()
    _publish(self, errored=False)
    return json.dumps(result, default=str)


def install() -> None:
    global _original
    if _original is None:
        _original = LambdaFunction.invoke
        LambdaFunction.invoke = _invoke  # type: ignore[method-assign]
