"""Slack alerts: the evidence behind a decision as a Block Kit message, and the client that posts it.

    evidence = Evidence.of(decision, signals, stall_since=state.stall_since)
    message = AlertMessage(decision, signals.facts, evidence, stop_result).render()   # {"text", "blocks"}
    SlackNotifier(clients.secretsmanager, secret_arn).post(message)                   # PostResult, never raises

`AlertMessage` builds the blocks section by section (`_header`, `_summary`, `_evidence`, `_stacks`, `_logs`,
`_buttons`, `_footer`) as slack_sdk's Block Kit models, whose `to_dict()` checks Slack's limits; text is escaped
(`slack_text.escape`: what a log, tag or dump says is never markup) and fitted to the models' own limits
(`SectionBlock.text_max_length`, ...). Warnings and alerts carry the operator buttons of ``buttons.action_buttons``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools.utilities.parameters import SecretsProvider
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry import RetryHandler, RetryState
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.models.blocks import Block, ContextBlock, HeaderBlock, MarkdownTextObject, PlainTextObject, SectionBlock
from slack_sdk.webhook import WebhookClient

from stallwatch.aws.actions import StopResult
from stallwatch.aws.buttons import action_buttons
from stallwatch.aws.slack_text import escape
from stallwatch.core import log_patterns
from stallwatch.core.config import SlackMode, slack_mode_of
from stallwatch.core.decision import Action, Decision, stall_onset
from stallwatch.core.goodput import Goodput
from stallwatch.core.pricing import Burn, estimate_fleet_burn
from stallwatch.core.signals import JobFacts, JobSignals, LogLine

LOG_LINES_SHOWN = 5  # per host
MAX_HOSTS_SHOWN = 4  # hosts with log excerpts; errors first
STACK_GROUPS_SHOWN = 3  # places of the ranks (the odd ones first) with their frames
STACK_FRAMES_SHOWN = 6  # innermost frames per place
CODE_FENCE = "```"
SLACK_TIMEOUT_SECONDS = 5
SECRET_CACHE_SECONDS = 300
MAX_RETRY_AFTER_SECONDS = 10  # a 429 asking for a longer wait is left to the sweeper's re-post
RETRY_AFTER = re.compile(r"[0-9]{1,6}")
STOP_FAILED_HEADER = ":x: Stop FAILED for stalled job"
HEADERS = {
    Action.STOP: ":octagonal_sign: Stopped stalled job",
    Action.WARN: ":warning: Stalled job will be stopped",
    Action.ALERT: ":rotating_light: Job needs attention",
    Action.AUDIT: ":mag: Job looks stalled (observe mode)",
}


BUTTON_ACTIONS = frozenset({Action.WARN, Action.ALERT})


class SlackSecretError(ValueError):
    """The Slack secret lacks `webhook_url` or `bot_token` + `channel`."""


class BoundedRateLimitRetryHandler(RateLimitErrorRetryHandler):
    """Slack's 429: wait as its Retry-After asks when that is at most `max_wait` seconds. A longer wait, or a
    header that is not a number, is not retried: the failure is returned and the message posted again later, so a
    rate-limited Slack never holds a Lambda near its timeout (nor crashes slack_sdk's int() on the header)."""

    def __init__(self, max_retry_count: int = 2, max_wait: int = MAX_RETRY_AFTER_SECONDS) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self.max_wait = max_wait

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code != 429:
            return False
        values = [v for k, v in response.headers.items() if k.lower() == "retry-after"]
        value = values[0][0] if values and values[0] else ""
        return RETRY_AFTER.fullmatch(str(value)) is not None and int(value) <= self.max_wait


def slack_retries(max_wait: int = MAX_RETRY_AFTER_SECONDS) -> list[RetryHandler]:
    """The retries of every Slack call: one on a connection error, two on a 429 with a short Retry-After."""
    return [ConnectionErrorRetryHandler(max_retry_count=1), BoundedRateLimitRetryHandler(2, max_wait)]


@dataclass(frozen=True)
class Evidence:
    """What the message shows besides the engine's reasons."""

    last_step: float | None
    last_step_t: float | None
    util_before: float | None  # mean over hosts, per device
    util_now: float | None
    power_before: float | None  # mean over hosts, per device: watts, or % of the device's maximum (`power_unit`)
    power_now: float | None
    stall_seconds: float
    burn: Burn
    logs: dict[str, tuple[LogLine, ...]] = field(default_factory=dict)  # host -> newest lines
    errors: dict[str, tuple[LogLine, ...]] = field(default_factory=dict)  # host -> error lines
    straggler: dict[str, Any] | None = None  # the engine's straggler evidence: host, metric, ratio, values per host
    power_unit: str = "W"  # "%": of the device's maximum power (a NeuronCore's: the Neuron driver gives no watts)

    @classmethod
    def of(cls, decision: Decision, signals: JobSignals, stall_since: float | None) -> Evidence:
        """From the engine's evidence (per-host before/now, last step) and the signals' log lines.

        A stall is counted from the last progress (last step, else last log line), else from when it was noticed."""
        agent = decision.evidence.get("agent", {})
        hosts = decision.evidence.get("hosts", {}).values()
        began = stall_onset(decision.evidence, stall_since)
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
            straggler=decision.evidence.get("straggler"),
            power_unit=next((h["power_unit"] for h in hosts if "power_unit" in h), "W"),
        )


