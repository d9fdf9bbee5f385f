"""The platforms Stallwatch watches, each described by one module here (`interface.PlatformDescription`).

    describe(Platform.EC2).host_names(facts)     # instance ids; SageMaker's: algo-1..algo-N
    job_name_error("llm.70b", Platform.EC2)      # why a name cannot be an EC2 job's (None when it can)

A new platform is a module here whose `DESCRIPTION` describes it (its settings the `settings` sub-model of
`platforms.<name>` in the config), and its line in `PLATFORMS`; its adapter is `aws.platforms.<name>`, its construct
`stacks/platforms/<name>.py` (docs/lambdas.md, "Platforms").
"""

from __future__ import annotations

from importlib import import_module

from stallwatch.core.platforms.interface import PlatformDescription
from stallwatch.core.signals import Platform

# The platforms in registry order, by module: one line each.
PLATFORMS = (
    "sagemaker",
    "ec2",
    "slurm",
)
DESCRIPTIONS: dict[Platform, PlatformDescription] = {
    d.platform: d for d in (import_module(f"{__name__}.{name}").DESCRIPTION for name in PLATFORMS)
}
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
