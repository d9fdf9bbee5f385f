"""The Slack buttons end to end on moto: real signed requests in the Function URL event shape reach the handler;
only a valid request from an allowed user changes anything."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from botocore.stub import ANY, Stubber

from handlers import on_alarm, slack_interactions, sweeper
from localrun import moto_sagemaker
from localrun.moto_world import FUTURE_MIN, MINUTE, ROLE_ARN, LambdaContext, World, alarm_event, scheduled_event
from localrun.slack_presses import (
    ALLOWED_USER,
    CHANNEL,
    DEPLOYMENT,
    INCIDENT,
    JOB,
    MESSAGE_TS,
    SIGNING_SECRET,
    press_payload,
    signed_request,
)
from localrun.slack_receiver import STOP_POLL_S
from stallwatch.aws import actions
from stallwatch.aws.buttons import ACTIONS_BLOCK_ID, ButtonValue, OperatorAction, action_buttons, deployment_id
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.observability import metrics
from stallwatch.aws.press_reports import PRESS_REPORT_PREFIX, PressReports
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.signals import JobFacts, Platform
from stallwatch.runtime import interactions
from stallwatch.runtime.interactions import DEFERRED_EVENT_KEY, DeferredPress, Interactions

BOT_TOKEN = "xoxb-test-token"
GROUP_MEMBER = "U0ONCALL"
STRANGER = "U0STRANGER"
ONCALL_GROUP = "S0ONCALL"
ENFORCE = {"stallwatch:mode": "enforce"}


class SlackApi:
    """Slack on 127.0.0.1: Web API methods under /api/, and response_url posts under /actions/."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.groups: dict[str, list[str]] = {ONCALL_GROUP: [GROUP_MEMBER]}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                self._answer(url.path, params)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    body = json.loads(raw)
                else:
                    body = {k: v[0] for k, v in parse_qs(raw).items()}
                self._answer(urlparse(self.path).path, body)

            def _answer(self, path: str, body: dict[str, Any]) -> None:
                api.calls.append((path, body))
                if path.startswith("/actions/"):
                    reply = b"ok"
                elif path == "/api/usergroups.users.list":
                    reply = json.dumps({"ok": True, "users": api.groups.get(body.get("usergroup"), [])}).encode()
                else:
                    reply = json.dumps({"ok": True, "channel": CHANNEL, "ts": MESSAGE_TS}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                """No access log on stderr."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(STOP_POLL_S,), daemon=True)

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def response_url(self) -> str:
        return f"{self.base}/actions/T000/1234/abcd"

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


@pytest.fixture
def slack_api() -> Iterator[SlackApi]:
    api = SlackApi()
    api.thread.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


def _use_secret(rt, **secret: str) -> None:
    rt.clients.secretsmanager.put_secret_value(SecretId=rt.notifier.secret_arn, SecretString=json.dumps(secret))


@pytest.fixture
def endpoint(rt, world: World, slack_api: SlackApi, monkeypatch: pytest.MonkeyPatch) -> Interactions:
    """The endpoint in webhook mode, with one allowed user and one allowed group, and an enforced job running."""
    _use_secret(rt, webhook_url=f"{slack_api.base}/services/T000/B000/XXXX", signing_secret=SIGNING_SECRET)
    rt.config = StallwatchConfig.model_validate(
        {"slack": {"allowed_user_ids": [ALLOWED_USER], "allowed_group_ids": [ONCALL_GROUP]}}
    )
    world.create_job(JOB, hosts=2, tags=ENFORCE)
    deferred: list[DeferredPress] = []  # the async self-invocations asked for; `_call` runs them
    instance = Interactions(rt, slack_api_url=f"{slack_api.base}/api/", defer=deferred.append)
    monkeypatch.setattr(interactions, "endpoint", lambda: instance)
    return instance


def _table(rt) -> list[dict[str, Any]]:
    items = rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"]
    return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))


def _state(rt):
    return rt.states.load(job_key("sagemaker", JOB)).state


def _audits(rt) -> list[dict[str, Any]]:
    return rt.audit.records(job_key("sagemaker", JOB), "audit")


def _job_items(rt) -> list[dict[str, Any]]:
    """The table without the claims on Slack requests (every verified request leaves one) and on posting back a
    failed press."""
    claims = ("event#slack#", PRESS_REPORT_PREFIX)
    return [item for item in _table(rt) if not item["pk"]["S"].startswith(claims)]


def _answer(event: dict, context) -> tuple[int, dict[str, Any]]:
    """What Slack gets back from the Function URL."""
    response = slack_interactions.handler(event, context)
    assert response["headers"]["Content-Type"] == "application/json"
    return response["statusCode"], json.loads(response["body"])


def _call(event: dict, context) -> tuple[int, dict[str, Any]]:
    """Slack's answer, then the async self-invocation it asked for, as Lambda would run it: the answer's status,
    and what the deferred work did (the answer's body when nothing was deferred)."""
    status, body = _answer(event, context)
    deferred = interactions.endpoint().defer.__self__
    while deferred:
        assert (status, body) == (200, {"status": "accepted"})
        body = slack_interactions.handler({DEFERRED_EVENT_KEY: deferred.pop(0).model_dump()}, context)
    return status, body


# ---- valid, allowed requests ----------------------------------------------------------------------------------


def test_snooze_1h_sets_the_snooze_audits_the_user_and_updates_the_message(rt, endpoint, slack_api, context) -> None:
    # Given a warning on Slack in webhook mode
    now = rt.clock()

    # When an allowed user presses "Snooze 1 h"
    status, body = _call(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), now), context)

    # Then the job is snoozed for an hour, audited with the Slack user, and the message says who did it
    assert (status, body["status"]) == (200, "applied")
    assert _state(rt).snoozed_until == pytest.approx(now + 3600)
    (audit,) = _audits(rt)
    assert audit["record"]["operator"] == ALLOWED_USER
    assert audit["record"]["action"] == OperatorAction.SNOOZE_1H.value
    assert audit["record"]["incident"] == INCIDENT
    assert audit["outcome"]["slack"]["ok"] is True
    ((path, update),) = slack_api.calls
    assert path.startswith("/actions/")
    assert update["replace_original"] is True
    assert all(block.get("block_id") != ACTIONS_BLOCK_ID for block in update["blocks"])
    assert "Snoozed until" in str(update["blocks"])
    assert f"<@{ALLOWED_USER}>" in str(update["blocks"])