def _human_lines(lines: tuple[LogLine, ...]) -> list[LogLine]:
    """The log tail without the agent's own lines (EMF metrics, stack dumps: the stacks have their own section)."""
    return [line for line in lines if not log_patterns.agent_window(line.message.lstrip())]


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _fmt(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:.0f}{unit}"


def _when(t: float | None) -> str:
    return "never" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _straggler_text(straggler: dict[str, Any]) -> str:
    """The straggling host and the spread over all hosts, slowest first: the node to cordon, and why."""
    metric, host = straggler["metric"], straggler["host"]
    unit = {"StepTime": "s", "AcceleratorPowerPercent": "%"}.get(metric, "W")
    ordered = sorted(straggler["values"].items(), key=lambda kv: kv[1], reverse=metric == "StepTime")
    spread = "\n".join(f"{'>' if h == host else ' '} {h:<12} {v:>10g} {unit}" for h, v in ordered)
    head = (
        f"*Straggler*: `{host}` {metric} {straggler['values'][host]:g} {unit}, {straggler['ratio']:g}x off the "
        f"other hosts' median of {straggler['others_median']:g} {unit}: consider cordoning that node"
    )
    return _code_section(head, spread, keep_end=False)


def _stacks_text(stacks: dict[str, Any]) -> SectionBlock:
    """Where the ranks are, the odd ones out first: each place's ranks, collective and innermost frames."""
    lines = []
    for group in stacks["groups"][:STACK_GROUPS_SHOWN]:
        ranks = ", ".join(str(rank) for rank in group["ranks"]) + (
            " ..." if group["count"] > len(group["ranks"]) else ""
        )
        hosts = ", ".join(group["hosts"])
        seq = group.get("collective") or {}
        where = f", {seq['op']} seq {seq['seq']}" if seq else ""
        lines.append(f"{'>' if group['odd'] else ' '} {group['count']} x rank {ranks} on {hosts}{where}")
        lines += [f"    {frame}".replace(CODE_FENCE, "` ` `") for frame in group["frames"][:STACK_FRAMES_SHOWN]]
    named = "> the odd ones out, " if any(g["odd"] for g in stacks["groups"]) else ""
    dumped = f"{stacks['ranks']} rank{'s' if stacks['ranks'] != 1 else ''} dumped"
    head = f"*Stacks* ({dumped}; {named}innermost frame first)"
    return _code_section(head, "\n".join(lines), keep_end=False)


def _fit(text: str, limit: int = SectionBlock.text_max_length) -> str:
    """`text` within `limit` characters (a Block Kit model's own limit), cut at its end and marked."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _section(text: str) -> SectionBlock:
    """A section of `text` (its mrkdwn kept, what it quotes escaped)."""
    return _markup_section(escape(text))


def _markup_section(markup: str) -> SectionBlock:
    return SectionBlock(text=MarkdownTextObject(text=_fit(markup)))


def _fields(texts: list[str]) -> SectionBlock:
    return SectionBlock(fields=[MarkdownTextObject(text=escape(t)) for t in texts])


def _code_section(head: str, body: str, keep_end: bool = True) -> SectionBlock:
    """`head` over `body` in a code block, both escaped, the body cut (its end kept for a log tail, its start
    otherwise) so that the section, fences included, stays within the section's limit."""
    head, body = escape(head), escape(body)
    budget = max(SectionBlock.text_max_length - len(head) - len(f"\n{CODE_FENCE}{CODE_FENCE}"), 0)
    if len(body) > budget:
        body = body[len(body) - budget :] if keep_end else body[:budget]
    return _markup_section(f"{head}\n{CODE_FENCE}{body}{CODE_FENCE}")


