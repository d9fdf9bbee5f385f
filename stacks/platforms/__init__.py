"""Each platform's part of the stack (`base.PlatformStack`): the module of its name here, whose `PART` is its class.

    parts = watched(stack, config)       # the parts of the platforms `platforms.<name>.monitor` turns on

The platforms are the config's (`platforms:`, from `stallwatch.core.platforms.PLATFORMS`): a new platform's part is
a module here of its name, and nothing else in the stacks changes.
"""

from __future__ import annotations

from importlib import import_module

from aws_cdk import Stack

from stacks.platforms.base import PlatformStack
from stallwatch.core.config import StallwatchConfig


def part_of(name: str) -> type[PlatformStack]:
    """The part of the platform `name` (its module's `PART`)."""
    part: type[PlatformStack] = import_module(f"{__name__}.{name}").PART
    return part


def watched(stack: Stack, config: StallwatchConfig) -> list[PlatformStack]:
    """The parts of the platforms the deployment watches, in the config's order."""
    return [part_of(name)(stack, config) for name in type(config.platforms).model_fields if config.watches(name)]
