"""The platforms Stallwatch watches, each described by one module here (`interface.PlatformDescription`).

    describe(Platform.EC2).host_names(facts)     # instance ids; SageMaker's: algo-1..algo-N
    subscribed_log_groups(config)                # {platform: the log group whose fatal lines wake the engine}
    job_name_error("llm.70b", Platform.EC2)      # why a name cannot be an EC2 job's (None when it can)

A new platform is a module beside `sagemaker`, `ec2` and `slurm` and its entry in `DESCRIPTIONS` (and its adapter in
`aws.platforms`); see docs/lambdas.md, "Platforms".
"""

from __future__ import annotations

from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms.ec2 import EC2
from stallwatch.core.platforms.interface import PlatformDescription
from stallwatch.core.platforms.sagemaker import SAGEMAKER
from stallwatch.core.platforms.slurm import SLURM
from stallwatch.core.signals import Platform

DESCRIPTIONS: dict[Platform, PlatformDescription] = {d.platform: d for d in (SAGEMAKER, EC2, SLURM)}
# A job named without its platform (the CLI's default, a name no hint claims) is a SageMaker job's.
DEFAULT = Platform.SAGEMAKER


def describe(platform: Platform | str) -> PlatformDescription:
    return DESCRIPTIONS[Platform(platform)]


def likely(name: str) -> list[Platform]:
    """The platforms a job named `name` may be on, the likeliest first: those whose names it looks like (an
    instance id: EC2), then the others in registry order."""
    hinted = [p for p, d in DESCRIPTIONS.items() if d.name_hint is not None and d.name_hint.match(name)]
    return [*hinted, *(p for p in DESCRIPTIONS if p not in hinted)]


def job_name_error(name: str, platform: Platform | None = None) -> str | None:
    """Why `name` cannot name a job of `platform` (None: of any platform); None when it can."""
    candidates = [describe(platform)] if platform is not None else list(DESCRIPTIONS.values())
    if any(d.names_job(name) for d in candidates):
        return None
    if platform is not None:
        where = describe(platform).job_kind
    else:
        labels = [d.label for d in DESCRIPTIONS.values()]
        where = f"a {', '.join(labels[:-1])} or {labels[-1]} job"
    return f"{name[:80]!r} cannot name {where}: 1 to 63 letters, digits and '-' (EC2 job tags also '_')"


def subscribed_log_groups(config: StallwatchConfig) -> dict[Platform, str]:
    """The log group of each watched platform whose fatal lines a subscription filter sends to on_log_line (where
    `config.log_subscriptions` subscribes it and the platform has one)."""
    found = {}
    for platform, description in DESCRIPTIONS.items():
        group = description.log_group(config)
        watched = getattr(config.policy, description.monitor_setting)
        if group is not None and watched and config.log_subscriptions.of(platform):
            found[platform] = group
    return found