def _header(title: str) -> HeaderBlock:
    return HeaderBlock(text=PlainTextObject(text=_fit(escape(title), HeaderBlock.text_max_length), emoji=True))


def context_block(markup: str) -> ContextBlock:
    """A line of small print: a footer, or who answered an alert's buttons. `markup` is sent as it is: its writer
    escapes what it quotes (`slack_text.escape`) and adds its own mentions and links."""
    return ContextBlock(elements=[MarkdownTextObject(text=markup)])


def _message(text: str, blocks: list[Block]) -> dict[str, Any]:
    """A message as Slack takes it: the notification text (escaped: Slack reads it as mrkdwn) and the blocks, each
    checked by its model."""
    return {"text": escape(text), "blocks": [block.to_dict() for block in blocks]}


@dataclass(frozen=True)
class AlertMessage:
    """One decision as a Slack message."""

    decision: Decision
    facts: JobFacts
    evidence: Evidence
    stop_result: StopResult | None = None
    incident: str | None = None  # the open incident, carried by the buttons
    deployment: str | None = None  # this deployment's id, carried by the buttons (no id, no buttons)
    stop_attempts: int = 1  # the stops tried in this incident, this one included

    def render(self) -> dict[str, Any]:
        blocks = [
            *self._header(),
            *self._summary(),
            *self._evidence(),
            *self._stacks(),
            *self._logs(),
            *self._buttons(),
            *self._footer(),
        ]
        return _message(self.text(), blocks)

    def text(self) -> str:
        """The notification fallback: one line."""
        d = self.decision
        return f"{self._headline()}: {self.facts.name} ({d.diagnosis.value}) - {self._action_line()}"

    def _stop_failed(self) -> bool:
        return self.stop_result is not None and not self.stop_result.ok

    def _headline(self) -> str:
        """What happened, first: a stop that failed never reads "Stopped"."""
        if self._stop_failed():
            return STOP_FAILED_HEADER
        return HEADERS.get(self.decision.action, self.decision.action.value)

    def _action_line(self) -> str:
        d = self.decision
        if d.action is Action.STOP:
            attempts = f" (attempt {self.stop_attempts})" if self.stop_attempts > 1 else ""
            outcome = "stop FAILED, will retry" if self._stop_failed() else "stop requested"
            if self.stop_result is not None and self.stop_result.count:
                outcome += f" ({self.stop_result.count})"
            return f"{outcome}{attempts} at {_when(d.at)}"
        if d.action is Action.WARN:
            return f"will be stopped if the stall persists (warned at {_when(d.at)})"
        would = f"; enforce would {d.would.value}" if d.would not in (Action.NONE, d.action) else ""
        return f"no stop (mode {d.mode.value}{would})"

    def _header(self) -> list[Block]:
        return [_header(f"{self._headline()}: {self.facts.name}")]

    def _summary(self) -> list[Block]:
        d, f = self.decision, self.facts
        fields = [
            f"*Job*\n`{f.name}` ({f.platform.value})",
            f"*Diagnosis*\n{d.diagnosis.value}",
            f"*Hosts*\n{' + '.join(f'{n} x {t}' for t, n in f.fleet().items())}",
            f"*Action*\n{self._action_line()}",
        ]
        reasons = "\n".join(f"- {r}" for r in d.reasons) or "- (none given)"
        blocks: list[Block] = [_fields(fields), _section(f"*Why*\n{reasons}")]
        if self.stop_result is not None:
            status = "ok" if self.stop_result.ok else "FAILED"
            blocks.append(_section(f"*Stop*: {status} - {self.stop_result.detail}"))
        return blocks

    def _evidence(self) -> list[Block]:
        e = self.evidence
        dollars = "n/a (no price for this type)" if e.burn.dollars is None else f"${e.burn.dollars:,.2f}"
        fields = [
            f"*Last progress*\nstep {_fmt(e.last_step, '')} at {_when(e.last_step_t)}",
            f"*GPU utilization*\n{_fmt(e.util_before, '%')} before -> {_fmt(e.util_now, '%')} now",
            f"*Burned while stalled*\n{e.stall_seconds / 60:.0f} min, {e.burn.device_hours:.1f} GPU-h, ~{dollars}",
        ]
        if e.power_before is not None or e.power_now is not None:  # only the agent reports power (NVML, Neuron)
            unit = " W" if e.power_unit == "W" else "% of max"
            fields.insert(2, f"*Power*\n{_fmt(e.power_before, unit)} before -> {_fmt(e.power_now, unit)} now")
        blocks: list[Block] = [_fields(fields)]
        if e.straggler is not None:
            blocks.append(_straggler_text(e.straggler))
        return blocks

    def _stacks(self) -> list[Block]:
        """The agent's stack dumps of the stall, when there are some (the Why line says when there are none)."""
        stacks = self.decision.evidence.get("stacks") or {}
        return [_stacks_text(stacks)] if stacks.get("groups") else []

    def _logs(self) -> list[Block]:
        e = self.evidence
        lagging = e.straggler["host"] if e.straggler else None
        first = lambda h: (h not in e.errors, h != lagging, h)  # noqa: E731 - errors, then the straggler, by name
        hosts = sorted(set(e.logs) | set(e.errors), key=first)[:MAX_HOSTS_SHOWN]
        blocks: list[Block] = []
        for host in hosts:
            lines = [f"! {line.message}" for line in e.errors.get(host, ())]
            lines += [line.message for line in e.logs.get(host, ()) if not line.pattern]
            last = _when(max((ln.t for ln in e.logs.get(host, ())), default=None))
            blocks.append(_code_section(f"*{host}* (last log {last})", "\n".join(lines)))
        return blocks

    def _buttons(self) -> list[Block]:
        """Snooze / Stop now / Not stalled, on the messages an operator can still act on."""
        if self.decision.action not in BUTTON_ACTIONS or not self.deployment:
            return []
        return [action_buttons(self.facts, self.incident, self.deployment)]

    def _footer(self) -> list[Block]:
        d = self.decision
        return [context_block(f"Stallwatch · mode {d.mode.value} · decided {_when(d.at)}")]


