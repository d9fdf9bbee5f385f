"""Operators in the loop: the buttons on a Slack warning, verified, authorized, applied and audited.

    reply = endpoint().handle(body, headers, method)          # the Function URL answers Slack at once
    reply = endpoint().complete(DeferredPress(...))           # ... and this deployment's own async invocation acts

Slack wants its answer within 3 s, cold start included, so the request is only checked before the answer: POST,
the Slack signature (5-minute window; every header value of any bytes or size is refused with a 401, never an
exception), the payload (both `slack_requests`), and a claim on the signature (a replay gets a 409). The work is
handed to an asynchronous invocation of this same function (`lambda:InvokeFunction` on itself), which verifies the
signature again and walks: allow-list -> the button's deployment -> a job this deployment watches (running, or known
in its table) -> one DynamoDB transaction (JobState at the version read + audit record with the Slack user + a claim
on this button of this alert, so a second press of it changes nothing) -> stop (Stop now) -> the message updated in
place (bot token: chat.update; webhook: response_url). Users off the allow-list, foreign buttons and jobs not watched
get an ephemeral answer and nothing else happens. A press Lambda gave up applying (its invocation failed after
Lambda's retries, or waited past `PRESS_MAX_AGE_SECONDS`) reaches `report_failed` through the function's on-failure
destination (`failed_presses`): it is counted, which alarms, and posted back to the alert's channel.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from aws_lambda_powertools.metrics import MetricUnit
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.webhook import WebhookClient

from stallwatch.aws import actions
from stallwatch.aws.buttons import ACTIONS_BLOCK_ID, BUTTON_LABELS, SNOOZE_SECONDS, ButtonValue, OperatorAction
from stallwatch.aws.job_states import AlreadyHandledError
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.press_reports import PressReports
from stallwatch.aws.slack import context_block, slack_retries
from stallwatch.aws.slack_text import escape
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core.config import PRESS_MAX_AGE_SECONDS
from stallwatch.core.decision import JobState
from stallwatch.core.platforms import describe
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE, Mode
from stallwatch.core.signals import JobStatus
from stallwatch.runtime import environment, settle
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.slack_requests import (
    DEFERRED_BODY_MAX,
    SIGNATURE_WINDOW_SECONDS,
    TIMESTAMP,
    TIMESTAMP_HEADER,
    BlockActionsPayload,
    DeferredPress,
    Message,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RejectedRequestError,
    ReplayedRequestError,
    body_bytes,
    parse_payload,
    text_of,
    verify_signature,
)

REQUEST_CLAIM_SECONDS = 2 * SIGNATURE_WINDOW_SECONDS  # a request's claim outlives the window it can be replayed in
ACCEPTED_METHOD = "POST"
DEFERRED_EVENT_KEY = "stallwatch_deferred_press"  # the async self-invocation's event: {key: DeferredPress}
FUNCTION_NAME_ENV = "AWS_LAMBDA_FUNCTION_NAME"  # set by Lambda
NOT_STALLED_FACTOR = 2.0
GROUP_CACHE_SECONDS = 300
SLACK_TIMEOUT_SECONDS = 3
SLACK_MAX_RETRY_AFTER_SECONDS = 2
AUDIT_TRIGGER = "slack"
# A failed press's claim on being posted back: past the function's 30 s timeout, within the queue's 180 s visibility
REPORT_CLAIM_SECONDS = 60
NOT_ALLOWED_TEXT = "You are not allowed to act on Stallwatch alerts. Ask an admin to add you to the allow-list."


class SigningSecretMissingError(RuntimeError):
    """The Slack secret has no `signing_secret`: no request can be verified."""


class PressNotReportedError(RuntimeError):
    """A press that could not be applied could not be posted back either: the queue delivers it again."""


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
    defer: Callable[[DeferredPress], None] | None = None  # default: this function's async self-invocation
    _groups: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)

    def handle(self, body: bytes | str, headers: Mapping[str, Any], method: str = ACCEPTED_METHOD) -> Reply:
        """Slack's answer: check the request (every rejection changes nothing), claim it, hand the work on."""
        body = body_bytes(body)
        try:
            if method != ACCEPTED_METHOD:
                raise MethodNotAllowedError(f"method {method[:10]!r} not allowed: Slack sends POST")
            signature = verify_signature(self._signing_secret(), body, headers, self.rt.clock)
            if len(body) > DEFERRED_BODY_MAX:
                raise PayloadTooLargeError(f"body of {len(body)} bytes (at most {DEFERRED_BODY_MAX})")
            text = text_of(body)
            parse_payload(text)
            if not self.rt.event_claims.claim(_request_key(signature), self.rt.clock(), REQUEST_CLAIM_SECONDS):
                raise ReplayedRequestError("this request was already handled")
        except RejectedRequestError as exc:
            return _rejected(exc)
        lowered = {str(k).lower(): v for k, v in headers.items()}
        press = DeferredPress(body=text, timestamp=lowered[TIMESTAMP_HEADER], signature=signature)
        try:
            (self.defer or self._invoke_self)(press)
        except Exception:  # the press must not be lost: act now, even if Slack's 3 s are at risk
            logger.exception("could not hand the press to an async invocation; applying it now")
            return self.complete(press)
        return Reply(200, {"status": "accepted"})

    def complete(self, press: DeferredPress) -> Reply:
        """The deferred work: the signature checked again (the event alone is never trusted), then authorize,
        check the job and apply. The request was claimed when Slack sent it, so its window here is as long as
        Lambda may hold the invocation (a press retried or throttled is applied, not expired)."""
        try:
            secret = self.rt.notifier.credentials()
            verify_signature(
                self._signing_secret(),
                press.body.encode(),
                press.headers(),
                self.rt.clock,
                window=SIGNATURE_WINDOW_SECONDS + PRESS_MAX_AGE_SECONDS,
            )
            payload = parse_payload(press.body)
            if not self._allowed(payload.user.id, secret):
                logger.warning("operator not on the allow-list", extra={"user": payload.user.id})
                metrics.add_metric(name=contract.OPERATOR_ACTIONS_DENIED, unit=MetricUnit.Count, value=1)
                self._tell(payload, NOT_ALLOWED_TEXT)
                return Reply(200, {"status": "not_allowed", "user": payload.user.id})
            return self._apply(payload, press.signature, secret)
        except RejectedRequestError as exc:
            return _rejected(exc)

    def report_failed(self, press: DeferredPress, reason: str) -> Reply:
        """A press Lambda gave up applying: counted (`OperatorActionsFailed`, which alarms), logged, and posted back
        to the alert's channel, so the person who pressed sees that nothing was done; once, however often the queue
        delivers it (`PressReports`). A press Slack did not sign (its HMAC, whatever its age: it was claimed when it
        came) is counted and logged only. Raises `PressNotReportedError` when Slack cannot be told, so the queue
        delivers it again."""
        try:
            signed_at = int(press.timestamp) if TIMESTAMP.fullmatch(press.timestamp) else 0
            verify_signature(self._signing_secret(), press.body.encode(), press.headers(), lambda: signed_at)
            payload = parse_payload(press.body)
        except RejectedRequestError as exc:
            metrics.add_metric(name=contract.OPERATOR_ACTIONS_FAILED, unit=MetricUnit.Count, value=1)
            logger.error("a failed press Slack did not sign: not posted", extra={"error": str(exc), "reason": reason})
            return Reply(exc.status, {"status": "rejected", "error": str(exc)})
        reports = self._report_claim(press)
        if reports is False:  # SQS delivered it again
            logger.info("a failed press already posted back, or being posted", extra={"reason": reason})
            return Reply(200, {"status": "duplicate"})
        metrics.add_metric(name=contract.OPERATOR_ACTIONS_FAILED, unit=MetricUnit.Count, value=1)
        target, user = payload.press.value, payload.user.id
        label = BUTTON_LABELS[payload.press.action_id]
        when = datetime.fromtimestamp(signed_at, UTC).strftime("%H:%M UTC")
        text = (
            f":warning: *{label}* on `{escape(target.job)}`, pressed by <@{user}> at {when}, could not be applied: "
            f"{escape(reason)}. Nothing was done: press it again, or act on the job in the console."
        )
        logger.error("a press could not be applied", extra={"job": target.job, "user": user, "reason": reason})
        try:
            posted = self._post_back(payload, text, self.rt.notifier.credentials())
        except Exception:
            self._end_report_claim(reports, press, posted=False)
            raise
        self._end_report_claim(reports, press, posted=posted["ok"])
        if not posted["ok"]:
            raise PressNotReportedError(f"{target.job}: {posted['detail']}")
        return Reply(200, {"status": "reported", "job": target.job, "action": payload.press.action_id.value, **posted})

    def _report_claim(self, press: DeferredPress) -> PressReports | Literal[False] | None:
        """The claim on posting `press` back: its holder, False if another delivery has it or posted it, None if the
        table cannot say (the throttle that failed the press, maybe): then it is posted, at least once."""
        reports = PressReports(self.rt.store)
        try:
            claimed = reports.claim(press.signature, self.rt.clock(), REPORT_CLAIM_SECONDS)
        except Exception:  # a press told twice beats a press never told
            logger.exception("could not claim a failed press's post back: posting it unclaimed")
            return None
        return reports if claimed else False

    def _end_report_claim(self, reports: PressReports | None, press: DeferredPress, posted: bool) -> None:
        """Posted: no delivery posts it again; not posted: the next delivery tries. Never raises (logged)."""
        if reports is None:
            return
        try:
            if posted:
                reports.reported(press.signature, self.rt.clock())
            else:
                reports.release(press.signature)
        except Exception:  # the claim runs out by itself; a later delivery may post it again
            logger.exception("could not record a failed press's post back")

    def _post_back(self, payload: BlockActionsPayload, text: str, secret: Mapping[str, str]) -> dict[str, Any]:
        """Tell the channel: a reply in the alert's thread with a bot token, else an in-channel message through the
        press's response_url (valid 30 minutes)."""
        channel, ts = payload.container.channel_id, payload.container.message_ts
        if secret.get("bot_token") and not secret.get("webhook_url") and channel:
            try:
                self._web(secret["bot_token"]).chat_postMessage(channel=channel, thread_ts=ts, text=text)
            except (SlackClientError, OSError) as exc:
                logger.error("chat.postMessage failed", extra={"error": _slack_error(exc)})
                return {"ok": False, "detail": f"chat.postMessage: {_slack_error(exc)}"}
            return {"ok": True, "detail": "chat.postMessage"}
        return self._respond(
            payload.response_url, {"response_type": "in_channel", "replace_original": False, "text": text}
        )

    def _signing_secret(self) -> str:
        signing_secret = self.rt.notifier.credentials().get("signing_secret")
        if not signing_secret:
            raise SigningSecretMissingError(f"Slack secret {self.rt.notifier.secret_arn}: no 'signing_secret'")
        return signing_secret

    def _invoke_self(self, press: DeferredPress) -> None:
        self.rt.clients.lambda_.invoke(
            FunctionName=os.environ[FUNCTION_NAME_ENV],
            InvocationType="Event",
            Payload=json.dumps({DEFERRED_EVENT_KEY: press.model_dump()}).encode(),
        )

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

    def _unwatched(self, target: ButtonValue) -> str | None:
        """Why this deployment may not act on the button's job, or None: the button must be this deployment's,
        and its job running here (this account and region, monitored, not mode off) or known in the table."""
        if not hmac.compare_digest(target.deployment, self.rt.deployment_id):
            return "this alert was posted by another Stallwatch deployment"
        if self.rt.states.load(job_key(target.platform, target.job)).version:
            return None
        try:
            facts = self.rt.source(target.platform).facts(target.job)
        except JobNotFoundError:
            return f"`{target.job}` is not a job in this account and region"
        policy = self.rt.config.policy
        platform = describe(target.platform)
        # watched on its platform: an EC2 job's instances still tagged for it (`PlatformDescription.unwatched`)
        monitored = self.rt.config.watches(target.platform) and platform.unwatched(facts) is None
        if facts.status is not JobStatus.RUNNING or not monitored or policy.for_job(facts.tags).mode is Mode.OFF:
            return f"`{target.job}` is not a job Stallwatch watches here (status {facts.status})"
        return None

    # -- applying --

    def _apply(self, payload: BlockActionsPayload, signature: str, secret: Mapping[str, str]) -> Reply:
        press, user, now = payload.press, payload.user.id, self.rt.clock()
        target = press.value
        key = job_key(target.platform, target.job)
        refusal = self._unwatched(target)
        if refusal:
            logger.warning("button for a job not watched here", extra={"job": target.job, "reason": refusal})
            self._tell(payload, f"Nothing was done: {escape(refusal)}.")
            return Reply(200, {"status": "not_watched", "job": target.job, "reason": refusal})
        facts = None
        if press.action_id is OperatorAction.STOP_NOW:
            try:
                facts = self.rt.source(target.platform).facts(target.job)
            except JobNotFoundError as exc:
                self._tell(payload, escape(f"`{target.job}` was not found, nothing to stop: {exc}"))
                return Reply(200, {"status": "not_found", "job": target.job})
            if not self.rt.config.policy.stop_permitted(facts.tags):
                tag = f"{STOP_OPT_IN_TAG}={STOP_OPT_IN_VALUE}"
                self._tell(payload, escape(f"`{target.job}` is not tagged `{tag}`: Stallwatch may not stop it"))
                return Reply(200, {"status": "not_permitted", "job": target.job})
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
            state, audit_sk = self.rt.states.change_state(
                key, lambda s: _changed(s, press.action_id, now), audit, now, _press_key(payload, key, signature)
            )
        except AlreadyHandledError:
            self._tell(payload, "This button was already pressed on this alert: nothing more was done.")
            return Reply(200, {"status": "already_applied", "job": target.job, "action": press.action_id.value})
        line = _outcome_line(press.action_id, state, user, now)
        result: dict[str, Any] = {
            "state": {"snoozed_until": state.snoozed_until, "threshold_factor": state.threshold_factor}
        }
        if facts is not None:
            stopped = actions.stop(self.rt.source(facts.platform), facts)
            result["stop"] = {"ok": stopped.ok, "detail": stopped.detail}
            if not stopped.ok:
                self.rt.states.release_stop(key, state)
                line = f":x: Stop requested by <@{user}> FAILED: {escape(stopped.detail)}"
        result["slack"] = self._update_message(payload, line, secret)
        self.rt.audit.record_outcome(key, audit_sk, result)
        if facts is not None:
            settle.track(self.rt, key, audit_sk, facts, stopped, now)  # an answer that comes later: the sweeper's
        metrics.add_metric(name=contract.OPERATOR_ACTIONS, unit=MetricUnit.Count, value=1)
        logger.info("operator action", extra={"audit": audit, "outcome": result})
        return Reply(200, {"status": "applied", "job": target.job, "action": press.action_id.value, **result})

    # -- Slack --

    def _update_message(self, payload: BlockActionsPayload, line: str, secret: Mapping[str, str]) -> dict[str, Any]:
        """Replace the buttons with who did what: chat.update with a bot token, else the response_url."""
        original = payload.message or Message()
        blocks = [b for b in original.blocks if b.get("block_id") != ACTIONS_BLOCK_ID]
        blocks.append(context_block(line).to_dict())
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
            webhook = WebhookClient(response_url, timeout=SLACK_TIMEOUT_SECONDS, retry_handlers=_retries())
            response = webhook.send_dict(message)
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