def test_slack_unreachable_after_a_press_still_applies_and_audits_it(rt, endpoint, slack_api, context) -> None:
    # Given a press whose response_url cannot be reached (Slack down)
    payload = press_payload(slack_api, OperatorAction.SNOOZE_4H)
    payload["response_url"] = "http://127.0.0.1:9/actions/T000/1234/abcd"

    # When it reaches the endpoint
    status, body = _call(signed_request(payload, rt.clock()), context)

    # Then the snooze holds and the audit record says the message could not be updated
    assert (status, body["slack"]["ok"]) == (200, False)
    assert _state(rt).snoozed_until == pytest.approx(rt.clock() + 4 * 3600)
    (audit,) = _audits(rt)
    assert audit["outcome"]["slack"]["ok"] is False


def test_snooze_4h_snoozes_for_four_hours(rt, endpoint, slack_api, context) -> None:
    # Given a warning; When an allowed user presses "Snooze 4 h"
    now = rt.clock()
    status, _ = _call(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_4H), now), context)

    # Then the job is snoozed for four hours
    assert status == 200
    assert _state(rt).snoozed_until == pytest.approx(now + 4 * 3600)


def test_not_stalled_doubles_the_thresholds_and_voids_the_warning(rt, endpoint, slack_api, world, context) -> None:
    # Given a job that was warned (its state remembers the stall and the warning)
    key = job_key("sagemaker", JOB)
    read = rt.states.load(key)
    warned = read.state.with_(stall_since=rt.clock() - 600, warned_at=rt.clock() - 60, alerted=("hang",))
    rt.states.commit(key, read, type(read)(warned, 0, INCIDENT), {"at": rt.clock()}, rt.clock())

    # When an allowed user presses "Not stalled"
    status, _ = _call(signed_request(press_payload(slack_api, OperatorAction.NOT_STALLED), rt.clock()), context)

    # Then the thresholds are doubled for the rest of the run and the pending stop is void
    assert status == 200
    state = _state(rt)
    assert state.threshold_factor == 2.0
    assert (state.stall_since, state.warned_at, state.alerted) == (None, None, ())
    assert world.status(JOB) == "InProgress"


def test_stop_now_by_a_group_member_stops_the_job_and_updates_the_message_in_place(
    rt, endpoint, slack_api, world, context
) -> None:
    # Given bot-token mode and a user who is allowed through the on-call user group
    _use_secret(rt, bot_token=BOT_TOKEN, channel=CHANNEL, signing_secret=SIGNING_SECRET)

    # When the user presses "Stop now"
    payload = press_payload(slack_api, OperatorAction.STOP_NOW, user=GROUP_MEMBER)
    status, body = _call(signed_request(payload, rt.clock()), context)

    # Then the job is stopping, the stop is audited with the user, and the message is updated with chat.update
    assert (status, body["stop"]["ok"]) == (200, True)
    assert world.status(JOB) == "Stopping"
    assert _state(rt).stopped_at == pytest.approx(rt.clock())
    (audit,) = _audits(rt)
    assert (audit["record"]["operator"], audit["outcome"]["stop"]["ok"]) == (GROUP_MEMBER, True)
    assert slack_api.paths() == ["/api/usergroups.users.list", "/api/chat.update"]
    update = slack_api.calls[1][1]
    assert (update["channel"], update["ts"]) == (CHANNEL, MESSAGE_TS)
    assert "Stop requested by" in str(update["blocks"])
    assert all(block.get("block_id") != ACTIONS_BLOCK_ID for block in update["blocks"])


def test_a_stop_that_failed_is_told_with_its_answer_quoted_as_words(
    rt, endpoint, slack_api, world, context, monkeypatch
) -> None:
    # Given bot-token mode, and a stop whose answer quotes Slack markup (an AWS error echoing a tag, say)
    _use_secret(rt, bot_token=BOT_TOKEN, channel=CHANNEL, signing_secret=SIGNING_SECRET)
    detail = "AccessDenied: <!channel> <https://evil.example|Snooze 1 h> & more"
    monkeypatch.setattr(
        interactions.actions, "stop", lambda clients, facts: actions.StopResult(ok=False, detail=detail)
    )

    # When an allowed user presses "Stop now"
    _call(signed_request(press_payload(slack_api, OperatorAction.STOP_NOW), rt.clock()), context)

    # Then the message says who pressed and that the stop failed, the answer escaped (Slack's entities)
    (update,) = [body for path, body in slack_api.calls if path == "/api/chat.update"]
    line = update["blocks"][-1]["elements"][0]["text"]
    assert line == (
        f":x: Stop requested by <@{ALLOWED_USER}> FAILED: "
        "AccessDenied: &lt;!channel&gt; &lt;https://evil.example|Snooze 1 h&gt; &amp; more"
    )


def test_stop_now_on_a_job_not_tagged_for_stops_changes_nothing(rt, endpoint, slack_api, world, context) -> None:
    # Given a running job without the `stallwatch:mode=enforce` tag (stops require it by default)
    world.create_job("untagged-job", hosts=1)

    # When an allowed user presses "Stop now" on its alert
    payload = press_payload(slack_api, OperatorAction.STOP_NOW, job="untagged-job")
    status, body = _call(signed_request(payload, rt.clock()), context)

    # Then the code refuses, as IAM would: the job runs on, nothing is written, and only the presser is told why
    assert (status, body["status"]) == (200, "not_permitted")
    assert world.status("untagged-job") == "InProgress"
    assert rt.states.load(job_key(Platform.SAGEMAKER, "untagged-job")).version == 0
    (reply,) = [body for path, body in slack_api.calls if path.startswith("/actions/")]
    assert reply["response_type"] == "ephemeral"
    assert "stallwatch:mode=enforce" in reply["text"]


