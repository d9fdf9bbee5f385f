"""Operators in the loop: the buttons on a Slack warning, verified, authorized, applied and audited.

    reply = endpoint().handle(body, headers)                  # the Function URL handler answers a press

A press walks: Slack signature (5-minute window) -> payload -> allow-list -> one DynamoDB transaction
(JobState at the version read + audit record with the Slack user + a claim on the request, so a replay
changes nothing) -> stop (Stop now) -> the message updated in place (bot token: chat.update; webhook:
response_url). Users off the allow-list get an ephemeral "not allowed" and nothing else happens.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qs

from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.webhook import WebhookClient

from stallwatch.aws import actions
from stallwatch.aws.buttons import ACTIONS_BLOCK_ID, SNOOZE_SECONDS, ButtonValue, OperatorAction
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import AlreadyHandledError, job_key
from stallwatch.core import contract
from stallwatch.core.decision import JobState
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE
from stallwatch.runtime import environment
from stallwatch.runtime.environment import Runtime

SIGNATURE_WINDOW_SECONDS = 5 * 60  # slack_sdk's SignatureVerifier window; checked first to name the failure
NOT_STALLED_FACTOR = 2.0
GROUP_CACHE_SECONDS = 300
SLACK_TIMEOUT_SECONDS = 3  # Slack waits 3 s for the acknowledgement
AUDIT_TRIGGER = "slack"
NOT_ALLOWED_TEXT = "You are not allowed to act on Stallwatch alerts. Ask an admin to add you to the allow-list."


class RejectedRequestError(ValueError):
    """A request that changes nothing; `status` is the HTTP answer."""

    status: ClassVar[int] = 400


class InvalidSignatureError(RejectedRequestError):
    status = 401


class ExpiredRequestError(RejectedRequestError):
    status = 401


class ReplayedRequestError(RejectedRequestError):
    status = 409


class MalformedPayloadError(RejectedRequestError):
    status = 400


class SigningSecretMissingError(RuntimeError):
    """The Slack secret has no `signing_secret`: no request can be verified."""


# ---- the interaction payload ------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SlackUser(_Model):
    id: str = Field(pattern=r"^[UW][A-Z0-9]{2,}$")
    username: str | None = None


class ButtonPress(_Model):
    action_id: OperatorAction
    value: Json[ButtonValue]


class Container(_Model):
    message_ts: str | None = None
    channel_id: str | None = None


class Message(_Model):
    text: str = ""
    blocks: list[dict[str, Any]] = Field(default_factory=list)


class BlockActionsPayload(_Model):
    """A `block_actions` interaction: who pressed which button on which message."""

    type: Literal["block_actions"]
    user: SlackUser
    actions: list[ButtonPress] = Field(min_length=1, max_length=1)
    response_url: str = Field(pattern=r"^https?://")
    container: Container = Field(default_factory=Container)
    message: Message | None = None

    @property
    def press(self) -> ButtonPress:
        return self.actions[0]


def parse_payload(body: str) -> BlockActionsPayload:
    """The form-encoded body's `payload` field; `MalformedPayloadError` names what is wrong."""
    fields = parse_qs(body, keep_blank_values=True)
    raw = fields.get("payload")
    if not raw or len(raw) != 1:
        raise MalformedPayloadError("form field 'payload' missing or repeated")
    try:
        return BlockActionsPayload.model_validate_json(raw[0])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        raise MalformedPayloadError(f"payload.{where}: {first['msg']}") from exc


# ---- verification -----------------------------------------------------------------------------------------------


