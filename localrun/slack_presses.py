"""A Slack button press as Slack sends it, for the tests and the benchmarks: the `block_actions` payload of one of an
alert's buttons, and the request signed with the app's signing secret as a Lambda Function URL delivers it.

    event = signed_request(press_payload(api, OperatorAction.STOP_NOW), time.time())   # api: has a response_url
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

from localrun.moto_world import TABLE
from stallwatch.aws.buttons import ACTIONS_BLOCK_ID, OperatorAction, action_buttons, deployment_id
from stallwatch.core.signals import JobFacts, Platform

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
CHANNEL = "C0ALERTS"
MESSAGE_TS = "1764496800.000100"
ALLOWED_USER = "U0ALLOWED"
JOB = "llama-70b-pretrain"
INCIDENT = "incident#1764496800.000"
DEPLOYMENT = deployment_id("us-east-1", TABLE)


def press_payload(
    slack_api: Any,
    action: OperatorAction,
    user: str = ALLOWED_USER,
    job: str = JOB,
    deployment: str = DEPLOYMENT,
    message_ts: str = MESSAGE_TS,
    platform: Platform = Platform.SAGEMAKER,
) -> dict[str, Any]:
    facts = JobFacts(job, platform, "InProgress", "Training", 0.0, "ml.p4d.24xlarge", 2, 8, 96)
    buttons = action_buttons(facts, INCIDENT, deployment).to_dict()
    (button,) = [b for b in buttons["elements"] if b["action_id"] == action.value]
    header = {"type": "header", "block_id": "h", "text": {"type": "plain_text", "text": "Stalled job will be stopped"}}
    return {
        "type": "block_actions",
        "user": {"id": user, "username": "ada", "team_id": "T000"},
        "team": {"id": "T000", "domain": "acme"},
        "api_app_id": "A000",
        "trigger_id": "1234.5678.abcd",
        "container": {"type": "message", "message_ts": message_ts, "channel_id": CHANNEL, "is_ephemeral": False},
        "channel": {"id": CHANNEL, "name": "ml-alerts"},
        "message": {
            "type": "message",
            "ts": message_ts,
            "text": "Stalled job will be stopped",
            "blocks": [header, buttons],
        },
        "response_url": slack_api.response_url,
        "actions": [{**button, "block_id": ACTIONS_BLOCK_ID, "action_ts": "1764496900.123456"}],
    }


def signed_request(
    payload: Any, timestamp: float, secret: str = SIGNING_SECRET, raw_body: str | None = None
) -> dict[str, Any]:
    """A Slack request signed with `secret`, as a Lambda Function URL delivers it (body base64-encoded)."""
    body = raw_body if raw_body is not None else urlencode({"payload": json.dumps(payload)})
    ts = str(int(timestamp))
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/x-www-form-urlencoded",
            "user-agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            "x-slack-request-timestamp": ts,
            "x-slack-signature": signature,
            "host": "abcdefghijklmnop.lambda-url.us-east-1.on.aws",
        },
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "abcdefghijklmnop",
            "domainName": "abcdefghijklmnop.lambda-url.us-east-1.on.aws",
            "domainPrefix": "abcdefghijklmnop",
            "http": {
                "method": "POST",
                "path": "/",
                "protocol": "HTTP/1.1",
                "sourceIp": "3.80.1.2",
                "userAgent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            },
            "requestId": "c1b2e3f4-0000-4000-8000-000000000001",
            "routeKey": "$default",
            "stage": "$default",
            "time": "30/Nov/2026:10:00:00 +0000",
            "timeEpoch": int(timestamp * 1000),
        },
        "body": base64.b64encode(body.encode()).decode(),
        "isBase64Encoded": True,
    }
