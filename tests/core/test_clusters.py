"""Which hosts make a job: EC2 instance groups by tag (merged tags, safer values), SageMaker instance groups."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms.sagemaker import sagemaker_layout
from stallwatch.core.policy import Mode, Policy, Thresholds
from stallwatch.core.signals import JobFacts, Platform

I1, I2, I3 = "i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c"


def test_an_instance_belongs_to_its_job_tag_else_to_itself_when_monitored_else_to_nobody() -> None:
    assert clusters.job_of({"stallwatch:job": "llm-70b", "stallwatch:monitor": "true"}, I1) == "llm-70b"
    assert clusters.job_of({"stallwatch:monitor": "True"}, I1) == I1
    assert clusters.job_of({"team": "nlp"}, I1) is None


def test_a_job_tag_that_cannot_name_a_job_is_reported_and_not_used() -> None:
    tags = {"stallwatch:job": "llm.70b", "stallwatch:monitor": "true"}
    assert "llm.70b" in clusters.job_tag_error(tags)
    assert clusters.job_of(tags, I1) == I1  # still watched alone, as its monitor tag asks
    assert clusters.job_of({"stallwatch:job": "x" * 64}, I1) is None


def test_tags_all_instances_share_are_kept_and_other_differences_are_dropped_silently() -> None:
    merged = clusters.merge_instance_tags(
        [{"stallwatch:job": "j", "Name": "node-1"}, {"stallwatch:job": "j", "Name": "node-2"}], Policy()
    )
    assert merged.tags == {"stallwatch:job": "j"}
    assert merged.errors == []


def test_disagreeing_modes_are_a_tag_error_and_the_least_acting_mode_applies() -> None:
    merged = clusters.merge_instance_tags(
        [{"stallwatch:mode": "enforce"}, {"stallwatch:mode": "observe"}, {"stallwatch:mode": "enforce"}], Policy()
    )
    assert merged.tags["stallwatch:mode"] == "observe"
    assert len(merged.errors) == 1
    assert "stallwatch:mode" in merged.errors[0]


def test_a_stop_opt_in_that_some_instances_lack_never_applies() -> None:
    # Given an enforce deployment default: the instance without the tag is enforce too, but IAM would refuse to stop it
    policy = Policy(mode=Mode.ENFORCE, stop_requires_tag=True)
    merged = clusters.merge_instance_tags([{"stallwatch:mode": "enforce"}, {}], policy)

    # Then the tag is left out, so the job may not be stopped
    assert "stallwatch:mode" not in merged.tags
    assert policy.for_job(merged.tags).may_stop is False
    assert merged.errors


@pytest.mark.parametrize(
    ("key", "values", "safer"),
    [
        ("stallwatch:stall-minutes", ["20", "45"], "45"),
        ("stallwatch:idle-gpu-percent", ["5", "2"], "2"),
        ("stallwatch:stop-on-nonfinite-loss", ["true", "false"], "false"),
        ("stallwatch:power-drop-ratio", ["0.6", "0.4"], "0.4"),
        ("stallwatch:stall-minutes", ["20", "soon"], "20"),
    ],
)
def test_disagreeing_thresholds_take_the_value_that_acts_later(key: str, values: list[str], safer: str) -> None:
    merged = clusters.merge_instance_tags([{key: v} for v in values], Policy())
    assert merged.tags[key] == safer


def test_a_threshold_missing_on_some_instances_counts_as_the_policys_value() -> None:
    policy = Policy(thresholds=Thresholds(stall_minutes=60))
    merged = clusters.merge_instance_tags([{"stallwatch:stall-minutes": "20"}, {}], policy)
    assert "stallwatch:stall-minutes" not in merged.tags  # 60 (the policy's) is the later one
    assert policy.for_job(merged.tags).thresholds.stall_minutes == 60


def test_every_threshold_has_a_safer_direction_that_is_a_real_field() -> None:
    assert set(Thresholds.model_fields) >= clusters.SAFER_LOWER


def test_an_ec2_jobs_status_and_hosts_follow_its_running_instances() -> None:
    assert clusters.ec2_status(["running", "stopped"]) == "InProgress"
    assert clusters.ec2_status(["stopping", "stopped"]) == "Stopping"
    assert clusters.ec2_status(["stopped", "terminated"]) == "Stopped"
    assert clusters.ec2_hosts({I2: "running", I1: "running", I3: "stopped"}) == [I1, I2]
    assert clusters.ec2_hosts({I2: "stopped", I1: "terminated"}) == [I1, I2]  # ended: all of them


def test_a_host_that_leaves_shrinks_the_job_and_the_last_one_ends_it() -> None:
    facts = JobFacts("j", Platform.EC2, "InProgress", None, 0.0, "p4d.24xlarge", 2, 8, 96, instance_ids=(I1, I2))
    smaller = facts.without_host(I1)
    assert (smaller.instance_ids, smaller.instance_count, smaller.status) == ((I2,), 1, "InProgress")
    assert smaller.without_host(I2).status == "Stopped"


def test_a_log_group_tag_outside_the_configured_group_is_refused() -> None:
    assert clusters.log_group_of({"stallwatch:log-group": "/stallwatch/ec2/llm"}, "/stallwatch/ec2") == (
        "/stallwatch/ec2/llm",
        None,
    )
    group, error = clusters.log_group_of({"stallwatch:log-group": "/secret/app"}, "/stallwatch/ec2")
    assert group == "/stallwatch/ec2"
    assert "/secret/app" in error


def test_a_heterogeneous_sagemaker_cluster_numbers_hosts_across_its_groups() -> None:
    # Given DescribeTrainingJob's ResourceConfig of a heterogeneous cluster
    resources = {
        "InstanceGroups": [
            {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
            {"InstanceGroupName": "data", "InstanceType": "ml.g5.12xlarge", "InstanceCount": 1},
            {"InstanceGroupName": "spare", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 0},
        ],
        "VolumeSizeInGB": 100,
    }
    layout = sagemaker_layout(resources)
    assert (layout.instance_type, layout.instance_count) == ("ml.p4d.24xlarge", 3)
    assert layout.host_types == {"algo-1": "ml.p4d.24xlarge", "algo-2": "ml.p4d.24xlarge", "algo-3": "ml.g5.12xlarge"}
    facts = JobFacts(
        "het", Platform.SAGEMAKER, "InProgress", None, 0.0, "ml.p4d.24xlarge", 3, 8, 96, host_types=layout.host_types
    )
    assert [facts.gpus_on(h) for h in ("algo-1", "algo-3")] == [8, 4]
    assert facts.fleet() == {"ml.p4d.24xlarge": 2, "ml.g5.12xlarge": 1}


def test_a_homogeneous_resource_config_has_no_per_host_types() -> None:
    layout = sagemaker_layout({"InstanceType": "ml.p5.48xlarge", "InstanceCount": 4})
    assert (layout.instance_type, layout.instance_count, layout.host_types) == ("ml.p5.48xlarge", 4, {})


def test_the_ec2_log_group_is_configured_and_a_bad_name_is_refused() -> None:
    assert StallwatchConfig().ec2_log_group == "/stallwatch/ec2"
    assert StallwatchConfig(ec2_log_group="/training/ec2").ec2_log_group == "/training/ec2"
    with pytest.raises(ValidationError, match="ec2_log_group"):
        StallwatchConfig(ec2_log_group="bad group!")
