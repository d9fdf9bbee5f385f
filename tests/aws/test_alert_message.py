"""The Slack message and notifier, the price table and the event models, without AWS."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parameters import base as parameters_base
from slack_sdk.models.blocks import Block, HeaderBlock, SectionBlock

from localrun.moto_world import alarm_event, job_state_event
from localrun.slack_receiver import SlackReceiver
from stallwatch.aws.actions import StopResult
from stallwatch.aws.buttons import ACTIONS_BLOCK_ID, deployment_id
from stallwatch.aws.events import AlarmEvent, InvalidEventError, JobStateEvent, parse_event
from stallwatch.aws.platforms.sagemaker_events import TrainingJobStateChange
from stallwatch.aws.slack import AlertMessage, Evidence, SlackNotifier, SlackSecretError, follow_up
from stallwatch.core.decision import Action, Decision, Diagnosis
from stallwatch.core.policy import Mode
from stallwatch.core.pricing import INSTANCE_SPECS, estimate_burn
from stallwatch.core.signals import HostSignals, JobFacts, JobSignals, LogLine, Platform

NOW = 1_800_000_000.0
DEPLOYMENT = deployment_id("us-east-1", "stallwatch-test")
FACTS = JobFacts("llama-70b", Platform.SAGEMAKER, "InProgress", "Training", NOW - 7200, "ml.p5.48xlarge", 8, 8, 192)
CRASH = LogLine(
    NOW - 1800, "llama-70b/algo-2-1", "RuntimeError: CUDA error: an illegal memory access", "illegal_memory_access"
)


def _decision(action: Action, mode: Mode = Mode.ENFORCE, would: Action = Action.NONE) -> Decision:
    evidence = {
        "agent": {"last_step_t": NOW - 3600, "step": 1200.0},
        "hosts": {
            "algo-1": {"gpu_util_before": 97.0, "gpu_util_now": 100.0, "power_w_baseline": 610.0, "power_w_now": 120.0},
            "algo-2": {"gpu_util_before": 95.0, "gpu_util_now": 0.0, "power_w_baseline": 600.0, "power_w_now": 70.0},
        },
    }
    reasons = ("fatal error lines on algo-2: illegal_memory_access",)
    return Decision("llama-70b", NOW, Diagnosis.CRASHED_RANK, action, mode, reasons, evidence, would)


def _signals() -> JobSignals:
    hosts = {
        "algo-1": HostSignals("algo-1", log_tail=(LogLine(NOW - 3600, "s1", "step 1200 loss 1.9"),)),
        "algo-2": HostSignals("algo-2", log_tail=(CRASH,), error_lines=(CRASH,)),
        "algo-3": HostSignals("algo-3", log_tail=(LogLine(NOW - 60, "s3", "step 1260 loss 1.8"),)),
    }
    return JobSignals(FACTS, NOW, hosts)


def _text(message: dict[str, Any]) -> str:
    """The blocks as Slack shows them: its three entities read back (`slack_text.escape`)."""
    return json.dumps(message["blocks"]).replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&")


def test_stop_message_shows_evidence_burn_and_a_failed_stop() -> None:
    # Given a crashed rank stopped an hour after its last step, whose stop failed
    decision = _decision(Action.STOP)
    evidence = Evidence.of(decision, _signals(), stall_since=NOW - 600)

    # When the message is rendered
    message = AlertMessage(decision, FACTS, evidence, StopResult(ok=False, detail="AccessDenied")).render()

    # Then it counts the stall from the last step: 8 hosts x 8 GPUs x 1 h, at the p5 list price
    assert evidence.stall_seconds == 3600
    text = _text(message)
    assert "60 min, 64.0 GPU-h, ~$904.56" in text
    assert "96% before -> 50% now" in text
    assert "605 W before -> 95 W now" in text
    assert "stop FAILED, will retry" in message["text"]
    assert "AccessDenied" in text
    # And a stop that failed is headlined as such, and never reads "Stopped"
    assert message["text"].startswith(":x: Stop FAILED for stalled job: llama-70b")
    assert message["blocks"][0]["text"]["text"].startswith(":x: Stop FAILED for stalled job")
    assert "Stopped" not in json.dumps(message)
    # And the crashed host's error line comes first, marked, and a stop carries no buttons
    assert text.index("*algo-2*") < text.index("*algo-1*")
    assert "! RuntimeError: CUDA error: an illegal memory access" in text
    assert ACTIONS_BLOCK_ID not in text


def test_notify_alert_says_what_enforce_would_do_and_carries_buttons() -> None:
    decision = _decision(Action.ALERT, Mode.NOTIFY, would=Action.STOP)
    evidence = Evidence.of(decision, _signals(), None)
    message = AlertMessage(decision, FACTS, evidence, incident="incident#1", deployment=DEPLOYMENT).render()
    assert "no stop (mode notify; enforce would stop)" in message["text"]
    assert message["blocks"][-2]["block_id"] == ACTIONS_BLOCK_ID
    value = json.loads(message["blocks"][-2]["elements"][0]["value"])
    assert (value["deployment"], value["incident"]) == (DEPLOYMENT, "incident#1")


def test_long_logs_stay_within_slack_limits() -> None:
    lines = tuple(LogLine(NOW - i, "s", "x" * 2000) for i in range(5))
    signals = JobSignals(FACTS, NOW, {"algo-1": HostSignals("algo-1", log_tail=lines)})
    decision = _decision(Action.WARN)
    message = AlertMessage(decision, FACTS, Evidence.of(decision, signals, None)).render()
    sections = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section" and "text" in b]
    assert all(len(text) <= 3000 for text in sections)


def test_the_log_excerpt_leaves_out_the_agents_metric_lines_and_unknown_power() -> None:
    # Given a host whose tail mixes the agent's EMF lines with a human log line, and no power readings
    emf = '{"_aws": {"Timestamp": 1, "CloudWatchMetrics": []}, "Steps": 0}'
    lines = (LogLine(NOW - 2, "s", emf), LogLine(NOW - 1, "s", "still waiting for collective"), LogLine(NOW, "s", emf))
    signals = JobSignals(FACTS, NOW, {"algo-1": HostSignals("algo-1", log_tail=lines)})
    decision = replace(_decision(Action.WARN), evidence={"hosts": {"algo-1": {"gpu_util_now": 100.0}}})

    # When the warning is rendered
    text = _text(AlertMessage(decision, FACTS, Evidence.of(decision, signals, None)).render())

    # Then only the human line is quoted, and no empty power field is shown
    assert "still waiting for collective" in text
    assert "_aws" not in text
    assert "GPU power" not in text


class _Secrets:
    def __init__(self, secret: dict[str, str]) -> None:
        self.secret = secret
        self.reads = 0

    def get_secret_value(self, SecretId: str) -> dict[str, str]:
        self.reads += 1
        return {"SecretString": json.dumps(self.secret)}


def test_notifier_reports_a_bad_secret_and_an_unreachable_webhook_without_raising() -> None:
    # Given a secret without credentials, Then the post fails with the reason, and credentials() names the fields
    empty = SlackNotifier(_Secrets({"channel": "C1"}), "arn:secret")
    assert "needs 'webhook_url', or 'bot_token' and 'channel'" in empty.post({"text": "t", "blocks": []}).detail
    with pytest.raises(SlackSecretError, match="webhook_url"):
        empty.credentials()

    # Given a webhook on a closed port, Then the post fails, and the secret is read once for both attempts
    secrets = _Secrets({"webhook_url": "http://127.0.0.1:9/hook"})
    notifier = SlackNotifier(secrets, "arn:secret")
    results = [notifier.post({"text": "t", "blocks": []}) for _ in range(2)]
    assert not any(r.ok for r in results)
    assert secrets.reads == 1


def test_a_secret_fixed_after_a_failed_post_is_read_again_and_a_good_one_stays_cached(slack: SlackReceiver) -> None:
    # Given a secret saved without its webhook URL
    secrets = _Secrets({"signing_secret": "s"})
    notifier = SlackNotifier(secrets, "arn:secret")
    assert not notifier.post({"text": "t", "blocks": []}).ok

    # When the operator fixes it, Then the next post reads it again and is delivered
    secrets.secret = {"webhook_url": slack.url}
    assert notifier.post({"text": "t", "blocks": []}).ok
    assert secrets.reads == 2

    # And a secret that holds credentials is kept: more posts read nothing more
    notifier.post({"text": "t", "blocks": []})
    assert secrets.reads == 2


def test_the_secret_is_read_again_once_five_minutes_have_passed(
    slack: SlackReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a notifier that read its secret at 12:00 (Powertools' cache reads datetime.now())
    clock = {"now": datetime(2026, 11, 30, 12, 0, 0)}

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:
            return clock["now"]

    monkeypatch.setattr(parameters_base, "datetime", Frozen)
    secrets = _Secrets({"webhook_url": slack.url})
    notifier = SlackNotifier(secrets, "arn:secret")
    notifier.post({"text": "t", "blocks": []})

    # When posts follow a minute and then 5 min 1 s later, Then only the second reads the secret again
    clock["now"] += timedelta(minutes=1)
    notifier.post({"text": "t", "blocks": []})
    assert secrets.reads == 1
    clock["now"] += timedelta(minutes=4, seconds=1)
    notifier.post({"text": "t", "blocks": []})
    assert secrets.reads == 2


def test_price_table_covers_the_accelerated_types() -> None:
    for instance_type in (
        "ml.p4d.24xlarge",
        "ml.p4de.24xlarge",
        "ml.p5e.48xlarge",
        "ml.p5en.48xlarge",
        "ml.g5.48xlarge",
    ):
        assert INSTANCE_SPECS[instance_type].usd_per_hour > 0
    for instance_type in (
        "ml.trn1.32xlarge",
        "p4d.24xlarge",
        "p5.48xlarge",
        "g5.xlarge",
        "g6.12xlarge",
        "trn1.32xlarge",
    ):
        assert INSTANCE_SPECS[instance_type].usd_per_hour > 0
    assert INSTANCE_SPECS["g6.12xlarge"].devices == 4
    unknown = estimate_burn("x9.huge", hosts=2, seconds=1800)
    assert (unknown.device_hours, unknown.dollars) == (1.0, None)


def test_both_alarm_shapes_give_the_same_dedup_key() -> None:
    direct = parse_event(alarm_event("a.b"), AlarmEvent)
    bridged = parse_event(
        {
            "version": "0",
            "id": "1",
            "detail-type": "CloudWatch Alarm State Change",
            "source": "aws.cloudwatch",
            "account": "123456789012",
            "time": "2026-11-30T10:00:00Z",
            "region": "us-east-1",
            "resources": [],
            "detail": alarm_event("a.b")["alarmData"],
        },
        AlarmEvent,
    )
    assert direct.alarm.dedup_key == bridged.alarm.dedup_key == "a.b@2026-11-30T10:00:00.000+0000"


def test_job_state_event_accepts_tag_maps_and_lists_and_rejects_bad_names() -> None:
    event = job_state_event("job-1", "InProgress")
    event["detail"]["Tags"] = [{"Key": "stallwatch:mode", "Value": "enforce"}]
    parsed = parse_event(event, JobStateEvent)
    assert isinstance(parsed, TrainingJobStateChange)
    assert parsed.detail.tags == {"stallwatch:mode": "enforce"}
    event["detail"]["TrainingJobName"] = "bad name"
    with pytest.raises(InvalidEventError, match="TrainingJobName"):
        parse_event(event, JobStateEvent)


def _alarm_with(**changes: Any) -> dict[str, Any]:
    event = alarm_event("stallwatch-sagemaker.job-1.progress")
    event["alarmData"]["state"] |= changes.pop("state", {})
    event["alarmData"] |= changes
    return event


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (_alarm_with(state={"timestamp": "2026-11-30T10:00:00.000+0000" + "0" * 100_000}), "timestamp"),
        (_alarm_with(state={"timestamp": "yesterday at ten"}), "timestamp"),
        (_alarm_with(alarmName="stallwatch-sagemaker.job-1.gpu-idle." + "h" * 5000), "alarmName"),
        (_alarm_with(state={"reason": "r" * 2000}), "reason"),
        (alarm_event("a.b") | {"region": "us-east-1" + "x" * 100}, "region"),
    ],
)
def test_oversized_or_malformed_alarm_fields_are_refused_at_parse_time(event: dict[str, Any], field: str) -> None:
    # Given an alarm event with a field past AWS's own limits; When it is parsed, Then the field is named
    with pytest.raises(InvalidEventError, match=field) as raised:
        parse_event(event, AlarmEvent)
    # And the error stays short whatever the input's size
    assert len(str(raised.value)) < 1000


def test_an_alarm_name_of_255_characters_is_accepted() -> None:
    name = "stallwatch-sagemaker.job-1.gpu-idle." + "h" * (255 - 36)
    assert parse_event(_alarm_with(alarmName=name), AlarmEvent).alarm.alarm_name == name


def test_job_state_tags_are_bounded_like_sagemakers() -> None:
    event = job_state_event("job-1", "InProgress", tags={f"k{i}": "v" for i in range(51)})
    with pytest.raises(InvalidEventError, match="Tags"):
        parse_event(event, JobStateEvent)


def test_a_heterogeneous_clusters_state_change_parses_and_one_without_instances_is_refused() -> None:
    # Given the event of a job with ResourceConfig.InstanceGroups (no InstanceType, InstanceCount 0 beside them)
    groups = [
        {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "data", "InstanceType": "ml.c5.18xlarge", "InstanceCount": 1},
    ]
    event = job_state_event("hetero-1", "InProgress", groups=groups)
    event["detail"]["ResourceConfig"]["InstanceCount"] = 0

    # Then it parses with every group
    parsed = parse_event(event, JobStateEvent)
    assert [(g.instance_type, g.instance_count) for g in parsed.detail.resource_config.instance_groups] == [
        ("ml.p4d.24xlarge", 2),
        ("ml.c5.18xlarge", 1),
    ]
    # And a ResourceConfig with neither a type nor groups is refused, naming the field
    event["detail"]["ResourceConfig"] = {"VolumeSizeInGB": 100}
    with pytest.raises(InvalidEventError, match="ResourceConfig"):
        parse_event(event, JobStateEvent)


def test_bot_token_posts_to_the_channel_and_reports_api_errors(slack: SlackReceiver) -> None:
    # Given bot credentials and Slack's Web API on 127.0.0.1
    notifier = SlackNotifier(
        _Secrets({"bot_token": "xoxb-1", "channel": "C0ALERTS"}), "arn:secret", api_url=f"{slack.base}/api/"
    )
    slack.reply = b'{"ok": true, "ts": "1764496800.000100"}'

    # When a message is posted, Then it goes to the channel
    posted = notifier.post({"text": "hung", "blocks": []})
    assert (posted.ok, posted.detail) == (True, "chat.postMessage ts=1764496800.000100")
    assert slack.posts[0]["channel"] == "C0ALERTS"

    # When Slack refuses it, Then the error comes back without raising
    slack.reply = b'{"ok": false, "error": "channel_not_found"}'
    refused = notifier.post({"text": "hung", "blocks": []})
    assert (refused.ok, refused.detail) == (False, "Slack API error: channel_not_found")


def test_a_follow_up_goes_in_the_alerts_thread_in_bot_mode(slack: SlackReceiver) -> None:
    # Given bot credentials, and an alert whose timestamp Slack returned
    notifier = SlackNotifier(
        _Secrets({"bot_token": "xoxb-1", "channel": "C0ALERTS"}), "arn:secret", api_url=f"{slack.base}/api/"
    )
    slack.reply = b'{"ok": true, "ts": "1764496800.000100"}'
    alert = notifier.post({"text": "stopped", "blocks": []})
    assert alert.ts == "1764496800.000100"

    # When a follow-up is posted in its thread
    notifier.post(follow_up("`llama` resumed as `llama-r1` (attempt 1 of 2)", alert.ts))

    # Then Slack gets it as a reply to the alert; without a ts it stands alone (webhook mode)
    assert slack.posts[1]["thread_ts"] == "1764496800.000100"
    assert slack.posts[1]["text"] == "`llama` resumed as `llama-r1` (attempt 1 of 2)"
    assert "thread_ts" not in follow_up("text")


def test_a_straggler_alert_names_the_host_and_shows_the_spread() -> None:
    # Given the engine's straggler evidence for 4 hosts, algo-3 1.8x slower than the others
    values = {"algo-1": 1.9, "algo-2": 1.92, "algo-3": 3.42, "algo-4": 1.88}
    straggler = {"host": "algo-3", "metric": "StepTime", "ratio": 1.78, "others_median": 1.9, "values": values}
    reasons = ("straggler algo-3: StepTime 3.42 s against a median of 1.9 s on the other 3 hosts (1.78x slower)",)
    decision = Decision(
        "llama-70b", NOW, Diagnosis.STRAGGLER, Action.ALERT, Mode.ENFORCE, reasons, {"straggler": straggler}
    )

    # When the alert is rendered
    message = AlertMessage(decision, FACTS, Evidence.of(decision, _signals(), None), incident="incident#1").render()

    # Then a section names the host to cordon and lists every host's step time, the straggler first
    (section,) = [b for b in message["blocks"] if "*Straggler*" in b.get("text", {}).get("text", "")]
    text = section["text"]["text"]
    assert "`algo-3` StepTime 3.42 s, 1.78x off the other hosts' median of 1.9 s" in text
    assert all(host in text for host in values)
    assert text.index("algo-3") < text.index("algo-2") < text.index("algo-1") < text.index("algo-4")
    # And the straggler's own log lines come before the other hosts'
    logs = _text(message)
    assert logs.index("*algo-3*") < logs.index("*algo-1*")


def test_oversized_text_is_fitted_to_block_kits_limits_and_every_block_is_a_valid_model() -> None:
    # Given a 512-host straggler, 200 long reasons, a 63-character job name and 5,000-character log lines
    values = {f"algo-{i}": 1.9 for i in range(1, 513)} | {"algo-7": 3.4}
    straggler = {"host": "algo-7", "metric": "StepTime", "ratio": 1.79, "others_median": 1.9, "values": values}
    reasons = tuple(f"reason {i}: " + "x" * 100 for i in range(200))
    facts = replace(FACTS, name="j" * 63)
    decision = Decision(
        facts.name, NOW, Diagnosis.STRAGGLER, Action.ALERT, Mode.ENFORCE, reasons, {"straggler": straggler}
    )
    lines = tuple(LogLine(NOW - i, "s", f"line {i} " + "y" * 5000) for i in range(3))
    signals = JobSignals(facts, NOW, {"algo-7": HostSignals("algo-7", log_tail=lines)})

    # When the alert is rendered
    evidence = Evidence.of(decision, signals, None)
    message = AlertMessage(decision, facts, evidence, incident="incident#1", deployment=DEPLOYMENT).render()

    # Then every block is one slack_sdk's models take and check as it is (its limits: section text 3,000 characters,
    # header 150, 10 fields, button values 2,000, at most 50 blocks)
    assert len(message["blocks"]) <= 50
    for block in message["blocks"]:
        assert Block.parse(block).to_dict() == block
    sections = {b["text"]["text"].split("\n", 1)[0]: b["text"]["text"] for b in message["blocks"] if "text" in b}
    # And the cut text says so, code blocks stay closed, the slowest hosts and the newest log line stay in
    why = next(text for head, text in sections.items() if head == "*Why*")
    assert (len(why), why[-1]) == (SectionBlock.text_max_length, "…")
    spread = next(text for head, text in sections.items() if head.startswith("*Straggler*"))
    assert spread.endswith("```")
    assert len(spread) <= SectionBlock.text_max_length
    assert "&gt; algo-7" in spread  # the straggler's mark, escaped
    log = next(text for head, text in sections.items() if head.startswith("*algo-7*"))
    assert log.endswith("y```")
    assert len(log) == SectionBlock.text_max_length
    assert len(message["blocks"][0]["text"]["text"]) <= HeaderBlock.text_max_length
