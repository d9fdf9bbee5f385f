"""Each platform's description names the log group whose fatal lines a subscription sends to on_log_line."""

from __future__ import annotations

from stallwatch.core import contract
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.signals import Platform


def _config(**raw: object) -> StallwatchConfig:
    return StallwatchConfig.model_validate(raw)


def test_every_watched_platforms_log_group_is_subscribed_by_default() -> None:
    watched = _config(ec2_log_group="/team/ec2", platforms={"slurm": {"monitor": True}})
    assert watched.subscribed_log_groups() == {
        Platform.SAGEMAKER: contract.SAGEMAKER_LOG_GROUP,
        Platform.EC2: "/team/ec2",
        Platform.SLURM: "/team/ec2/slurm",
    }


def test_a_platform_not_watched_or_not_subscribed_has_no_subscribed_group() -> None:
    assert list(_config().subscribed_log_groups()) == [Platform.SAGEMAKER, Platform.EC2]  # Slurm is off by default
    unwatched = _config(platforms={"ec2": {"monitor": False}})
    assert list(unwatched.subscribed_log_groups()) == [Platform.SAGEMAKER]
    ec2_only = _config(
        platforms={"sagemaker": {"log_subscription": False}, "slurm": {"monitor": True, "log_subscription": False}}
    )
    assert list(ec2_only.subscribed_log_groups()) == [Platform.EC2]
    unsubscribed = _config(platforms={p.value: {"log_subscription": False} for p in Platform})
    assert unsubscribed.subscribed_log_groups() == {}
