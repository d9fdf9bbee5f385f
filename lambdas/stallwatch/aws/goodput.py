"""A run's history from AWS, for `core.goodput`, through its platform's adapter (`aws.platforms`): a SageMaker
run's jobs (the first one and its resumes), an EC2 job's attempts (each start of its group), with their agent windows
(CloudWatch) and Stallwatch's stops (the audit trail).

    spans = run_spans(clients, store, "llama-8b-r1", now=time.time())   # (run name, [JobSpan, ...])
    goodput = measure_goodput(*spans)
    run_spans(clients, store, "llm-70b", now)   # no platform given: SageMaker, else EC2 (an instance id: EC2 first)
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.platforms import adapter
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import Store
from stallwatch.core.goodput import JobSpan
from stallwatch.core.platforms import DESCRIPTIONS, likely
from stallwatch.core.reading import METRIC_PERIOD_SECONDS
from stallwatch.core.signals import Platform


def run_spans(
    clients: Any,
    store: Store | None,
    job: str,
    now: float,
    period: int = METRIC_PERIOD_SECONDS,
    platform: Platform | None = None,
) -> tuple[str, list[JobSpan]]:
    """The run `job` belongs to, as `JobSpan`s: windows read at `period` seconds, stops from `store` (if given).
    `platform` None: each platform in turn, the likeliest first (`core.platforms.likely`: a SageMaker training job,
    else an EC2 job of that name; an instance id is looked up on EC2 first); `JobNotFoundError` names them all when
    none has it."""
    audit = AuditTrail(store) if store is not None else None
    if platform is not None:
        return adapter(platform, clients, store=store).run_spans(audit, job, now, period)
    missing = []
    for candidate in likely(job):
        try:
            return adapter(candidate, clients, store=store).run_spans(audit, job, now, period)
        except JobNotFoundError as exc:
            missing.append(f"{candidate.value}: {exc}")
    kinds = " nor ".join(d.resource for d in DESCRIPTIONS.values())
    raise JobNotFoundError(f"{job!r} is neither {kinds} ({'; '.join(missing)})")
