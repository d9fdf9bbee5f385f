"""Slack alerts: the evidence behind a decision as a Block Kit message, and the client that posts it.

    evidence = Evidence.of(decision, signals, stall_since=state.stall_since)
    message = AlertMessage(decision, signals.facts, evidence, stop_result).render()   # {"text", "blocks"}
    SlackNotifier(clients.secretsmanager, secret_arn).post(message)                   # PostResult, never raises

`AlertMessage` builds the blocks section by section (`_header`, `_summary`, `_evidence`, `_logs`, `_buttons`,
`_footer`); warnings and alerts carry the operator buttons of ``interactions.action_buttons``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.webhook import WebhookClient

from stallwatch.aws.actions import StopResult
from stallwatch.aws.buttons import action_buttons
from stallwatch.core.decision import Action, Decision
from stallwatch.core.pricing import Burn, estimate_fleet_burn
from stallwatch.core.signals import JobFacts, JobSignals, LogLine

LOG_LINES_SHOWN = 5  # per host
MAX_HOSTS_SHOWN = 4  # hosts with log excerpts; errors first
EMF_LINE_START = '{"_aws"'  # the agent's CloudWatch EMF stdout line
MAX_SECTION_CHARS = 2900  # Slack's limit is 3000 per text object
SLACK_TIMEOUT_SECONDS = 5
SECRET_CACHE_SECONDS = 300
HEADERS = {
    Action.STOP: ":octagonal_sign: Stopped stalled job",
    Action.WARN: ":warning: Stalled job will be stopped",
    Action.ALERT: ":rotating_light: Job needs attention",
    Action.AUDIT: ":mag: Job looks stalled (observe mode)",
}


BUTTON_ACTIONS = frozenset({Action.WARN, Action.ALERT})


class SlackSecretError(ValueError):
    """The Slack secret lacks `webhook_url` or `bot_token` + `channel`."""


@dataclass(frozen=True)
class Evidence:
    """What the message shows besides the engine's reasons."""

    last_step: float | None
    last_step_t: float | None
    util_before: float | None  # mean over hosts, per device
    util_now: float | None
    power_before: float | None  # mean over hosts, watts per device
    power_now: float | None
    stall_seconds: float
    burn: Burn
    logs: dict[str, tuple[LogLine, ...]] = field(default_factory=dict)  # host -> newest lines
    errors: dict[str, tuple[LogLine, ...]] = field(default_factory=dict)  # host -> error lines

    @classmethod
    def of(cls, decision: Decision, signals: JobSignals, stall_since: float | None) -> Evidence:
        """From the engine's evidence (per-host before/now, last step) and the signals' log lines.

        A stall is counted from the last progress (last step, else last log line), else from when it was noticed."""
        agent = decision.evidence.get("agent", {})
        hosts = decision.evidence.get("hosts", {}).values()
        began = agent.get("last_step_t") or decision.evidence.get("logs", {}).get("last_t") or stall_since
        stall_seconds = max(signals.now - began, 0.0) if decision.stalled and began is not None else 0.0
        facts = signals.facts
        return cls(
            last_step=agent.get("step"),
            last_step_t=agent.get("last_step_t"),
            util_before=_mean(h.get("gpu_util_before") for h in hosts),
            util_now=_mean(h.get("gpu_util_now") for h in hosts),
            power_before=_mean(h.get("power_w_baseline") for h in hosts),
            power_now=_mean(h.get("power_w_now") for h in hosts),
            stall_seconds=stall_seconds,
            burn=estimate_fleet_burn(facts.fleet(), stall_seconds),
            logs={h: tail[-LOG_LINES_SHOWN:] for h, s in signals.hosts.items() if (tail := _human_lines(s.log_tail))},
            errors={h: s.error_lines[-LOG_LINES_SHOWN:] for h, s in signals.hosts.items() if s.error_lines},
        )


def _human_lines(lines: tuple[LogLine, ...]) -> list[LogLine]:
    """The log tail without the agent's EMF metric lines, which say nothing a reader of the alert needs."""
    return [line for line in lines if not line.message.lstrip().startswith(EMF_LINE_START)]


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.0f}{unit}"


