"""A Lambda-backed custom resource's answer to CloudFormation: a PUT of JSON to the request's pre-signed ResponseURL
(CloudFormation waits for it, an hour at most, before it fails the resource).

    answer(request_url, CustomResourceAnswer("SUCCESS", physical_id, stack_id, request_id, logical_id, data={...}))
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Literal

from stallwatch.aws.observability import logger

ANSWER_TIMEOUT_S = 10
# CloudFormation takes an answer of at most 4,096 bytes: the reason and each datum are cut to leave room for the ids.
REASON_MAX = 1000


@dataclass(frozen=True)
class CustomResourceAnswer:
    status: Literal["SUCCESS", "FAILED"]
    physical_resource_id: str
    stack_id: str
    request_id: str
    logical_resource_id: str
    reason: str = ""
    data: dict[str, str] = field(default_factory=dict)

    def body(self) -> bytes:
        answer: dict[str, Any] = {
            "Status": self.status,
            "Reason": self.reason[:REASON_MAX],
            "PhysicalResourceId": self.physical_resource_id,
            "StackId": self.stack_id,
            "RequestId": self.request_id,
            "LogicalResourceId": self.logical_resource_id,
            "Data": {key: value[:REASON_MAX] for key, value in self.data.items()},
        }
        return json.dumps(answer).encode()


def answer(response_url: str, reply: CustomResourceAnswer) -> bool:
    """PUT the answer; False (logged) if it could not be delivered: CloudFormation then times the resource out."""
    request = urllib.request.Request(response_url, data=reply.body(), method="PUT", headers={"Content-Type": ""})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as response:
            return 200 <= response.status < 300
    except OSError as exc:
        logger.error("could not answer CloudFormation", extra={"error": str(exc), "request": reply.request_id})
        return False