def follow_up(text: str, thread_ts: str | None = None) -> dict[str, Any]:
    """A short message after an alert (resumed, progress, gave up): in the alert's thread when `thread_ts` is known
    (bot mode), else on its own (webhook mode). The thread rides in the message, so a re-send keeps it."""
    message = _message(text, [_section(text)])
    if thread_ts:
        message["thread_ts"] = thread_ts
    return message


def goodput_message(goodput: Goodput, dashboard_url: str | None = None) -> dict[str, Any]:
    """The end-of-run summary: goodput, where the rest of the time and money went, and where to look further: the
    report and its chart, and the deployment's job dashboard when its URL is known (its Job list picks the run)."""
    title = f":bar_chart: Run summary: {goodput.run}"
    dollars = "n/a" if goodput.dollars is None else f"${goodput.dollars:,.2f}"
    fields = [
        f"*Goodput*\n{goodput.ratio:.1%} of {goodput.wall_s / 3600:.1f} h",
        f"*Paid*\n{goodput.gpu_hours:,.1f} GPU-h, ~{dollars}",
        f"*Jobs*\n{len(goodput.jobs)} ({goodput.restarts} restarts, {goodput.stalls_caught} stalls caught)",
        f"*Efficiency*\n{_fmt(goodput.mean_tflops_per_gpu, ' TFLOPs/GPU')}, MFU {_fmt(goodput.mean_mfu, '%')}",
    ]
    lines = [
        f"{category.value.replace('_', ' ')}: {total.seconds / 3600:.2f} h, {total.gpu_hours:,.1f} GPU-h"
        for category, total in goodput.totals.items()
        if total.seconds > 0
    ]
    run = escape(goodput.run)
    further = f"`stallwatch report {run} --plot {run}.png`"
    if dashboard_url:  # the deployment's own link (an https URL of its console): markup, after the escaped run
        further += f" · <{dashboard_url}|CloudWatch dashboard> (pick `{run}` in Job)"
    blocks: list[Block] = [_header(title), _fields(fields), _section("\n".join(lines)), context_block(further)]
    return _message(f"{title}: goodput {goodput.ratio:.1%}", blocks)