def _seed_hang(world: World, end_min: float = FUTURE_MIN) -> None:
    """The enforced job hung 40 minutes ago: no step, GPUs pinned at 100 % while power falls, logs quiet; the
    metrics go on until `end_min` (minutes before the test's start, negative: after it)."""
    last = 40
    world.agent_job(JOB, "Step", world.every_minute(110, lambda m: 110 - max(m, last), end_min))
    world.agent_job(JOB, "Steps", world.every_minute(110, lambda m: 1.0 if m > last else 0.0, end_min))
    world.agent_job(JOB, "LastStepAge", world.every_minute(110, lambda m: max(last - m, 0) * MINUTE, end_min))
    for host in ("algo-1", "algo-2"):
        world.host_gpu(JOB, host, world.every_minute(110, 100.0, end_min))
        power = world.every_minute(110, lambda m: 390.0 if m > last else 95.0, end_min)
        world.agent_host(JOB, host, "GPUPowerWatts", power)
        world.progress_logs(JOB, host, until_min=last)


def _warn(rt, world: World, context) -> None:
    _seed_hang(world)
    alarm = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", JOB, alarms.PROGRESS, None)
    assert on_alarm.handler(alarm_event(alarm), context)["action"] == "warn"


def test_a_snoozed_warning_is_not_followed_by_a_stop(rt, endpoint, slack_api, world, context) -> None:
    # Given a hung job that was warned
    _warn(rt, world, context)

    # When an allowed user snoozes it for an hour, and the sweeper runs after the stop grace period
    assert _call(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)[0] == 200
    rt.clock.advance(6 * MINUTE)
    sweeper.handler(scheduled_event(), context)

    # Then the job keeps running
    assert world.status(JOB) == "InProgress"
    assert "stop" not in [a["record"]["action"] for a in _audits(rt)]


def test_not_stalled_makes_the_watchdog_warn_afresh_instead_of_stopping(
    rt, endpoint, slack_api, world, context
) -> None:
    # Given a hung job that was warned
    _warn(rt, world, context)

    # When an allowed user says it is not stalled, and the sweeper runs after the stop grace period
    assert _call(signed_request(press_payload(slack_api, OperatorAction.NOT_STALLED), rt.clock()), context)[0] == 200
    rt.clock.advance(6 * MINUTE)
    summary = sweeper.handler(scheduled_event(), context)

    # Then the job is not stopped: at the doubled thresholds it gets a new warning first
    assert world.status(JOB) == "InProgress"
    assert [o["action"] for o in summary["redecided"]] == ["warn"]


# ---- rejected requests: nothing changes -----------------------------------------------------------------------


def test_bad_signature_is_rejected_and_changes_nothing(rt, endpoint, slack_api, world, context) -> None:
    # Given a request signed with another secret
    event = signed_request(
        press_payload(slack_api, OperatorAction.STOP_NOW), rt.clock(), secret="not-the-signing-secret"
    )

    # When it reaches the endpoint
    status, body = _call(event, context)

    # Then it is refused, and the table, Slack and the job are untouched
    assert status == 401
    assert "x-slack-signature" in body["error"]
    assert (_table(rt), slack_api.calls, world.status(JOB)) == ([], [], "InProgress")


def test_tampered_body_is_rejected(rt, endpoint, slack_api, context) -> None:
    # Given a validly signed "Snooze 1 h" whose body was changed to "Stop now" in flight
    event = signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock())
    tampered = urlencode({"payload": json.dumps(press_payload(slack_api, OperatorAction.STOP_NOW))})
    event["body"] = base64.b64encode(tampered.encode()).decode()

    # When it reaches the endpoint; Then it is refused and nothing changes
    assert _call(event, context)[0] == 401
    assert (_table(rt), slack_api.calls) == ([], [])


def test_expired_timestamp_is_rejected_and_changes_nothing(rt, endpoint, slack_api, context) -> None:
    # Given a correctly signed request from six minutes ago
    event = signed_request(press_payload(slack_api, OperatorAction.SNOOZE_4H), rt.clock() - 360)

    # When it reaches the endpoint
    status, body = _call(event, context)

    # Then it is refused as outside the 5-minute window, and nothing changes
    assert status == 401
    assert "window" in body["error"]
    assert (_table(rt), slack_api.calls) == ([], [])


def test_replayed_request_is_rejected_and_changes_nothing(rt, endpoint, slack_api, context) -> None:
    # Given a valid "Snooze 1 h" that was applied
    event = signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock())
    assert _call(event, context)[0] == 200
    table, calls = _table(rt), list(slack_api.calls)

    # When the same signed request arrives again a minute later (inside the signature window)
    rt.clock.advance(60)
    status, body = _call(event, context)

    # Then it is refused as a replay: no second snooze, audit record or Slack update
    assert status == 409
    assert "already handled" in body["error"]
    assert (_table(rt), slack_api.calls) == (table, calls)


def test_user_off_the_allow_list_gets_an_ephemeral_not_allowed_and_changes_nothing(
    rt, endpoint, slack_api, world, context
) -> None:
    # Given bot-token mode and a user who is neither allowed by id nor in an allowed group
    _use_secret(rt, bot_token=BOT_TOKEN, channel=CHANNEL, signing_secret=SIGNING_SECRET)

    # When the user presses "Stop now"
    status, body = _call(
        signed_request(press_payload(slack_api, OperatorAction.STOP_NOW, user=STRANGER), rt.clock()), context
    )

    # Then only the user is told "not allowed"; the job runs on and nothing is written
    assert (status, body["status"]) == (200, "not_allowed")
    assert slack_api.paths() == ["/api/usergroups.users.list", "/actions/T000/1234/abcd"]
    ephemeral = slack_api.calls[1][1]
    assert (ephemeral["response_type"], ephemeral["replace_original"]) == ("ephemeral", False)
    assert "not allowed" in ephemeral["text"]
    assert (_job_items(rt), world.status(JOB)) == ([], "InProgress")


