"""One adapter per platform behind one interface (`core.platforms.interface.PlatformAdapter`).

    source = adapter(facts.platform, clients, config, store)   # SageMakerPlatform, Ec2Platform, SlurmPlatform
    source.facts("llm-70b"); source.job_signals("llm-70b", now); source.stop(facts)

A platform's adapter is the module of its name here, whose `ADAPTER` is its class (over `aws.source.AwsSignalSource`):
the platforms are those of `core.platforms.PLATFORMS`, and nothing here changes for a new one. Callers never branch
on the platform (docs/lambdas.md, "Platforms").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import import_module
from typing import Any

from stallwatch.aws.clients import AwsClients
from stallwatch.aws.source import AwsSignalSource
from stallwatch.aws.ssm import Documents
from stallwatch.aws.store import Store
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.core.platforms.interface import PlatformAdapter
from stallwatch.core.signals import Platform

ADAPTERS: dict[Platform, type[AwsSignalSource]] = {
    p: import_module(f"{__name__}.{p.value}").ADAPTER for p in DESCRIPTIONS
}


def adapter(
    platform: Platform | str,
    clients: AwsClients,
    config: StallwatchConfig | None = None,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
    documents: Documents | None = None,
) -> PlatformAdapter:
    """The adapter of `platform`, over `clients`, reading jobs after `config`'s policy (its defaults if None); `store`:
    the deployment's table, where a platform whose jobs are known from their events keeps them (Slurm); `clock`: the
    time facts that age are read at; `documents`: the deployment's SSM documents its actions send (none if None).
    The runtime builds its adapters one way, with all of these (`Runtime.source`)."""
    return ADAPTERS[Platform(platform)](clients, config, store, clock, documents)


def adapters(
    clients: AwsClients, config: StallwatchConfig | None = None, store: Store | None = None
) -> list[PlatformAdapter]:
    """Every platform's adapter, in registry order."""
    return [adapter(platform, clients, config, store) for platform in ADAPTERS]


def platform_of(event: Any) -> Platform:
    """The platform whose state-change event (`PlatformAdapter.state_event`) `event` is."""
    for platform, kind in ADAPTERS.items():
        if isinstance(event, kind.state_event):
            return platform
    raise TypeError(f"{type(event).__name__} is no platform's state-change event")
