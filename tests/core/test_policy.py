"""The policy: per-job tag overrides, bad tags reported and ignored, validation messages that name the field."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from localrun import moto_logs_filter
from stallwatch.core import log_patterns
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.policy import LogLines, Mode, Policy, Thresholds


def test_tags_override_mode_and_thresholds() -> None:
    # Given the default policy / When a job is tagged enforce with a longer stall threshold
    effective = Policy().for_job({"stallwatch:mode": " Enforce ", "stallwatch:stall-minutes": "45"})
    # Then both apply and nothing is reported
    assert effective.mode is Mode.ENFORCE
    assert effective.thresholds.stall_minutes == 45.0
    assert effective.tag_errors == []


def test_untagged_job_gets_the_global_policy_unchanged() -> None:
    policy = Policy(mode=Mode.OBSERVE, thresholds=Thresholds(stall_minutes=30))
    effective = policy.for_job({"team": "nlp"})
    assert effective.mode is Mode.OBSERVE
    assert effective.thresholds == policy.thresholds
    assert effective.may_stop is False


def test_overrides_do_not_leak_into_the_global_policy() -> None:
    policy = Policy()
    policy.for_job({"stallwatch:stall-minutes": "90"})
    assert policy.thresholds.stall_minutes == Thresholds().stall_minutes


@pytest.mark.parametrize(
    ("tags", "may_stop"),
    [
        ({"stallwatch:mode": "enforce"}, True),
        ({"stallwatch:mode": "notify"}, False),
        ({}, False),
    ],
)
def test_stops_need_the_enforce_tag_when_the_policy_requires_it(tags: dict[str, str], may_stop: bool) -> None:
    assert Policy(mode=Mode.ENFORCE, stop_requires_tag=True).for_job(tags).may_stop is may_stop


def test_global_enforce_may_stop_untagged_jobs_when_tags_are_not_required() -> None:
    assert Policy(mode=Mode.ENFORCE, stop_requires_tag=False).for_job({}).may_stop is True


@pytest.mark.parametrize(
    ("tag", "value", "field_default", "message"),
    [
        ("stallwatch:stall-minutes", "abc", ("stall_minutes", 15.0), "valid number"),
        ("stallwatch:stall-minutes", "-5", ("stall_minutes", 15.0), "greater than 0"),
        ("stallwatch:step-interval-factor", "0.5", ("step_interval_factor", 5.0), "greater than or equal to 1"),
        ("stallwatch:idle-gpu-percent", "95", ("idle_gpu_percent", 5.0), "must be below busy_gpu_percent"),
        ("stallwatch:alarm-period-seconds", "45", ("alarm_period_seconds", 60), "10, 30 or a multiple of 60"),
        ("stallwatch:alarm-period-seconds", "0", ("alarm_period_seconds", 60), "greater than 0"),
        ("stallwatch:alarm-period-seconds", "-60", ("alarm_period_seconds", 60), "greater than 0"),
        ("stallwatch:stop-on-nonfinite-loss", "perhaps", ("stop_on_nonfinite_loss", False), "valid boolean"),
    ],
)
def test_bad_tag_value_is_reported_and_ignored(
    tag: str, value: str, field_default: tuple[str, object], message: str
) -> None:
    # Given a job with one bad threshold tag and one good one
    effective = Policy().for_job({tag: value, "stallwatch:log-silence-minutes": "40"})
    # Then the bad one is reported, naming the tag and value, and the threshold keeps its default
    (error,) = effective.tag_errors
    assert error.startswith(f"{tag}={value!r}")
    assert message in error
    name, default = field_default
    assert getattr(effective.thresholds, name) == default
    # And the good one still applies
    assert effective.thresholds.log_silence_minutes == 40.0


def test_bad_mode_tag_is_reported_and_the_global_mode_kept() -> None:
    effective = Policy(mode=Mode.NOTIFY).for_job({"stallwatch:mode": "kill"})
    assert effective.mode is Mode.NOTIFY
    assert effective.tag_errors == ["stallwatch:mode='kill': expected one of ['off', 'observe', 'notify', 'enforce']"]


def test_tag_overrides_validated_together_regardless_of_order() -> None:
    # Given tags that are only consistent together (idle must stay below busy)
    tags = {"stallwatch:idle-gpu-percent": "92", "stallwatch:busy-gpu-percent": "98"}
    # When applied in either order / Then both apply
    for ordered in (tags, dict(reversed(list(tags.items())))):
        effective = Policy().for_job(ordered)
        assert (effective.thresholds.idle_gpu_percent, effective.thresholds.busy_gpu_percent) == (92.0, 98.0)
        assert effective.tag_errors == []


def test_unrelated_and_non_threshold_stallwatch_tags_are_ignored() -> None:
    effective = Policy().for_job({"stallwatch:monitor": "true", "Name": "gpu-box", "stallwatch:owner": "ana"})
    assert effective.tag_errors == []
    assert effective.thresholds == Thresholds()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"stall_minutes": 0}, "stall_minutes"),
        ({"busy_gpu_percent": 120}, "busy_gpu_percent"),
        ({"power_drop_ratio": 1.5}, "power_drop_ratio"),
        ({"crash_confirm_minutes": -1}, "crash_confirm_minutes"),
        ({"idle_gpu_percent": 50, "busy_gpu_percent": 40}, "idle_gpu_percent"),
        ({"alarm_period_seconds": 90}, "alarm_period_seconds"),
        ({"stall_minuets": 30}, "stall_minuets"),
    ],
)
def test_threshold_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Thresholds(**kwargs)


@pytest.mark.parametrize("period", [10, 30, 60, 300])
def test_supported_alarm_periods_validate(period: int) -> None:
    assert Thresholds(alarm_period_seconds=period).alarm_period_seconds == period


def test_the_slack_secrets_fields_choose_the_mode_and_the_config_has_none_to_set() -> None:
    from stallwatch.core.config import SlackMode, StallwatchConfig, slack_mode_of

    # The secret decides: a webhook, else a bot token with a channel, else nothing can post
    assert slack_mode_of({"webhook_url": "https://hooks.slack.com/services/T/B/x"}) is SlackMode.WEBHOOK
    assert slack_mode_of({"bot_token": "xoxb-1", "channel": "C0123"}) is SlackMode.BOT
    assert slack_mode_of({"bot_token": "xoxb-1"}) is None
    assert slack_mode_of({}) is None
    # A config that still sets slack.mode (the docs once said to) fails with what to do, instead of being ignored
    with pytest.raises(ValueError, match=r"slack.mode is not a setting: the secret's fields choose the mode"):
        StallwatchConfig.model_validate({"slack": {"mode": "bot"}})


# --- your own log lines ----------------------------------------------------------------------------------------------


def test_your_own_lines_name_lines_and_join_the_subscription_filter() -> None:
    # Given a deployment's own fatal line and checkpoint markers
    policy = Policy(log_lines=LogLines(fatal=[r"Loss is NaN, giving up"], checkpoint_start=["snapshotting state to "]))
    patterns = policy.for_job({}).line_patterns
    # Then a job's lines are named by them, and CloudWatch Logs is asked for them
    assert patterns.match("step 12: Loss is NaN, giving up") == log_patterns.USER_FATAL
    assert patterns.marker("snapshotting state to /fsx/s1") == log_patterns.CHECKPOINT_START
    assert moto_logs_filter.keeps(policy.fatal_filter_pattern, "step 12: Loss is NaN, giving up")
    assert Policy().for_job({}).line_patterns is log_patterns.BUILT_IN


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("Loss is (NaN", "is not a regular expression"),
        ("(NaN|inf) loss", "write each alternative as its own entry"),
        ("a+b+c+d+ failed", "repeats without bound"),
        ("x" * 201, "at most 200"),
        ("x*", "matches an empty line"),
    ],
    ids=["does-not-compile", "group", "repetitions", "too-long", "matches-everything"],
)
def test_a_bad_line_fails_synth_naming_the_field(pattern: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says) as raised:
        Policy.model_validate({"log_lines": {"checkpoint_end": ["ok line", pattern]}})
    assert raised.value.errors()[0]["loc"] == ("log_lines", "checkpoint_end")
    assert "entry 1" in str(raised.value)


def test_lines_that_would_overflow_the_filter_pattern_fail_synth() -> None:
    # Given ten 150-character fatal lines: the fatal filter pattern would pass CloudWatch's 1,024 characters
    lines = [f"failure number {i} " + "x" * 130 for i in range(10)]
    with pytest.raises(ValidationError, match="at most 1024"):
        Policy.model_validate({"log_lines": {"fatal": lines}})


def test_a_jobs_tag_adds_its_own_line_and_a_bad_one_is_reported_and_ignored() -> None:
    # Given a SageMaker tag value (letters, spaces, `.` and `+` only) naming the job's own fatal line
    tags = {"stallwatch:fatal-line": "Loss is NaN.+giving up", "stallwatch:checkpoint-end-line": "(done|ok)"}
    effective = Policy().for_job(tags)
    # Then the job's lines are named by it; the group, which no filter pattern can hold, is reported and ignored
    assert effective.line_patterns.match("Loss is NaN after 3 tries, giving up") == log_patterns.USER_FATAL
    fatal_filter, _ = effective.line_patterns.filter_patterns
    assert moto_logs_filter.keeps(fatal_filter, "Loss is NaN after 3 tries, giving up")
    assert any("stallwatch:checkpoint-end-line" in error for error in effective.tag_errors)
    assert effective.line_patterns.marker("done") is None


def test_the_example_in_the_engine_docs_validates() -> None:
    text = (Path(__file__).parents[2] / "docs" / "engine.md").read_text(encoding="utf-8")
    example = text.split("## Your own log lines", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    policy = Policy.model_validate(json.loads(example))
    assert policy.log_lines.fatal
    assert policy.log_lines.checkpoint_start
    assert policy.log_lines.checkpoint_end


def test_the_deployments_config_names_the_bad_line_at_synth() -> None:
    # Given cdk.json's stallwatch context with a group in a fatal line (no CloudWatch filter pattern can hold it)
    with pytest.raises(ValidationError) as raised:
        StallwatchConfig.model_validate({"policy": {"log_lines": {"fatal": ["(NaN|inf) loss"]}}})
    # Then synth fails naming the field, and says what to write instead
    assert raised.value.errors()[0]["loc"] == ("policy", "log_lines", "fatal")
    assert "write each alternative as its own entry" in str(raised.value)


# ---- each platform's settings, under `platforms:` ------------------------------------------------------------------


def test_each_platform_has_its_settings_under_platforms_and_slurm_is_off_until_a_cluster_is_set_up() -> None:
    config = StallwatchConfig()
    assert [name for name in type(config.platforms).model_fields] == ["sagemaker", "ec2", "slurm"]
    assert (config.watches("sagemaker"), config.watches("ec2"), config.watches("slurm")) == (True, True, False)
    assert all(config.platforms.of(name).log_subscription for name in ("sagemaker", "ec2", "slurm"))
    assert StallwatchConfig.model_validate({"platforms": {"slurm": {"monitor": True}}}).watches("slurm")


def test_the_old_keys_are_read_for_this_release_with_a_warning_that_says_what_to_write() -> None:
    # Given last release's keys: a policy's monitor_<platform>, and log_subscriptions.<platform>
    old = {
        "policy": {"mode": "notify", "monitor_slurm": True, "monitor_ec2": False},
        "log_subscriptions": {"slurm": False},
    }
    # When the config is read, Then each warns, naming the key to write instead
    with pytest.warns(FutureWarning) as warned:
        config = StallwatchConfig.model_validate(old)
    assert sorted(str(w.message) for w in warned) == [
        "log_subscriptions.slurm is deprecated and read for this release only: write platforms.slurm.log_subscription",
        "policy.monitor_ec2 is deprecated and read for this release only: write platforms.ec2.monitor",
        "policy.monitor_slurm is deprecated and read for this release only: write platforms.slurm.monitor",
    ]
    # And they mean what the new keys do, and the caller's object is left as it was
    new = {"platforms": {"slurm": {"monitor": True, "log_subscription": False}, "ec2": {"monitor": False}}}
    assert config == StallwatchConfig.model_validate(new)
    assert old["policy"]["monitor_slurm"] is True
    assert "log_subscriptions" in old


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"platforms": {"ec2": {"monitor": "maybe"}}}, "platforms.ec2.monitor"),
        ({"platforms": {"kubernetes": {"monitor": True}}}, "platforms.kubernetes"),
        ({"platforms": {"slurm": {"log_subscription": True, "montior": True}}}, "platforms.slurm.montior"),
        ({"policy": {"monitor_ec2": "maybe"}}, "policy.monitor_ec2"),
        ({"log_subscriptions": {"kubernetes": True}}, "log_subscriptions.kubernetes"),
        ({"policy": {"monitor_ec2": False}, "platforms": {"ec2": {"monitor": True}}}, "platforms.ec2.monitor"),
    ],
)
def test_a_bad_platform_setting_fails_naming_the_field(raw: dict[str, object], named: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # an old key's warning: the test above
        with pytest.raises(ValidationError) as raised:
            StallwatchConfig.model_validate(raw)
    errors = raised.value.errors()
    assert named in {".".join(map(str, e["loc"])) for e in errors} or named in str(raised.value)