def test_group_membership_is_cached_between_presses(rt, endpoint, slack_api, context) -> None:
    # Given bot-token mode; When a stranger presses twice
    _use_secret(rt, bot_token=BOT_TOKEN, channel=CHANNEL, signing_secret=SIGNING_SECRET)
    for action in (OperatorAction.SNOOZE_1H, OperatorAction.SNOOZE_4H):
        _call(signed_request(press_payload(slack_api, action, user=STRANGER), rt.clock()), context)

    # Then the group's members were read from Slack once
    assert slack_api.paths().count("/api/usergroups.users.list") == 1


@pytest.mark.parametrize(
    ("raw_body", "error"),
    [
        ("payload=%7Bnot+json", "payload"),
        ("token=abc&team_id=T000", "form field 'payload'"),
        (urlencode({"payload": json.dumps({"type": "view_submission"})}), "payload.type"),
    ],
)
def test_malformed_payload_is_rejected_and_changes_nothing(
    rt, endpoint, slack_api, context, raw_body: str, error: str
) -> None:
    # Given a correctly signed request whose payload is not a button press
    event = signed_request(None, rt.clock(), raw_body=raw_body)

    # When it reaches the endpoint
    status, body = _call(event, context)

    # Then it is refused with the bad field named, and nothing changes
    assert status == 400
    assert error in body["error"]
    assert (_table(rt), slack_api.calls) == ([], [])


def test_unknown_button_is_rejected(rt, endpoint, slack_api, context) -> None:
    # Given a signed press of a button Stallwatch does not have
    payload = press_payload(slack_api, OperatorAction.SNOOZE_1H)
    payload["actions"][0]["action_id"] = "stallwatch_delete_everything"

    # When it reaches the endpoint; Then it is refused, naming the action id, and nothing changes
    status, body = _call(signed_request(payload, rt.clock()), context)
    assert status == 400
    assert "action_id" in body["error"]
    assert (_table(rt), slack_api.calls) == ([], [])


def test_event_that_is_not_a_function_url_request_is_rejected(rt, endpoint, slack_api, context) -> None:
    # Given an event without the Function URL shape; When it reaches the handler; Then 400 and nothing changes
    status, body = _call({"body": "payload=x"}, context)
    assert status == 400
    assert "Function URL" in body["error"]
    assert (_table(rt), slack_api.calls) == ([], [])


# ---- the buttons ----------------------------------------------------------------------------------------------


def test_action_buttons_carry_the_job_and_incident() -> None:
    # Given an EC2 job's alert
    facts = JobFacts("i-0abc12345", Platform.EC2, "InProgress", None, 0.0, "p5.48xlarge", 1, 8, 192)

    # When its buttons are rendered
    block = action_buttons(facts, INCIDENT, DEPLOYMENT).to_dict()

    # Then there are the four buttons, each naming the job, its platform and the incident; Stop asks to confirm
    assert block["block_id"] == ACTIONS_BLOCK_ID
    assert [e["action_id"] for e in block["elements"]] == [a.value for a in OperatorAction]
    assert [e["text"]["text"] for e in block["elements"]] == ["Snooze 1 h", "Snooze 4 h", "Stop now", "Not stalled"]
    values = {ButtonValue.model_validate_json(e["value"]) for e in block["elements"]}
    assert values == {ButtonValue(deployment=DEPLOYMENT, job="i-0abc12345", platform=Platform.EC2, incident=INCIDENT)}
    stop = block["elements"][2]
    assert (stop["style"], "confirm" in stop) == ("danger", True)


# ---- hostile requests: always a 4xx, never an exception -------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-slack-signature", "v0=" + "é" * 64),  # non-ASCII: hmac.compare_digest would raise TypeError
        ("x-slack-signature", "v0=" + "z" * 64),
        ("x-slack-signature", "v0=" + "a" * 100_000),
        ("x-slack-signature", ""),
        ("x-slack-request-timestamp", "9" * 5000),  # int() refuses more than 4,300 digits
        ("x-slack-request-timestamp", "١٧٦٤٤٩٦٨٠٠"),  # Arabic-Indic digits: str.isdigit() says yes
        ("x-slack-request-timestamp", " 1764496800"),
        ("x-slack-request-timestamp", "-1"),
        ("x-slack-request-timestamp", "1e9"),
    ],
)
def test_odd_signature_headers_get_a_401_and_change_nothing(
    rt, endpoint, slack_api, world, context, header: str, value: str
) -> None:
    # Given a valid request whose header was replaced by hostile bytes
    event = signed_request(press_payload(slack_api, OperatorAction.STOP_NOW), rt.clock())
    event["headers"][header] = value

    # When it reaches the endpoint, Then it is refused as unauthenticated, and nothing changes
    status, body = _call(event, context)
    assert (status, body["status"]) == (401, "rejected")
    assert header in body["error"]
    assert (_table(rt), slack_api.calls, world.status(JOB)) == ([], [], "InProgress")


@pytest.mark.parametrize("body", [b"\xff\xfe\x00payload=", b"payload=" + b"\x80" * 10_000, b"x" * 1_000_000])
def test_unsigned_bodies_of_any_bytes_and_size_get_a_401(rt, endpoint, slack_api, context, body: bytes) -> None:
    # Given a request carrying arbitrary bytes, signed with another secret
    event = signed_request(None, rt.clock(), secret="not-the-signing-secret", raw_body="")
    event["body"] = base64.b64encode(body).decode()

    # When it reaches the endpoint, Then 401 and nothing changes
    assert _call(event, context)[0] == 401
    assert (_table(rt), slack_api.calls) == ([], [])