def _rejected(exc: RejectedRequestError) -> Reply:
    logger.warning("Slack request rejected", extra={"reason": type(exc).__name__, "error": str(exc)})
    metrics.add_metric(name=contract.SLACK_REQUESTS_REJECTED, unit=MetricUnit.Count, value=1)
    return Reply(exc.status, {"status": "rejected", "error": str(exc)})


def _request_key(signature: str) -> str:
    """One request, by its signature: Slack signs each delivery afresh."""
    return f"slack#{hashlib.sha256(signature.encode()).hexdigest()[:32]}"


def _press_key(payload: BlockActionsPayload, key: str, signature: str) -> str:
    """One button of one alert: the same press again (a second click, another client) claims the same key."""
    alert = payload.container.message_ts or payload.press.value.incident or signature
    identity = f"{key}|{payload.press.action_id.value}|{payload.container.channel_id}|{alert}"
    return f"slack#press#{hashlib.sha256(identity.encode()).hexdigest()[:32]}"


def _slack_error(exc: Exception) -> str:
    """Slack's error code for an API error, else the exception."""
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error"))
    return f"{type(exc).__name__}: {exc}"


def _retries() -> list[Any]:
    return slack_retries(SLACK_MAX_RETRY_AFTER_SECONDS)


def _changed(state: JobState, action: OperatorAction, now: float) -> JobState:
    """The job's state after the operator's answer."""
    if action in SNOOZE_SECONDS:
        return state.snoozed(now + SNOOZE_SECONDS[action])
    if action is OperatorAction.NOT_STALLED:
        # The current stall, its warning and alerts are void; a stall at the doubled thresholds starts afresh.
        factor = state.threshold_factor * NOT_STALLED_FACTOR
        return state.with_(threshold_factor=factor, stall_since=None, warned_at=None, warning=None, alerted=())
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
