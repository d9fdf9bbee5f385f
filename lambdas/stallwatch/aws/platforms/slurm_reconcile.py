"""The table's running Slurm jobs reconciled with their controllers' view (`SlurmPlatform.reconcile`, on the sweeper's
schedule): each cluster's runner answers the last sweep's report, then the next report is asked for. A job Slurm no
longer runs is retired; a suspended or pending one is held (never judged) until it runs again; a requeued one's
attempt ends and its next starts; a node HyperPod reboots or replaces (its reason ``Action:...``) is kept with its job.

    changes = reconcile(jobs, runners, now)    # JobChange per job whose end or next attempt no event told
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms.slurm_jobs import GONE, SlurmJobs, Started
from stallwatch.aws.platforms.slurm_runner import Runners
from stallwatch.core import contract
from stallwatch.core.platforms import hyperpod, slurm_runner
from stallwatch.core.platforms.interface import Change, JobChange
from stallwatch.core.platforms.slurm import SlurmJob, SlurmNode

# What the controller's view says of a job the table holds as running.
HELD_STATES = frozenset({"PENDING", "SUSPENDED", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING"})
RUN_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING"})


def reconcile(jobs: SlurmJobs, runners: Runners, now: float) -> list[JobChange]:
    """Each cluster's running jobs against its runner's last report; one cluster's failure is logged and counted."""
    by_cluster: dict[str, dict[str, SlurmJob]] = defaultdict(dict)
    for name, job in jobs.running().items():
        by_cluster[job.cluster][name] = job
    changes: list[JobChange] = []
    for cluster, running in sorted(by_cluster.items()):
        try:
            asked, answer = runners.report(cluster)
            if asked is not None and answer is not None and answer.get("result") == slurm_runner.REPORTED:
                changes += _apply_view(jobs, running, set(asked.jobs), slurm_runner.View.of_answer(answer))
            runners.ask_report(slurm_runner.report(cluster, [(j.job_id, j.submit_time) for j in running.values()]), now)
        except (ClientError, BotoCoreError, ValueError):
            logger.exception("could not reconcile a Slurm cluster", extra={"cluster": cluster})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
    return changes


def _apply_view(
    jobs: SlurmJobs, running: dict[str, SlurmJob], asked: set[tuple[str, str]], view: slurm_runner.View
) -> list[JobChange]:
    changes = []
    for name, job in sorted(running.items()):
        if (job.job_id, job.submit_time) not in asked:
            continue  # started since the report was asked for: the next one tells
        seen = view.jobs.get(job.job_id, slurm_runner.JobView(job.job_id))
        for node in job.nodes:
            found = view.nodes.get(node.name)
            action = hyperpod.node_reason(node.name, found.reason, view.at) if found is not None else None
            if action is not None:
                jobs.record_hyperpod(name, job.submit_epoch, replace(action, instance=node.instance or ""))
        changes += _apply_job(jobs, name, job, seen, view.at)
    return changes


def _apply_job(jobs: SlurmJobs, name: str, job: SlurmJob, seen: slurm_runner.JobView, at: float) -> list[JobChange]:
    if not seen.known or (seen.submit_time != job.submit_time and seen.restarts <= job.restarts):
        ended = jobs.retire(job, GONE, at, "the controller no longer knows it (its end event was lost)")
        return [JobChange(Change.ENDED, name, GONE, tags=job.settings)] if ended is not None else []
    if seen.submit_time != job.submit_time:  # requeued: this attempt ended, the next runs or waits
        changes = []
        if jobs.retire(job, "REQUEUED", at, seen.reason) is not None:
            changes.append(JobChange(Change.ENDED, name, "REQUEUED", tags=job.settings, run_goes_on=True))
        if seen.state in RUN_STATES and seen.nodes:
            changes += _next_attempt(jobs, job, seen, at)
        return changes
    if seen.state in HELD_STATES:
        jobs.hold(name, job.submit_epoch, seen.state, at)
        return []
    if seen.state in RUN_STATES:
        jobs.release(name, job.submit_epoch, at)
        return []
    ended = jobs.retire(job, seen.state, at, seen.reason)
    return [JobChange(Change.ENDED, name, seen.state, tags=job.settings)] if ended is not None else []


def _next_attempt(jobs: SlurmJobs, before: SlurmJob, seen: slurm_runner.JobView, at: float) -> list[JobChange]:
    """The requeued job's next attempt, as the controller showed it (its start event was lost or refused): its nodes
    keep the instances they had where they were the job's before."""
    known = {n.name: n for n in before.nodes}
    attempt = replace(
        before,
        submit_time=seen.submit_time,
        submit_epoch=seen.submit_epoch,
        start_epoch=seen.start_epoch or at,
        state="RUNNING",
        restarts=seen.restarts,
        nodes=tuple(known.get(node, SlurmNode(node)) for node in seen.nodes),
        hyperpod=(),
    )
    if jobs.start(attempt, at) is not Started.STARTED:
        return []
    return [JobChange(Change.STARTED, attempt.job_name, "RUNNING", tags=attempt.settings)]