def _when(t: float | None) -> str:
    return "never" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class AlertMessage:
    """One decision as a Slack message."""

    decision: Decision
    facts: JobFacts
    evidence: Evidence
    stop_result: StopResult | None = None
    incident: str | None = None  # the open incident, carried by the buttons

    def render(self) -> dict[str, Any]:
        blocks = [
            *self._header(),
            *self._summary(),
            *self._evidence(),
            *self._logs(),
            *self._buttons(),
            *self._footer(),
        ]
        return {"text": self.text(), "blocks": blocks}

    def text(self) -> str:
        """The notification fallback: one line."""
        d = self.decision
        return (
            f"{HEADERS.get(d.action, d.action.value)}: {self.facts.name} ({d.diagnosis.value}) - {self._action_line()}"
        )

    def _action_line(self) -> str:
        d = self.decision
        if d.action is Action.STOP:
            outcome = "stop FAILED, will retry" if self.stop_result and not self.stop_result.ok else "stop requested"
            if self.stop_result is not None and self.stop_result.count:
                outcome += f" ({self.stop_result.count})"
            return f"{outcome} at {_when(d.at)}"
        if d.action is Action.WARN:
            return f"will be stopped if the stall persists (warned at {_when(d.at)})"
        would = f"; enforce would {d.would.value}" if d.would not in (Action.NONE, d.action) else ""
        return f"no stop (mode {d.mode.value}{would})"

    def _header(self) -> list[dict[str, Any]]:
        title = f"{HEADERS.get(self.decision.action, 'Stallwatch')}: {self.facts.name}"
        return [{"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": True}}]

    def _summary(self) -> list[dict[str, Any]]:
        d, f = self.decision, self.facts
        fields = [
            f"*Job*\n`{f.name}` ({f.platform.value})",
            f"*Diagnosis*\n{d.diagnosis.value}",
            f"*Hosts*\n{' + '.join(f'{n} x {t}' for t, n in f.fleet().items())}",
            f"*Action*\n{self._action_line()}",
        ]
        reasons = "\n".join(f"- {r}" for r in d.reasons) or "- (none given)"
        blocks: list[dict[str, Any]] = [
            {"type": "section", "fields": [{"type": "mrkdwn", "text": t} for t in fields]},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*Why*\n{reasons}"[:MAX_SECTION_CHARS]}},
        ]
        if self.stop_result is not None:
            status = "ok" if self.stop_result.ok else "FAILED"
            text = f"*Stop*: {status} - {self.stop_result.detail}"[:MAX_SECTION_CHARS]
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
        return blocks

    def _evidence(self) -> list[dict[str, Any]]:
        e = self.evidence
        dollars = "n/a (no price for this type)" if e.burn.dollars is None else f"${e.burn.dollars:,.2f}"
        fields = [
            f"*Last progress*\nstep {_fmt(e.last_step, '')} at {_when(e.last_step_t)}",
            f"*GPU utilization*\n{_fmt(e.util_before, '%')} before -> {_fmt(e.util_now, '%')} now",
            f"*Burned while stalled*\n{e.stall_seconds / 60:.0f} min, {e.burn.device_hours:.1f} GPU-h, ~{dollars}",
        ]
        if e.power_before is not None or e.power_now is not None:  # only the agent (NVML) reports power
            fields.insert(2, f"*GPU power*\n{_fmt(e.power_before, ' W')} before -> {_fmt(e.power_now, ' W')} now")
        return [{"type": "section", "fields": [{"type": "mrkdwn", "text": t} for t in fields]}]

    def _logs(self) -> list[dict[str, Any]]:
        e = self.evidence
        hosts = sorted(set(e.logs) | set(e.errors), key=lambda h: (h not in e.errors, h))[:MAX_HOSTS_SHOWN]
        blocks = []
        for host in hosts:
            lines = [f"! {line.message}" for line in e.errors.get(host, ())]
            lines += [line.message for line in e.logs.get(host, ()) if not line.pattern]
            body = "\n".join(lines)[-MAX_SECTION_CHARS + 40 :]
            text = (
                f"*{host}* (last log {_when(max((ln.t for ln in e.logs.get(host, ())), default=None))})\n```{body}```"
            )
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
        return blocks

    def _buttons(self) -> list[dict[str, Any]]:
        """Snooze / Stop now / Not stalled, on the messages an operator can still act on."""
        if self.decision.action not in BUTTON_ACTIONS:
            return []
        return [action_buttons(self.facts, self.incident)]

    def _footer(self) -> list[dict[str, Any]]:
        d = self.decision
        text = f"Stallwatch · mode {d.mode.value} · decided {_when(d.at)}"
        return [{"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}]


@dataclass(frozen=True)
class PostResult:
    ok: bool
    detail: str


class SlackNotifier:
    """Posts messages with the credentials in a Secrets Manager secret (cached for a few minutes).

    Failures are returned, never raised: an alert must never keep a stop from happening or being recorded."""

    def __init__(
        self,
        secretsmanager: Any,
        secret_arn: str | None,
        api_url: str = WebClient.BASE_URL,
        clock: Any = time.monotonic,
    ) -> None:
        self.secretsmanager = secretsmanager
        self.secret_arn = secret_arn
        self.api_url = api_url  # Slack's Web API; GovSlack and tests use another
        self.clock = clock
        self._secret: tuple[float, dict[str, str]] | None = None

    def credentials(self) -> dict[str, str]:
        if self._secret and self.clock() - self._secret[0] < SECRET_CACHE_SECONDS:
            return self._secret[1]
        raw = self.secretsmanager.get_secret_value(SecretId=self.secret_arn)["SecretString"]
        secret = json.loads(raw)
        if not secret.get("webhook_url") and not (secret.get("bot_token") and secret.get("channel")):
            raise SlackSecretError(f"secret {self.secret_arn}: needs 'webhook_url', or 'bot_token' and 'channel'")
        self._secret = (self.clock(), secret)
        return secret

    def post(self, message: dict[str, Any]) -> PostResult:
        if not self.secret_arn:
            return PostResult(ok=False, detail="no Slack secret configured (SLACK_SECRET_ARN)")
        retries = [ConnectionErrorRetryHandler(max_retry_count=1), RateLimitErrorRetryHandler(max_retry_count=2)]
        try:
            secret = self.credentials()
            if secret.get("webhook_url"):
                webhook = WebhookClient(secret["webhook_url"], timeout=SLACK_TIMEOUT_SECONDS, retry_handlers=retries)
                response = webhook.send(text=message["text"], blocks=message["blocks"])
                if response.status_code != 200:
                    return PostResult(ok=False, detail=f"webhook HTTP {response.status_code}: {response.body[:200]}")
                return PostResult(ok=True, detail="webhook 200")
            client = WebClient(
                token=secret["bot_token"], base_url=self.api_url, timeout=SLACK_TIMEOUT_SECONDS, retry_handlers=retries
            )
            reply = client.chat_postMessage(channel=secret["channel"], text=message["text"], blocks=message["blocks"])
            return PostResult(ok=True, detail=f"chat.postMessage ts={reply.get('ts')}")
        except SlackApiError as exc:
            return PostResult(ok=False, detail=f"Slack API error: {exc.response.get('error')}")
        except Exception as exc:  # network, secret, anything: the alert is lost, the decision is not
            return PostResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
