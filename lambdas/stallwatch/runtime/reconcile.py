"""The sweeper's look at each platform's own view of its running jobs (`PlatformAdapter.reconcile`): what happened
that no event told is applied as its event would have been (`provision.apply_change`). A Slurm job whose end event
was lost is retired, a requeued one's next attempt watched, a suspended one held.

    reports = reconcile(rt, now)        # one report per change applied; a platform's failure is logged, not raised
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.observability import logger, metrics
from stallwatch.core import contract
from stallwatch.core.platforms import DESCRIPTIONS
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.provision import apply_change


def reconcile(rt: Runtime, now: float) -> list[dict[str, Any]]:
    """Each watched platform's changes, applied; one that fails to apply is logged and counted."""
    reports = []
    for platform in DESCRIPTIONS:
        if not rt.config.watches(platform):
            continue
        try:
            changes = rt.source(platform).reconcile(now)
        except Exception as exc:
            logger.exception("could not read the platform's view", extra={"platform": platform.value})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            reports.append({"platform": platform.value, "status": "error", "reason": f"{type(exc).__name__}: {exc}"})
            continue
        for change in changes:
            try:
                reports.append(apply_change(rt, platform, change) | {"change": change.change.value})
            except Exception as exc:
                logger.exception("could not apply a change the platform's view showed", extra={"job": change.job})
                metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
                reports.append({"job": change.job, "status": "error", "reason": f"{type(exc).__name__}: {exc}"})
    return reports