def test_a_validly_signed_body_that_is_not_utf8_is_malformed(rt, endpoint, slack_api, context) -> None:
    # Given bytes that are not UTF-8, correctly signed (the signature covers bytes, not text)
    ts = str(int(rt.clock()))
    raw = b"payload=\xff"
    digest = hmac.new(SIGNING_SECRET.encode(), b"v0:" + ts.encode() + b":" + raw, hashlib.sha256).hexdigest()
    event = signed_request(None, rt.clock(), raw_body="")
    event["headers"].update({"x-slack-request-timestamp": ts, "x-slack-signature": f"v0={digest}"})
    event["body"] = base64.b64encode(raw).decode()

    # When it reaches the endpoint, Then 400 and nothing changes
    status, body = _call(event, context)
    assert (status, body["error"]) == (400, "the body is not UTF-8")
    assert (_table(rt), slack_api.calls) == ([], [])


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_only_post_is_accepted(rt, endpoint, slack_api, world, context, method: str) -> None:
    # Given a correctly signed "Stop now" sent with another method
    event = signed_request(press_payload(slack_api, OperatorAction.STOP_NOW), rt.clock())
    event["requestContext"]["http"]["method"] = method

    # When it reaches the endpoint, Then 405 and nothing changes
    status, body = _call(event, context)
    assert status == 405
    assert method in body["error"]
    assert (_table(rt), slack_api.calls, world.status(JOB)) == ([], [], "InProgress")


# ---- which jobs a button may act on ----------------------------------------------------------------------------


def _ephemeral(slack_api: SlackApi) -> str:
    (reply,) = [body for path, body in slack_api.calls if path.startswith("/actions/")]
    assert reply["response_type"] == "ephemeral"
    return reply["text"]


def test_a_button_for_a_job_in_another_region_changes_nothing(rt, endpoint, slack_api, context) -> None:
    # Given a running job of the same account in another region (this deployment watches us-east-1)
    AwsClients(region="us-west-2").sagemaker.create_training_job(
        TrainingJobName="west-job",
        AlgorithmSpecification={"TrainingImage": "train:latest", "TrainingInputMode": "File"},
        RoleArn=ROLE_ARN,
        OutputDataConfig={"S3OutputPath": "s3://bucket/out"},
        ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 86400},
    )

    # When an allowed user presses "Snooze 4 h" on a button naming it
    status, body = _call(
        signed_request(press_payload(slack_api, OperatorAction.SNOOZE_4H, job="west-job"), rt.clock()), context
    )

    # Then nothing is written and only the presser is told why
    assert (status, body["status"]) == (200, "not_watched")
    assert "not a job in this account and region" in _ephemeral(slack_api)
    assert _job_items(rt) == []


def test_a_button_naming_another_accounts_job_arn_is_refused(rt, endpoint, slack_api, context) -> None:
    # Given a button value carrying another account's training job ARN instead of a job name
    payload = press_payload(slack_api, OperatorAction.NOT_STALLED)
    value = json.loads(payload["actions"][0]["value"])
    value["job"] = "arn:aws:sagemaker:us-east-1:999999999999:training-job/llama"
    payload["actions"][0]["value"] = json.dumps(value)

    # When it reaches the endpoint, Then it is malformed and nothing changes
    status, body = _call(signed_request(payload, rt.clock()), context)
    assert status == 400
    assert "not a sagemaker job name" in body["error"]
    assert (_table(rt), slack_api.calls) == ([], [])


def test_a_button_of_another_deployment_changes_nothing(rt, endpoint, slack_api, context) -> None:
    # Given an alert posted by another Stallwatch deployment (another table) about a job of the same name
    payload = press_payload(slack_api, OperatorAction.SNOOZE_1H, deployment=deployment_id("us-east-1", "other-table"))

    # When an allowed user presses its "Snooze 1 h", Then nothing is written
    status, body = _call(signed_request(payload, rt.clock()), context)
    assert (status, body["status"]) == (200, "not_watched")
    assert "another Stallwatch deployment" in _ephemeral(slack_api)
    assert _job_items(rt) == []


def test_a_button_for_a_job_that_ended_and_is_not_in_the_table_changes_nothing(
    rt, endpoint, slack_api, world, context
) -> None:
    # Given a job of this region that completed, and that the table does not know (its state was cleared)
    moto_sagemaker.set_training_job_status(JOB, "Completed", "Completed")

    # When an allowed user presses "Not stalled", Then no state item is created
    status, body = _call(signed_request(press_payload(slack_api, OperatorAction.NOT_STALLED), rt.clock()), context)
    assert (status, body["status"]) == (200, "not_watched")
    assert _job_items(rt) == []


# ---- the same button twice, snoozes that end -------------------------------------------------------------------


def test_not_stalled_pressed_twice_on_one_alert_doubles_the_thresholds_once(rt, endpoint, slack_api, context) -> None:
    # Given an alert on which "Not stalled" was pressed
    assert _call(signed_request(press_payload(slack_api, OperatorAction.NOT_STALLED), rt.clock()), context)[1][
        "status"
    ] == ("applied")

    # When it is pressed again a few seconds later (a new, validly signed request)
    rt.clock.advance(5)
    status, body = _call(signed_request(press_payload(slack_api, OperatorAction.NOT_STALLED), rt.clock()), context)

    # Then the second press does nothing new: the thresholds are doubled once, one audit record
    assert (status, body["status"]) == (200, "already_applied")
    assert _state(rt).threshold_factor == 2.0
    assert len(_audits(rt)) == 1
    assert "already pressed" in slack_api.calls[-1][1]["text"]

    # And the same button on a newer alert of the job acts again
    payload = press_payload(slack_api, OperatorAction.NOT_STALLED, message_ts="1764500400.000200")
    assert _call(signed_request(payload, rt.clock()), context)[1]["status"] == "applied"
    assert _state(rt).threshold_factor == 4.0


def test_when_a_snooze_ends_a_fresh_warning_comes_before_any_stop(rt, endpoint, slack_api, world, context) -> None:
    # Given a job hung for good (its metrics go on past the snooze), warned, then snoozed for an hour, with no
    # decision during the snooze (a sweep interval longer than the snooze, or sweeps failing)
    _seed_hang(world, end_min=-75)
    alarm = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", JOB, alarms.PROGRESS, None)
    assert on_alarm.handler(alarm_event(alarm), context)["action"] == "warn"
    assert _call(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)[0] == 200

    # When the snooze has ended and the sweeper runs
    rt.clock.advance(61 * MINUTE)
    summary = sweeper.handler(scheduled_event(), context)

    # Then the job is warned again, not stopped
    assert [o["action"] for o in summary["redecided"]] == ["warn"]
    assert world.status(JOB) == "InProgress"


