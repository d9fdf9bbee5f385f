"""One adapter per platform behind one interface (`core.platforms.interface.PlatformAdapter`).

    source = adapter(facts.platform, clients, config)     # SageMakerPlatform, Ec2Platform
    source.facts("llm-70b"); source.job_signals("llm-70b", now); source.stop(facts)

A new platform is a module beside `sagemaker` and `ec2` (a class over `aws.source.AwsSignalSource`) and its entry in
`ADAPTERS`, with its description in `core.platforms`; callers never branch on the platform (docs/lambdas.md,
"Platforms").
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.platforms.ec2 import Ec2Platform
from stallwatch.aws.platforms.sagemaker import SageMakerPlatform
from stallwatch.aws.source import AwsSignalSource
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.core.signals import Platform

ADAPTERS: dict[Platform, type[AwsSignalSource]] = {a.platform: a for a in (SageMakerPlatform, Ec2Platform)}


def adapter(platform: Platform | str, clients: AwsClients, config: StallwatchConfig | None = None) -> PlatformAdapter:
    """The adapter of `platform`, over `clients`, reading jobs after `config`'s policy (its defaults if None)."""
    return ADAPTERS[Platform(platform)](clients, config)


def adapters(clients: AwsClients, config: StallwatchConfig | None = None) -> list[PlatformAdapter]:
    """Every platform's adapter, in registry order."""
    return [adapter(platform, clients, config) for platform in ADAPTERS]


def platform_of(event: Any) -> Platform:
    """The platform whose state-change event (`PlatformAdapter.state_event`) `event` is."""
    for platform, kind in ADAPTERS.items():
        if isinstance(event, kind.state_event):
            return platform
    raise TypeError(f"{type(event).__name__} is no platform's state-change event")