class _RuntimeClock(Clock):
    """slack_sdk's clock, driven by the runtime's (tests pin it)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


def verify_signature(signing_secret: str, body: str, headers: Mapping[str, str], now: Callable[[], float]) -> str:
    """Check the Slack signature over the 5-minute window; returns the signature (the request's identity)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    timestamp, signature = lowered.get("x-slack-request-timestamp"), lowered.get("x-slack-signature")
    if not timestamp or not signature:
        raise InvalidSignatureError("headers x-slack-request-timestamp and x-slack-signature are required")
    if not timestamp.isdigit():
        raise InvalidSignatureError(f"x-slack-request-timestamp is not an integer: {timestamp[:20]!r}")
    age = now() - int(timestamp)
    if abs(age) > SIGNATURE_WINDOW_SECONDS:
        raise ExpiredRequestError(
            f"x-slack-request-timestamp is {age:.0f} s from now (window {SIGNATURE_WINDOW_SECONDS} s)"
        )
    verifier = SignatureVerifier(signing_secret, clock=_RuntimeClock(now))
    if not verifier.is_valid(body=body, timestamp=timestamp, signature=signature):
        raise InvalidSignatureError("x-slack-signature does not match the body")
    return signature


# ---- the interactions -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """The HTTP answer to Slack (it only needs a 200 within 3 s; the body is for logs and tests)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Interactions:
    """Answers button presses with the control plane's runtime (table, clients, Slack secret)."""

    rt: Runtime
    slack_api_url: str = WebClient.BASE_URL
    monotonic: Callable[[], float] = time.monotonic
    _groups: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)

    def handle(self, body: str, headers: Mapping[str, str]) -> Reply:
        """Verify, authorize and apply one request; every rejection changes nothing."""
        try:
            secret = self.rt.notifier.credentials()
            signing_secret = secret.get("signing_secret")
            if not signing_secret:
                raise SigningSecretMissingError(f"Slack secret {self.rt.notifier.secret_arn}: no 'signing_secret'")
            signature = verify_signature(signing_secret, body, headers, self.rt.clock)
            payload = parse_payload(body)
            if not self._allowed(payload.user.id, secret):
                logger.warning("operator not on the allow-list", extra={"user": payload.user.id})
                metrics.add_metric(name=contract.OPERATOR_ACTIONS_DENIED, unit=MetricUnit.Count, value=1)
                self._tell(payload, NOT_ALLOWED_TEXT)
                return Reply(200, {"status": "not_allowed", "user": payload.user.id})
            return self._apply(payload, signature, secret)
        except RejectedRequestError as exc:
            logger.warning("Slack request rejected", extra={"reason": type(exc).__name__, "error": str(exc)})
            metrics.add_metric(name=contract.SLACK_REQUESTS_REJECTED, unit=MetricUnit.Count, value=1)
            return Reply(exc.status, {"status": "rejected", "error": str(exc)})

    # -- authorization --

    def _allowed(self, user_id: str, secret: Mapping[str, str]) -> bool:
        """On `allowed_user_ids`, or a member of one of `allowed_group_ids` (needs the bot token)."""
        slack = self.rt.config.slack
        if user_id in slack.allowed_user_ids:
            return True
        if not slack.allowed_group_ids:
            return False
        if not secret.get("bot_token"):
            logger.error("allowed_group_ids needs a bot_token in the Slack secret to read group members")
            return False
        return any(user_id in self._members(group, secret["bot_token"]) for group in slack.allowed_group_ids)

    def _members(self, group: str, token: str) -> frozenset[str]:
        cached = self._groups.get(group)
        if cached and self.monotonic() - cached[0] < GROUP_CACHE_SECONDS:
            return cached[1]
        try:
            users = frozenset(self._web(token).usergroups_users_list(usergroup=group).get("users", []))
        except (SlackClientError, OSError) as exc:  # deny rather than fail: the press can be retried
            logger.error("usergroups.users.list failed", extra={"group": group, "error": _slack_error(exc)})
            return frozenset()
        self._groups[group] = (self.monotonic(), users)
        return users

    # -- applying --

    def _apply(self, payload: BlockActionsPayload, signature: str, secret: Mapping[str, str]) -> Reply:
        press, user, now = payload.press, payload.user.id, self.rt.clock()
        target = press.value
        key = job_key(target.platform, target.job)
        facts = None
        if press.action_id is OperatorAction.STOP_NOW:
            try:
                facts = self.rt.source(target.platform).facts(target.job)
            except JobNotFoundError as exc:
                self._tell(payload, f"`{target.job}` was not found, nothing to stop: {exc}")
                return Reply(200, {"status": "not_found", "job": target.job})
            if not self.rt.config.policy.stop_permitted(facts.tags):
                tag = f"{STOP_OPT_IN_TAG}={STOP_OPT_IN_VALUE}"
                self._tell(payload, f"`{target.job}` is not tagged `{tag}`: Stallwatch may not stop it")
                return Reply(200, {"status": "not_permitted", "job": target.job})
        event_key = f"slack#{hashlib.sha256(signature.encode()).hexdigest()[:32]}"
        audit = {
            "at": now,
            "job": target.job,
            "platform": target.platform.value,
            "trigger": AUDIT_TRIGGER,
            "operator": user,
            "operator_name": payload.user.username,
            "action": press.action_id.value,
            "incident": target.incident,
        }
        try:
            state, audit_sk = self.rt.store.change_state(
                key, lambda s: _changed(s, press.action_id, now), audit, now, event_key
            )
        except AlreadyHandledError as exc:
            raise ReplayedRequestError(str(exc)) from exc
        line = _outcome_line(press.action_id, state, user, now)
        result: dict[str, Any] = {
            "state": {"snoozed_until": state.snoozed_until, "threshold_factor": state.threshold_factor}
        }
        if facts is not None:
            stopped = actions.stop(self.rt.clients, facts)
            result["stop"] = {"ok": stopped.ok, "detail": stopped.detail}
            if not stopped.ok:
                self.rt.store.release_stop(key, state)
                line = f":x: Stop requested by <@{user}> FAILED: {stopped.detail}"
        result["slack"] = self._update_message(payload, line, secret)
        self.rt.store.record_outcome(key, audit_sk, result)
        metrics.add_metric(name=contract.OPERATOR_ACTIONS, unit=MetricUnit.Count, value=1)
        logger.info("operator action", extra={"audit": audit, "outcome": result})
        return Reply(200, {"status": "applied", "job": target.job, "action": press.action_id.value, **result})

    # -- Slack --

    def _update_message(self, payload: BlockActionsPayload, line: str, secret: Mapping[str, str]) -> dict[str, Any]:
        """Replace the buttons with who did what: chat.update with a bot token, else the response_url."""
        original = payload.message or Message()
        blocks = [b for b in original.blocks if b.get("block_id") != ACTIONS_BLOCK_ID]
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": line}]})
        text = f"{original.text} ({line})" if original.text else line
        channel, ts = payload.container.channel_id, payload.container.message_ts
        if secret.get("bot_token") and not secret.get("webhook_url") and channel and ts:
            try:
                self._web(secret["bot_token"]).chat_update(channel=channel, ts=ts, text=text, blocks=blocks)
            except (SlackClientError, OSError) as exc:  # applied and audited already; only the message is stale
                logger.error("chat.update failed", extra={"error": _slack_error(exc)})
                return {"ok": False, "detail": f"chat.update: {_slack_error(exc)}"}
            return {"ok": True, "detail": "chat.update"}
        return self._respond(payload.response_url, {"replace_original": True, "text": text, "blocks": blocks})

    def _tell(self, payload: BlockActionsPayload, text: str) -> None:
        """An ephemeral reply only the person who pressed the button sees; the message itself is left as it was."""
        self._respond(payload.response_url, {"response_type": "ephemeral", "replace_original": False, "text": text})

    def _respond(self, response_url: str, message: dict[str, Any]) -> dict[str, Any]:
        """POST to the interaction's response_url; failures are logged and returned, never raised."""
        try:
            response = WebhookClient(response_url, timeout=SLACK_TIMEOUT_SECONDS, retry_handlers=_retries()).send_dict(
                message
            )
        except (SlackClientError, OSError) as exc:  # applied and audited already; only the message is lost
            logger.error("response_url post failed", extra={"error": _slack_error(exc)})
            return {"ok": False, "detail": f"response_url: {_slack_error(exc)}"}
        if response.status_code != 200:
            logger.error(
                "response_url post failed", extra={"status": response.status_code, "body": response.body[:200]}
            )
        return {"ok": response.status_code == 200, "detail": f"response_url HTTP {response.status_code}"}

    def _web(self, token: str) -> WebClient:
        return WebClient(
            token=token, base_url=self.slack_api_url, timeout=SLACK_TIMEOUT_SECONDS, retry_handlers=_retries()
        )