# ---- answering within Slack's 3 s: the work runs after the answer ------------------------------------------------


def test_slack_gets_its_answer_before_the_work_is_done(rt, endpoint, slack_api, world, context) -> None:
    # Given a valid "Stop now"
    event = signed_request(press_payload(slack_api, OperatorAction.STOP_NOW), rt.clock())

    # When Slack's request is answered
    status, body = _answer(event, context)

    # Then the answer is 200 and nothing was applied yet: the press waits for the async invocation
    assert (status, body) == (200, {"status": "accepted"})
    assert (_job_items(rt), slack_api.calls, world.status(JOB)) == ([], [], "InProgress")
    (press,) = endpoint.defer.__self__

    # When the async invocation runs, Then the job is stopped
    result = slack_interactions.handler({DEFERRED_EVENT_KEY: press.model_dump()}, context)
    assert (result["status"], result["stop"]["ok"]) == ("applied", True)
    assert world.status(JOB) == "Stopping"


def test_the_press_is_handed_to_an_async_invocation_of_the_same_function(rt, endpoint, slack_api, monkeypatch) -> None:
    # Given the endpoint as deployed: it invokes its own function (Lambda sets AWS_LAMBDA_FUNCTION_NAME)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "stallwatch-slack-interactions")
    endpoint.defer = None
    stubber = Stubber(rt.clients.lambda_)
    stubber.add_response(
        "invoke",
        {"StatusCode": 202},
        {"FunctionName": "stallwatch-slack-interactions", "InvocationType": "Event", "Payload": ANY},
    )

    # When a valid press arrives
    with stubber:
        event = signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock())
        status, body = _answer(event, LambdaContext())

    # Then it was handed on with one asynchronous Invoke, carrying the signed request
    stubber.assert_no_pending_responses()
    assert (status, body["status"]) == (200, "accepted")


def test_a_press_that_cannot_be_handed_on_is_applied_at_once(rt, endpoint, slack_api, context) -> None:
    # Given an async invocation that fails (Lambda throttled, say)
    def refuse(press: DeferredPress) -> None:
        raise RuntimeError("TooManyRequestsException")

    endpoint.defer = refuse

    # When a valid press arrives, Then it is applied in the request itself rather than lost
    status, body = _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)
    assert (status, body["status"]) == (200, "applied")
    assert _state(rt).snoozed_until == pytest.approx(rt.clock() + 3600)


def test_a_deferred_press_is_verified_again(rt, endpoint, slack_api, context) -> None:
    # Given an async event that was not signed by Slack (only this function may invoke itself; still never trusted)
    forged = DeferredPress(
        body=urlencode({"payload": json.dumps(press_payload(slack_api, OperatorAction.STOP_NOW))}),
        timestamp=str(int(rt.clock())),
        signature="v0=" + "0" * 64,
    )

    # When it runs, Then it is refused and nothing changes
    result = slack_interactions.handler({DEFERRED_EVENT_KEY: forged.model_dump()}, context)
    assert result["status"] == "rejected"
    assert (_table(rt), slack_api.calls) == ([], [])


def test_a_signed_body_too_large_to_hand_on_is_refused(rt, endpoint, slack_api, context) -> None:
    # Given a correctly signed request larger than an asynchronous invocation may carry
    event = signed_request(None, rt.clock(), raw_body="payload=" + "x" * interactions.DEFERRED_BODY_MAX)

    # When it reaches the endpoint, Then 413 and nothing changes
    assert _call(event, context)[0] == 413
    assert (_table(rt), slack_api.calls) == ([], [])


def test_a_button_for_a_running_instance_not_tagged_for_monitoring_changes_nothing(
    rt, endpoint, slack_api, context
) -> None:
    # Given a running GPU instance without the `stallwatch:monitor=true` tag (this deployment does not watch it)
    instance = rt.clients.ec2.run_instances(ImageId="ami-12c6146b", InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1)
    instance_id = instance["Instances"][0]["InstanceId"]

    # When an allowed user presses "Snooze 1 h" on a button naming it
    payload = press_payload(slack_api, OperatorAction.SNOOZE_1H, job=instance_id, platform=Platform.EC2)
    status, body = _call(signed_request(payload, rt.clock()), context)

    # Then nothing is written
    assert (status, body["status"]) == (200, "not_watched")
    assert _job_items(rt) == []


def test_a_plain_text_body_with_lone_surrogates_gets_a_401(rt, endpoint, slack_api, context) -> None:
    # Given a Function URL event whose body is not base64-encoded and holds code points UTF-8 cannot encode
    event = signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock())
    event.update(body="payload=\ud800", isBase64Encoded=False)

    # When it reaches the endpoint, Then 401 and nothing changes
    assert _call(event, context)[0] == 401
    assert (_table(rt), slack_api.calls) == ([], [])


# ---- presses Lambda gave up applying ----------------------------------------------------------------------------

FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:stallwatch-SlackEndpointFunction-Ab12Cd34"
FAILED_PRESSES_ARN = "arn:aws:sqs:us-east-1:123456789012:stallwatch-SlackEndpointFailedPresses-Ef56Gh78"


def _invocation_record(event: dict, error: Exception | None, condition: str = "RetriesExhausted") -> dict[str, Any]:
    """What Lambda sends to an on-failure destination for an asynchronous invocation it gave up on (the record's
    shape from the Lambda developer guide, "Capturing records of Lambda asynchronous invocations")."""
    response: dict[str, Any] = {"statusCode": 200, "executedVersion": "$LATEST"}
    record: dict[str, Any] = {
        "version": "1.0",
        "timestamp": "2026-11-30T10:04:07.123Z",
        "requestContext": {
            "requestId": "e4b46cbf-b738-4a10-8880-a18cdf61200e",
            "functionArn": f"{FUNCTION_ARN}:$LATEST",
            "condition": condition,
            "approximateInvokeCount": 3 if error is not None else 1,
        },
        "requestPayload": event,
        "responseContext": response,
    }
    if error is not None:
        response["functionError"] = "Unhandled"
        record["responsePayload"] = {
            "errorMessage": str(error),
            "errorType": type(error).__name__,
            "requestId": "e4b46cbf-b738-4a10-8880-a18cdf61200e",
            "stackTrace": ['  File "/var/task/handlers/slack_interactions.py", line 30, in handler\n'],
        }
    return record