@dataclass(frozen=True)
class PostResult:
    ok: bool
    detail: str
    channel: str | None = None  # where the message is (bot token mode), to update it later
    ts: str | None = None  # its timestamp (bot mode): to update it, and to thread follow-ups under it

    def audited(self) -> dict[str, Any]:
        """The post as the audit outcome's `slack` records it; `ts` threads the follow-ups (resumed, gave up)."""
        return {"ok": self.ok, "detail": self.detail} | ({"ts": self.ts} if self.ts else {})


class SlackNotifier:
    """Posts messages with the credentials in a Secrets Manager secret (cached for a few minutes).

    Failures are returned, never raised: an alert must never keep a stop from happening or being recorded."""

    def __init__(self, secretsmanager: Any, secret_arn: str | None, api_url: str = WebClient.BASE_URL) -> None:
        # Powertools' cache, over the runtime's own client (its retries and endpoint)
        self.secrets = SecretsProvider(boto3_client=secretsmanager)
        self.secret_arn = secret_arn
        self.api_url = api_url  # Slack's Web API; GovSlack and tests use another

    def credentials(self) -> dict[str, str]:
        """The secret's JSON, read at most once per `SECRET_CACHE_SECONDS` while it holds credentials."""
        secret = self.secrets.get(self.secret_arn, transform="json", max_age=SECRET_CACHE_SECONDS)
        if not isinstance(secret, dict) or slack_mode_of(secret) is None:
            self.secrets.clear_cache()  # read again next time: the secret may be fixed any moment
            raise SlackSecretError(f"secret {self.secret_arn}: needs 'webhook_url', or 'bot_token' and 'channel'")
        return secret

    def can_update(self) -> bool:
        """Whether posted messages can be edited in place (bot token mode: chat.update); False if unknown."""
        try:
            secret = self.credentials() if self.secret_arn else {}
        except Exception:  # the next post reports the secret's problem
            return False
        return slack_mode_of(secret) is SlackMode.BOT

    def post(self, message: dict[str, Any]) -> PostResult:
        """Post a new message (webhook, or chat.postMessage with the bot token)."""
        return self._send(message, None)

    def update(self, message: dict[str, Any], channel: str, ts: str) -> PostResult:
        """Replace a message posted before (chat.update, bot token mode only)."""
        return self._send(message, (channel, ts))

    def _send(self, message: dict[str, Any], where: tuple[str, str] | None) -> PostResult:
        if not self.secret_arn:
            return PostResult(ok=False, detail="no Slack secret configured (SLACK_SECRET_ARN)")
        try:
            secret = self.credentials()
            if secret.get("webhook_url") and where is None:
                webhook = WebhookClient(
                    secret["webhook_url"], timeout=SLACK_TIMEOUT_SECONDS, retry_handlers=slack_retries()
                )
                response = webhook.send(text=message["text"], blocks=message["blocks"])
                if response.status_code != 200:
                    return PostResult(ok=False, detail=f"webhook HTTP {response.status_code}: {response.body[:200]}")
                return PostResult(ok=True, detail="webhook 200")
            client = WebClient(
                token=secret["bot_token"],
                base_url=self.api_url,
                timeout=SLACK_TIMEOUT_SECONDS,
                retry_handlers=slack_retries(),
            )
            if where is not None:
                client.chat_update(channel=where[0], ts=where[1], text=message["text"], blocks=message["blocks"])
                return PostResult(ok=True, detail=f"chat.update ts={where[1]}", channel=where[0], ts=where[1])
            reply = client.chat_postMessage(
                channel=secret["channel"],
                text=message["text"],
                blocks=message["blocks"],
                thread_ts=message.get("thread_ts"),
            )
            ts, channel = reply.get("ts"), reply.get("channel")
            return PostResult(ok=True, detail=f"chat.postMessage ts={ts}", channel=channel, ts=ts)
        except SlackApiError as exc:
            return PostResult(ok=False, detail=f"Slack API error: {exc.response.get('error')}")
        except Exception as exc:  # network, secret, anything: the alert is lost, the decision is not
            return PostResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
