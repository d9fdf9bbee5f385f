"""Each platform's description names the log group whose fatal lines a subscription sends to on_log_line."""

from __future__ import annotations

from stallwatch.core import contract
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms import subscribed_log_groups
from stallwatch.core.signals import Platform


def _config(**raw: object) -> StallwatchConfig:
    return StallwatchConfig.model_validate(raw)


def test_every_watched_platforms_log_group_is_subscribed_by_default() -> None:
    assert subscribed_log_groups(_config(ec2_log_group="/team/ec2")) == {
        Platform.SAGEMAKER: contract.SAGEMAKER_LOG_GROUP,
        Platform.EC2: "/team/ec2",
        Platform.SLURM: "/team/ec2/slurm",
    }


def test_a_platform_not_watched_or_not_subscribed_has_no_subscribed_group() -> None:
    unwatched = _config(policy={"monitor_ec2": False, "monitor_slurm": False})
    assert list(subscribed_log_groups(unwatched)) == [Platform.SAGEMAKER]
    ec2_only = _config(log_subscriptions={"sagemaker": False, "slurm": False})
    assert list(subscribed_log_groups(ec2_only)) == [Platform.EC2]
    unsubscribed = _config(log_subscriptions={"sagemaker": False, "ec2": False, "slurm": False})
    assert subscribed_log_groups(unsubscribed) == {}