def _sqs_event(*records: dict[str, Any]) -> dict[str, Any]:
    """The on-failure queue's messages as Lambda's SQS event source delivers them."""
    messages = []
    for i, record in enumerate(records):
        body = json.dumps(record)
        messages.append(
            {
                "messageId": f"059f36b4-87a3-44ab-83d2-66197{i:07d}",
                "receiptHandle": "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a...",
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1764496447123",
                    "SenderId": "AROAEXAMPLE:awslambda_123_20261130100407123",
                    "ApproximateFirstReceiveTimestamp": "1764496447130",
                },
                "messageAttributes": {},
                "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": FAILED_PRESSES_ARN,
                "awsRegion": "us-east-1",
            }
        )
    return {"Records": messages}


@pytest.fixture
def emf(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handlers print their metrics (EMF), as in Lambda; none left over from tests that did not."""
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED")
    metrics.clear_metrics()


def _published(out: str, metric: str) -> float:
    """The sum of `metric` in the EMF lines a handler printed."""
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]
    values = [line.get(metric, []) for line in lines]
    return sum(sum(v) if isinstance(v, list) else v for v in values)


def _failing_press(rt, endpoint, slack_api, context, monkeypatch, action=OperatorAction.STOP_NOW) -> dict:
    """A press Slack got its answer for, whose deferred invocation then fails each of Lambda's three times (its
    table throttled); the event Lambda kept."""

    def throttled(*args: Any, **kwargs: Any) -> Any:
        raise rt.clients.dynamodb.exceptions.ProvisionedThroughputExceededException(
            {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "Rate exceeded"}},
            "TransactWriteItems",
        )

    monkeypatch.setattr(rt.states, "change_state", throttled)
    assert _answer(signed_request(press_payload(slack_api, action), rt.clock()), context) == (
        200,
        {"status": "accepted"},
    )
    (press,) = endpoint.defer.__self__
    event = {DEFERRED_EVENT_KEY: press.model_dump()}
    for _ in range(3):  # the first try and Lambda's two retries
        with pytest.raises(rt.clients.dynamodb.exceptions.ProvisionedThroughputExceededException):
            slack_interactions.handler(event, context)
    return event


def test_a_press_lambda_gave_up_applying_is_posted_back_to_the_channel_and_alarmed(
    rt, endpoint, slack_api, world, context, monkeypatch, capsys, emf
) -> None:
    # Given a "Stop now" whose deferred invocation failed three times, which Lambda hands to the on-failure queue
    event = _failing_press(rt, endpoint, slack_api, context, monkeypatch)
    error = rt.clients.dynamodb.exceptions.ProvisionedThroughputExceededException(
        {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "Rate exceeded"}}, "TransactWriteItems"
    )
    capsys.readouterr()

    # When the queue delivers the record to the function
    result = slack_interactions.handler(_sqs_event(_invocation_record(event, error)), context)

    # Then the press is posted back where the channel sees it, naming the button, the job, the user and the reason
    assert result == {"batchItemFailures": []}
    ((path, post),) = slack_api.calls
    assert path.startswith("/actions/")
    assert (post["response_type"], post["replace_original"]) == ("in_channel", False)
    assert "*Stop now* on `llama-70b-pretrain`" in post["text"]
    assert f"<@{ALLOWED_USER}>" in post["text"]
    assert "could not be applied: it failed 3 times (ProvisionedThroughputExceededException)" in post["text"]
    assert "Rate exceeded" not in post["text"]  # the error's message stays out of Slack
    # And it is counted in the metric the health alarm watches, and nothing was done to the job
    assert _published(capsys.readouterr().out, "OperatorActionsFailed") == 1
    assert world.status(JOB) == "InProgress"
    assert _job_items(rt) == []


def test_a_press_that_waited_too_long_is_posted_back_in_the_alerts_thread_in_bot_mode(
    rt, endpoint, slack_api, context
) -> None:
    # Given bot mode, and a press Lambda dropped from its queue unrun (the function throttled past the event's age)
    _use_secret(rt, bot_token=BOT_TOKEN, channel=CHANNEL, signing_secret=SIGNING_SECRET)
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_4H), rt.clock()), context)
    (press,) = endpoint.defer.__self__
    record = _invocation_record({DEFERRED_EVENT_KEY: press.model_dump()}, None, "EventAgeExceeded")

    # When the queue delivers it
    slack_interactions.handler(_sqs_event(record), context)

    # Then it is a reply in the alert's thread, saying why
    ((path, post),) = slack_api.calls
    assert path == "/api/chat.postMessage"
    assert (post["channel"], post["thread_ts"]) == (CHANNEL, MESSAGE_TS)
    assert "*Snooze 4 h*" in post["text"]
    assert "it waited more than 10 minutes for the endpoint (throttled)" in post["text"]


def test_a_failed_press_is_posted_back_with_lambdas_words_quoted_as_words(rt, endpoint, slack_api, context) -> None:
    # Given a press Lambda gave up on, its record naming a condition and an error type that quote Slack markup
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)
    (press,) = endpoint.defer.__self__
    record = _invocation_record({DEFERRED_EVENT_KEY: press.model_dump()}, None, "<!channel>")
    record["responsePayload"] = {"errorType": "<https://evil.example|Snooze 1 h>"}

    # When the queue delivers it
    slack_interactions.handler(_sqs_event(record), context)

    # Then the channel is told, the record's words escaped, its own mention of the user kept
    ((_, post),) = slack_api.calls
    assert f"<@{ALLOWED_USER}>" in post["text"]
    assert "(&lt;!channel&gt;: &lt;https://evil.example|Snooze 1 h&gt;)" in post["text"]
    assert "<!channel>" not in post["text"]


def test_a_failed_press_delivered_twice_is_posted_back_once(rt, endpoint, slack_api, context) -> None:
    # Given a press Lambda gave up on, its record on the queue
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)
    (press,) = endpoint.defer.__self__
    record = _invocation_record({DEFERRED_EVENT_KEY: press.model_dump()}, None, "EventAgeExceeded")

    # When SQS delivers it twice (at least once: again in one batch, and again later)
    first = slack_interactions.handler(_sqs_event(record, record), context)
    rt.clock.advance(10 * MINUTE)
    again = slack_interactions.handler(_sqs_event(record), context)

    # Then the channel is told once, and no delivery is left on the queue
    assert [path for path, _ in slack_api.calls] == [slack_api.calls[0][0]]
    assert first == again == {"batchItemFailures": []}


@pytest.mark.slow
def test_a_failed_press_not_posted_back_is_posted_by_the_next_delivery(
    rt, endpoint, slack_api, context, monkeypatch
) -> None:
    # Given a failed press whose first post back fails (Slack down), and one whose invocation died holding its claim
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)
    (press,) = endpoint.defer.__self__
    record = _invocation_record({DEFERRED_EVENT_KEY: press.model_dump()}, None, "EventAgeExceeded")
    down = {"ok": False, "detail": "response_url: ConnectionRefusedError"}
    with monkeypatch.context() as slack_down:
        slack_down.setattr(Interactions, "_respond", lambda self, url, message: down)
        assert slack_interactions.handler(_sqs_event(record), context)["batchItemFailures"]

    # When the queue delivers it again, Then it is posted back
    assert slack_interactions.handler(_sqs_event(record), context) == {"batchItemFailures": []}
    assert len(slack_api.calls) == 1

    # And a claim left by an invocation that died is taken over once it has run out
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_4H), rt.clock()), context)
    (second,) = endpoint.defer.__self__[1:]
    PressReports(rt.store).claim(second.signature, rt.clock(), interactions.REPORT_CLAIM_SECONDS)
    later = _invocation_record({DEFERRED_EVENT_KEY: second.model_dump()}, None, "EventAgeExceeded")
    slack_interactions.handler(_sqs_event(later), context)
    assert len(slack_api.calls) == 1  # held: being posted by the invocation that holds it
    rt.clock.advance(interactions.REPORT_CLAIM_SECONDS + 1)
    slack_interactions.handler(_sqs_event(later), context)
    assert len(slack_api.calls) == 2


def test_a_failed_press_is_still_posted_back_when_the_table_cannot_claim_it(
    rt, endpoint, slack_api, context, monkeypatch
) -> None:
    # Given a press Lambda gave up on because the table was throttled, and the table still throttled
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)
    (press,) = endpoint.defer.__self__
    record = _invocation_record({DEFERRED_EVENT_KEY: press.model_dump()}, None, "EventAgeExceeded")

    def throttled(*args: Any, **kwargs: Any) -> Any:
        raise rt.clients.dynamodb.exceptions.ProvisionedThroughputExceededException(
            {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "Rate exceeded"}}, "UpdateItem"
        )

    monkeypatch.setattr(rt.clients.dynamodb, "update_item", throttled)

    # When the queue delivers it, Then the channel is told all the same (at least once rather than never)
    assert slack_interactions.handler(_sqs_event(record), context) == {"batchItemFailures": []}
    assert len(slack_api.calls) == 1


def test_a_failed_press_that_cannot_be_posted_back_is_left_on_the_queue(
    rt, endpoint, slack_api, context, monkeypatch
) -> None:
    # Given a failed press, and Slack that cannot be reached now
    event = _failing_press(rt, endpoint, slack_api, context, monkeypatch, OperatorAction.NOT_STALLED)
    slack_api.server.shutdown()
    slack_api.server.server_close()

    # When the queue delivers it, Then its message is a batch item failure: SQS delivers it again (and, after
    # five receives, moves it to the dead-letter queue, which alarms)
    sqs_event = _sqs_event(_invocation_record(event, RuntimeError("boom")))
    result = slack_interactions.handler(sqs_event, context)
    assert result == {"batchItemFailures": [{"itemIdentifier": sqs_event["Records"][0]["messageId"]}]}


def test_a_failed_press_slack_did_not_sign_is_counted_but_not_posted(
    rt, endpoint, slack_api, context, capsys, emf
) -> None:
    # Given a record whose press was never signed by Slack (only this function's failures reach the queue; still
    # never trusted)
    forged = DeferredPress(
        body=urlencode({"payload": json.dumps(press_payload(slack_api, OperatorAction.STOP_NOW))}),
        timestamp=str(int(rt.clock())),
        signature="v0=" + "0" * 64,
    )
    record = _invocation_record({DEFERRED_EVENT_KEY: forged.model_dump()}, RuntimeError("boom"))

    # When the queue delivers it, Then nothing is posted, and it is counted (a failed invocation all the same)
    assert slack_interactions.handler(_sqs_event(record), context) == {"batchItemFailures": []}
    assert slack_api.calls == []
    assert _published(capsys.readouterr().out, "OperatorActionsFailed") == 1


def test_a_press_retried_after_slacks_five_minutes_is_still_applied(rt, endpoint, slack_api, context) -> None:
    # Given a press whose deferred invocation Lambda retries 8 minutes after Slack signed it (a throttled function)
    _answer(signed_request(press_payload(slack_api, OperatorAction.SNOOZE_1H), rt.clock()), context)
    (press,) = endpoint.defer.__self__
    rt.clock.advance(8 * MINUTE)

    # When it runs, Then it is applied (the request was claimed when it came: no replay is possible)
    result = slack_interactions.handler({DEFERRED_EVENT_KEY: press.model_dump()}, context)
    assert result["status"] == "applied"
    assert _state(rt).snoozed_until == pytest.approx(rt.clock() + 3600)
