"""Everything a log, a tag, a dump or an AWS answer says reaches Slack as words, never as markup: in every post,
thread reply and the Stop now dialog, ``&``, ``<`` and ``>`` are sent as Slack's entities (Slack, "Formatting text for
app surfaces", https://api.slack.com/reference/surfaces/formatting#escaping), so ``<!channel>`` notifies no one and
``<https://...|Snooze 1 h>`` is no link."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from stallwatch.aws.actions import StopResult
from stallwatch.aws.buttons import deployment_id
from stallwatch.aws.slack import AlertMessage, Evidence, follow_up, goodput_message
from stallwatch.aws.slack_text import escape
from stallwatch.core import stack_dumps
from stallwatch.core.decision import Action, Decision, Diagnosis
from stallwatch.core.goodput import Category, Goodput, Total
from stallwatch.core.policy import Mode
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Platform

NOW = 1_800_000_000.0
MENTION = "<!channel>"
LINK = "<https://evil.example/snooze|Snooze 1 h>"
HOSTILE = f"{MENTION} {LINK} & <@U0123> <!subteam^S1|@oncall> <#C1>"
DASHBOARD = "https://us-east-1.console.aws.amazon.com/cloudwatch/home#dashboards/dashboard/stallwatch-jobs"
# Stallwatch's own markup, which the escaped words sit beside: a mention of the user who pressed, the dashboard link
OURS = re.compile(r"<@U[A-Z0-9]+>|<" + re.escape(DASHBOARD) + r"\|CloudWatch dashboard>")


def shown_markup(message: dict[str, Any]) -> list[str]:
    """Every control sequence Slack would parse in the message's texts (its buttons' values are data, not text)."""
    texts: list[str] = []

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in ("value", "action_id", "block_id", "url"):
                    walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and key == "text":
            texts.append(node)

    walk(message)
    return [m for text in texts for m in re.findall(r"<[^>]*>|&(?!amp;|lt;|gt;)", OURS.sub("", text))]


def dump_line(rank: int, host: str, file: str, seq: int) -> str:
    frames = [{"file": file, "line": 7, "func": HOSTILE, "code": HOSTILE}]
    record = {"StallwatchStacks": 1, "Host": host, "Rank": rank, "WorldSize": 2, "Reason": "stall", "Main": frames}
    return json.dumps(record | {"Collective": {"group": HOSTILE, "seq": seq, "op": HOSTILE}})


def hostile_alert(action: Action) -> dict[str, Any]:
    # A host, files and functions named by a dump, log lines, reasons quoting them and a tag, a stop's answer: all
    # hostile (a job's name is one of its platform's names, [A-Za-z0-9_-], checked where it is read)
    job = "team-llm"
    facts = JobFacts(job, Platform.EC2, "InProgress", None, NOW - 7200, "p5.48xlarge", 2, 8, 192)
    line = LogLine(NOW - 60, "i-0abc", f"ERROR {HOSTILE}", "user_fatal")
    hosts = {HOSTILE: HostSignals(HOSTILE, log_tail=(line,), error_lines=(line,))}
    dumps = [LogLine(NOW - 50, "i-0abc", dump_line(r, MENTION, LINK, 3 + r)) for r in range(2)]
    report = stack_dumps.explain(stack_dumps.latest(dumps))
    straggler = {"host": HOSTILE, "metric": "StepTime", "ratio": 2.0, "others_median": 1.0, "values": {HOSTILE: 2.0}}
    evidence = {"stacks": report.evidence(), "straggler": straggler, "hosts": {HOSTILE: {"gpu_util_now": 0.0}}}
    reasons = (report.summary, f"fatal line on {HOSTILE}: {HOSTILE}", f"tag stallwatch:mode={HOSTILE} not understood")
    decision = Decision(job, NOW, Diagnosis.HANG, action, Mode.ENFORCE, reasons, evidence)
    signals = JobSignals(facts, NOW, hosts)
    stop = StopResult(ok=False, detail=f"AccessDenied: {HOSTILE}") if action is Action.STOP else None
    deployment = deployment_id("us-east-1", "stallwatch")
    return AlertMessage(decision, facts, Evidence.of(decision, signals, None), stop, "incident#1", deployment).render()


@pytest.mark.parametrize("action", [Action.WARN, Action.STOP, Action.ALERT, Action.AUDIT])
def test_an_alert_quotes_every_log_tag_and_dump_text_as_words(action: Action) -> None:
    message = hostile_alert(action)
    assert shown_markup(message) == []
    # And the words are there, as Slack shows them
    assert escape(LINK) in json.dumps(message["blocks"])
    assert any(b["type"] == "actions" for b in message["blocks"]) == (action in (Action.WARN, Action.ALERT))


def test_a_follow_up_in_the_thread_quotes_its_text_as_words() -> None:
    message = follow_up(f"`{HOSTILE}` resumed on {HOSTILE}: {HOSTILE}", thread_ts="1.2")
    assert shown_markup(message) == []
    assert message["thread_ts"] == "1.2"


def test_a_run_summary_quotes_its_run_and_keeps_its_own_dashboard_link() -> None:
    totals = {Category.PRODUCTIVE: Total(3600.0, 8.0, 100.0)}
    goodput = Goodput(run=f"run-{HOSTILE}", jobs=("a",), wall_s=7200.0, totals=totals)
    message = goodput_message(goodput, DASHBOARD)
    assert shown_markup(message) == []
    assert f"<{DASHBOARD}|CloudWatch dashboard>" in json.dumps(message)


def test_escaping_is_slacks_three_entities_and_nothing_else() -> None:
    assert escape("a & b < c > d 'e' \"f\" é") == "a &amp; b &lt; c &gt; d 'e' \"f\" é"