def _slack_error(exc: Exception) -> str:
    """Slack's error code for an API error, else the exception."""
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error"))
    return f"{type(exc).__name__}: {exc}"


def _retries() -> list[Any]:
    return [ConnectionErrorRetryHandler(max_retry_count=1), RateLimitErrorRetryHandler(max_retry_count=1)]


def _changed(state: JobState, action: OperatorAction, now: float) -> JobState:
    """The job's state after the operator's answer."""
    if action in SNOOZE_SECONDS:
        return state.with_(snoozed_until=now + SNOOZE_SECONDS[action])
    if action is OperatorAction.NOT_STALLED:
        # The current stall, its warning and alerts are void; a stall at the doubled thresholds starts afresh.
        factor = state.threshold_factor * NOT_STALLED_FACTOR
        return state.with_(threshold_factor=factor, stall_since=None, warned_at=None, alerted=())
    return state.with_(stopped_at=now)


def _outcome_line(action: OperatorAction, state: JobState, user: str, now: float) -> str:
    """The line that replaces the buttons: what was done, by whom, when."""
    when = datetime.fromtimestamp(now, UTC).strftime("%H:%M UTC")
    if action in SNOOZE_SECONDS:
        until = datetime.fromtimestamp(state.snoozed_until or now, UTC).strftime("%H:%M UTC")
        return f":zzz: Snoozed until {until} by <@{user}> at {when}"
    if action is OperatorAction.NOT_STALLED:
        factor = f"x{state.threshold_factor:g}"
        return (
            f":white_check_mark: Marked not stalled by <@{user}> at {when}: thresholds {factor} for the rest of the run"
        )
    return f":octagonal_sign: Stop requested by <@{user}> at {when}"


@functools.cache
def endpoint() -> Interactions:
    """The container's endpoint, on the Lambdas' shared runtime (created on first use)."""
    return Interactions(environment.runtime())
