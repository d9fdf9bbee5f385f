"""The local end-to-end run: moto, a real training job, the real handlers, a real stop.

    result = LocalRun(SCENARIOS["hang"], console).run()
    result = LocalRun(SCENARIOS["hang"].as_cluster(), console, platform=Platform.EC2).run()   # 2 EC2 instances
    result = LocalRun(SCENARIOS["xid"], console, platform=Platform.EC2, recover=True).run()   # recovered in place
    result.passed  # the expected outcome happened

Order of events: moto and the Slack receiver start; the stack's runtime resources are created; the
training job (a SageMaker training job, or tagged EC2 instances) is created in moto and goes InProgress
(on_job_state puts its alarms); one training process per host starts; the local alarm evaluator (which also fires
the rechecks that came due, as EventBridge Scheduler would), the sweeper schedule and the platform simulation run
until the job ends. Everything started is stopped in reverse order, on
success, failure or Ctrl-C.

Kept whole (over 500 lines): one run's life, set-up to tear-down, whose steps share the run's state.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from localrun import aws_events, moto_ssm, sagemaker_job
from localrun.alarm_loop import THRESHOLD_CROSSED, AlarmLoop
from localrun.aws_events import AlarmStateRecord
from localrun.ec2_cluster import Ec2Cluster
from localrun.host_run import HostRun
from localrun.lambda_runtime import Invocation, LambdaRuntime
from localrun.local_aws import LocalAws, scoped_environ
from localrun.moto_sagemaker import RUNNING, STOPPED, STOPPING
from localrun.moto_scheduler import OneTimeSchedules
from localrun.periodic import Periodic
from localrun.resources import ON_ALARM, ON_JOB_STATE, SWEEPER, create_resources
from localrun.sagemaker_job import COMPLETED, SageMakerJob
from localrun.scenarios import (
    CHECKPOINT_BEFORE_FAULT,
    CONTROL_TICK_S,
    MAX_RUNTIME_S,
    REPORT_PERIOD_S,
    RUN_DEADLINE_S,
    SIGTERM_GRACE_S,
    SWEEPER_INTERVAL_S,
    Scenario,
)
from localrun.slack_receiver import SlackMessage, SlackReceiver
from localrun.summary import RunResult, Savings
from localrun.timeline import Kind, Timeline
from localrun.view import RunView
from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.goodput import run_spans
from stallwatch.aws.store import Store, job_key
from stallwatch.core import alarms
from stallwatch.core.alarms import job_alarm_prefix
from stallwatch.core.goodput import Goodput, measure_goodput
from stallwatch.core.platforms.ec2_recovery import TRAINING_UNIT
from stallwatch.core.resume import RESUMED_FROM_TAG, resume_name
from stallwatch.core.signals import Platform

POLL_S = 0.25
LocalJob = SageMakerJob | Ec2Cluster
QUIET_RECOVERY_STEPS = frozenset({"held", "sent", "watching"})  # a sweep that only looked: not in the timeline
FIRST_STEP = re.compile(r"training again after the restart in place: step (\d+)")


class LocalRun:
    """One scenario, end to end; `run` returns its result and leaves nothing running."""

    def __init__(
        self,
        scenario: Scenario,
        console: Console,
        deadline_s: float = RUN_DEADLINE_S,
        interrupted: threading.Event | None = None,
        resume: bool = False,
        platform: Platform = Platform.SAGEMAKER,
        recover: bool = False,
    ) -> None:
        self.scenario = scenario
        self.resume = resume  # the job opts in to a restart from its checkpoint (SageMaker)
        self.recover = recover  # the EC2 job opts in to recovery in place (stallwatch:recover=restart)
        self.platform = platform
        self.console = console
        self.deadline_s = deadline_s
        # Set by the signal handler: a KeyboardInterrupt that library code swallowed still ends the run here.
        self.interrupted = interrupted or threading.Event()
        self.timeline = Timeline()
        self._errors: list[str] = []
        self._decisions: list[dict[str, Any]] = []
        self._hosts: list[HostRun] = []  # the current job's
        self._exited_hosts: dict[str, HostRun] = {}  # an earlier attempt's, by "<job>/<host>"
        self._checkpoint_dir: str | None = None
        self._resumed_as: str | None = None
        self._follow_ups: list[str] = []  # Slack follow-ups seen (resumed, progress, gave up)
        self._job: LocalJob | None = None  # the job being played: the first, then its resume
        self._first_job: LocalJob | None = None
        self._runtime: LambdaRuntime | None = None
        self._alarm_prefix = ""  # the run's alarms (the job's, and its resumes')
        self._config_prefix = ""  # the deployment's, which every Stallwatch alarm name starts with
        self._view: RunView | None = None
        self._store: Store | None = None
        self._ended: str | None = None
        self._deadline_passed = False
        self._nodes_dir: Path | None = None  # --recover: the simulated GPU nodes the SSM documents run on
        self._taken_out: set[str] = set()  # nodes a StopInstances reached while the job ran on
        self._restarted: list[str] = []  # nodes whose training `systemctl restart` restarted
        self._recovery_steps: list[dict[str, Any]] = []

    # ---- the run --------------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        started = time.time()
        with contextlib.ExitStack() as stack:
            aws = stack.enter_context(LocalAws())
            stack.callback(moto_ssm.reset)  # the nodes this run registered
            slack = stack.enter_context(SlackReceiver(on_message=self._on_slack))
            self.timeline.event(Kind.SETUP, f"moto server on {aws.endpoint_url}, Slack receiver on port {slack.port}")
            documents = aws.client("ssm") if self.recover else None
            resources = create_resources(
                aws.client("dynamodb"),
                aws.client("secretsmanager"),
                aws.client("scheduler"),
                slack.webhook_url,
                documents,
            )
            if self.recover:
                self._checkpoint_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="stallwatch-ckpt-"))
                self._nodes_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stallwatch-nodes-")))
            stack.enter_context(scoped_environ(dict(resources.function_env())))
            self._store = Store(aws.client("dynamodb"), resources.table_name, resources.config.incident_ttl_days)
            self._runtime = self._lambda_runtime(aws)
            self.timeline.event(
                Kind.SETUP, f"table {resources.table_name}, Slack secret, functions on-job-state/on-alarm/sweeper"
            )
            sagemaker = aws.client("sagemaker")
            job = self._job = self._first_job = self._create_job(aws, resources.config.ec2_log_group)
            self._config_prefix = resources.config.alarm_prefix
            self._alarm_prefix = job_alarm_prefix(self._config_prefix, job.platform, job.name)
            if self.resume:  # the run's alarms: the job's and its resumes' (<job>-r1.)
                self._alarm_prefix = self._alarm_prefix.removesuffix(".")
                self._checkpoint_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="stallwatch-ckpt-"))
            title = f"Stallwatch local run · {self.scenario.name} on {job.platform}: {self.scenario.summary}"
            self._view = stack.enter_context(RunView(self.console, self.timeline, title, self._alarm_prefix))
            self.timeline.event(Kind.JOB, job.describe())
            self._start_hosts(aws, job, stack)
            self._deliver(job.start(time.time()))
            loop = AlarmLoop(aws.client("cloudwatch"), self._alarm_prefix, self._on_alarm_transition)
            rechecks = OneTimeSchedules(aws.client("scheduler"), resources.recheck_group, self._on_recheck)
            ticker = Periodic("alarm-evaluator", CONTROL_TICK_S, lambda: self._tick(loop, rechecks), self._on_error)
            sweeper = Periodic("sweeper", SWEEPER_INTERVAL_S, self._sweep, self._on_error)
            stack.callback(ticker.stop)
            stack.callback(sweeper.stop)
            ticker.start()
            sweeper.start()
            self._supervise(started)
            if self._resumed_as is not None and self._ended is not None:
                self._play_resumed(aws, stack, started)
            ticker.stop()
            sweeper.stop()
            final_status = job.final_status()
            resumed_status = goodput = None
            if self.resume:
                self._sweep()  # the sweeper's next run: the resumed job's progress, if not posted yet
                resumed = self._resumed_as and sagemaker.describe_training_job(TrainingJobName=self._resumed_as)
                resumed_status = resumed["TrainingJobStatus"] if resumed else None
                goodput = measure_goodput(*run_spans(AwsClients(), self._store, job.name, time.time(), REPORT_PERIOD_S))
            if self.recover:
                self._sweep()  # the sweeper's next run: the restarted training's first step, if not posted yet
                spans = run_spans(AwsClients(), self._store, job.name, time.time(), REPORT_PERIOD_S, job.platform)
                goodput = measure_goodput(*spans)
            ports = (aws.port, slack.port)
        return self._result(started, final_status, len(slack.messages), ports, resumed_status, goodput)

    def _lambda_runtime(self, aws: LocalAws) -> LambdaRuntime:
        # Imported here: the functions read their environment (set just before) when first invoked.
        from handlers import on_alarm, on_job_state, sweeper
        from stallwatch.runtime import environment

        environment.runtime.cache_clear()  # a cold start: this run's endpoint, table and secret
        handlers = {ON_ALARM: on_alarm.handler, ON_JOB_STATE: on_job_state.handler, SWEEPER: sweeper.handler}
        return LambdaRuntime(aws.client("logs"), handlers)

    def _create_job(self, aws: LocalAws, ec2_log_group: str) -> LocalJob:
        if self.platform is Platform.EC2:
            return Ec2Cluster(aws.client("ec2"), self.scenario, time.time(), ec2_log_group, self._nodes_dir)
        return SageMakerJob.create(aws.client("sagemaker"), self.scenario, time.time(), self.resume)

    def _play_resumed(self, aws: LocalAws, stack: contextlib.ExitStack, started: float) -> None:
        """What SageMaker does with the job Stallwatch created: its hosts start (from the checkpoint), it trains
        until it completes (or is stopped), and each status change reaches on_job_state."""
        assert self._resumed_as is not None
        sagemaker = aws.client("sagemaker")
        job = self._job = SageMakerJob(
            sagemaker, sagemaker_job.job_record(sagemaker, self._resumed_as), self.scenario.hosts
        )
        self.timeline.event(Kind.JOB, f"{job.name} created by Stallwatch: its hosts start from the checkpoint")
        self._exited_hosts |= {f"{job.tags.get(RESUMED_FROM_TAG)}/{h.host}": h for h in self._hosts}
        self._hosts, self._ended = [], None
        self.timeline.clear_alarms()  # the stopped job's were deleted by on_job_state
        self._start_hosts(aws, job, stack, resumed=True)
        self._deliver(job.start(time.time()))
        self._supervise(started)

    def _start_hosts(self, aws: LocalAws, job: LocalJob, stack: contextlib.ExitStack, resumed: bool = False) -> None:
        clients = {"logs": aws.client("logs"), "cloudwatch": aws.client("cloudwatch")}
        for rank, host in enumerate(job.hosts):
            run = HostRun(
                job=job.name,
                host=host,
                rank=rank,
                world_size=len(job.hosts),
                fault=self.scenario.host_faults[rank],
                train_args=self._train_args(rank, host, resumed),
                aws_env=aws.env,
                clients=clients,
                log_place=job.log_place(host),
                platform_env=job.training_env(host),
                platform=job.platform,
                timeline=self.timeline,
                on_error=self._on_error,
            )
            stack.callback(run.stop)
            self._hosts.append(run.start())

    def _train_args(self, rank: int, host: str, resumed: bool) -> list[str]:
        """The host's training arguments; recovering in place, each node keeps its own checkpoint (its disk)."""
        own = self._checkpoint_dir and self.recover
        checkpoint_dir = str(Path(self._checkpoint_dir) / host) if own else self._checkpoint_dir
        return self.scenario.train_args(rank, checkpoint_dir, resumed)

    def _supervise(self, started: float) -> None:
        """Play the platform until the job has ended (or the deadline passed)."""
        assert self._job is not None
        while self._ended is None:
            if self.interrupted.is_set():
                raise KeyboardInterrupt
            if time.time() - started > self.deadline_s:
                self._deadline_passed = True
                self._errors.append(f"deadline: the run took longer than {self.deadline_s:.0f} s")
                self.timeline.event(Kind.ERROR, self._errors[-1])
                return
            if isinstance(self._job, Ec2Cluster):
                self._follow_nodes(self._job)
            codes = [host.check_exit() for host in self._hosts if host.host not in self._taken_out]
            status, secondary = self._job.status()
            if self.timeline.set_job_status(status, secondary):
                self.timeline.event(Kind.JOB, f"job status {status} / {secondary}")
            if status in (STOPPING, STOPPED):
                self._stop_containers(status)
            elif all(code is not None for code in codes):
                events = self._job.finish(any(code != 0 for code in codes), time.time())
                end = self._job.final_status()
                self.timeline.set_job_status(end, end)
                self.timeline.event(Kind.JOB, f"every training process exited: job {end}")
                self._deliver(events)
                self._ended = end
            time.sleep(POLL_S)

    def _follow_nodes(self, cluster: Ec2Cluster) -> None:
        """What systemd and EC2 do on the nodes while the job runs: `systemctl restart` (an SSM command) restarts a
        node's training from its checkpoint; a node a StopInstances reached shuts its training down."""
        for host in cluster.restart_requests():
            run = next(h for h in self._hosts if h.host == host)
            self.timeline.event(Kind.JOB, f"{host}: systemctl restart {TRAINING_UNIT} (an SSM command)")
            run.restart(self._train_args(run.rank, host, resumed=True), SIGTERM_GRACE_S)
            self._restarted.append(host)
        if cluster.status()[0] != RUNNING:
            return  # the whole job is stopping
        for host in cluster.stopped_nodes():
            if host in self._taken_out:
                continue
            self._taken_out.add(host)
            self.timeline.event(Kind.JOB, f"{host}: StopInstances seen: SIGTERM to its training (the job runs on)")
            run = next(h for h in self._hosts if h.host == host)
            run.process.sigterm()
            run.process.wait(SIGTERM_GRACE_S)
            run.process.kill_group(grace_s=0)
            run.check_exit()
            self._deliver(cluster.node_stopped(host, time.time()))

    def _stop_containers(self, status: str) -> None:
        """What the platform does on a stop (StopTrainingJob, StopInstances): SIGTERM, wait, SIGKILL what is left,
        then Stopped."""
        assert self._job is not None
        self.timeline.mark_stop_requested(time.time())
        seen = "StopTrainingJob" if self._job.platform is Platform.SAGEMAKER else "StopInstances"
        self.timeline.event(Kind.JOB, f"{seen} seen ({status}): SIGTERM to the training processes")
        for host in self._hosts:
            host.process.sigterm()
        deadline = time.time() + SIGTERM_GRACE_S
        for host in self._hosts:
            host.process.wait(max(0.0, deadline - time.time()))
            if host.check_exit() is None:
                self.timeline.event(Kind.JOB, f"{host.host}: still running after {SIGTERM_GRACE_S:.0f} s: SIGKILL")
                host.process.kill_group(grace_s=0)
                host.check_exit()
        events = self._job.stopped(time.time())
        self.timeline.set_job_status(STOPPED, STOPPED)
        self.timeline.event(Kind.JOB, "training job Stopped")
        self._deliver(events)
        self._ended = STOPPED

    # ---- the functions --------------------------------------------------------------------------------------

    def _invoke(self, function: str, event: dict[str, Any]) -> Invocation:
        assert self._runtime is not None
        invocation = self._runtime.invoke(function, event)
        if invocation.error is not None:
            self._errors.append(f"{function}: {type(invocation.error).__name__}: {invocation.error}")
            self.timeline.event(Kind.ERROR, self._errors[-1])
        return invocation

    def _deliver(self, events: list[dict[str, Any]]) -> None:
        """The platform's state-change events, each to on_job_state as EventBridge delivers it."""
        for event in events:
            detail = event["detail"]
            about = detail.get("TrainingJobStatus") or f"{detail.get('instance-id')} {detail.get('state')}"
            result = self._invoke(ON_JOB_STATE, event).result or {}
            counts = [f"{result[key]} {key.replace('_', ' ')}" for key in ("alarms", "alarms_deleted") if key in result]
            self.timeline.event(Kind.JOB, f"on_job_state({about}): {', '.join([result.get('status', '?'), *counts])}")
            resume = result.get("resume") or {}
            if resume:
                said = resume.get("resumed_as") or resume.get("reason", "")
                self.timeline.event(Kind.JOB, f"on_job_state({about}): resume → {resume.get('status')} {said}".rstrip())
            if resume.get("status") == "resumed" and self._job is not None and self._job.platform is Platform.SAGEMAKER:
                self._resumed_as = resume["resumed_as"]

    def _tick(self, loop: AlarmLoop, rechecks: OneTimeSchedules) -> None:
        loop.tick(time.time())
        rechecks.fire_due(time.time())

    def _on_recheck(self, target_arn: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A recheck came due: on_alarm is invoked with its input, as EventBridge Scheduler does."""
        outcome = self._invoke(ON_ALARM, payload).result
        if outcome and outcome.get("status") != "decided":
            reason = (outcome.get("details") or {}).get("reason", "")
            self.timeline.event(Kind.DECISION, f"recheck: {outcome.get('status')} ({reason})")
        elif outcome:
            self._decided("recheck", outcome)
        return outcome

    def _on_alarm_transition(self, alarm: dict[str, Any], state: AlarmStateRecord, previous: AlarmStateRecord) -> None:
        name = alarm["AlarmName"]
        self.timeline.set_alarm(name, state.value)
        if (previous.value, state.value) != ("INSUFFICIENT_DATA", "OK"):  # a quiet start is only shown in the panel
            reason = state.reason.removeprefix(THRESHOLD_CROSSED)
            short = name.removeprefix(self._alarm_prefix)
            self.timeline.event(Kind.ALARM, f"{short}: {previous.value} → {state.value} ({reason})")
        acting = alarms.acts_on(alarms.parse_alarm_name(name, self._config_prefix).kind, state.value)
        if not acting or not alarm.get("ActionsEnabled", True):
            return
        outcome = self._invoke(ON_ALARM, aws_events.alarm_action(alarm, state, previous)).result
        if outcome:
            self._decided("on_alarm", outcome)

    def _sweep(self) -> None:
        result = self._invoke(SWEEPER, aws_events.scheduled(time.time())).result or {}
        for outcome in result.get("redecided", []):
            self._decided("sweeper", outcome)
        for step in result.get("recoveries", []):
            if step.get("status") in QUIET_RECOVERY_STEPS:
                continue
            self._recovery_steps.append(step)
            said = ", ".join(f"{k} {_short(v)}" for k, v in step.items() if k not in ("job", "status", "restarted_at"))
            self.timeline.event(
                Kind.DECISION, f"sweeper: recovery in place → {step['status']}" + (f" ({said})" if said else "")
            )

    def _decided(self, function: str, outcome: dict[str, Any]) -> None:
        if outcome.get("status") != "decided":
            return
        reasons = self._audited_reasons()
        outcome = {**outcome, "reasons": reasons}
        self._decisions.append(outcome)
        done = [
            text
            for text, flag in (("stopped the job", outcome.get("stopped")), ("posted to Slack", outcome.get("posted")))
            if flag
        ]
        recovery = (outcome.get("details") or {}).get("recovery") or {}
        instead = f" → recovery in place: {recovery.get('reason') or recovery.get('status')}" if recovery else ""
        self.timeline.event(
            Kind.DECISION,
            f"{function}: {outcome.get('diagnosis')} → {outcome.get('action')}{instead}"
            + (f" ({', '.join(done)})" if done else "")
            + "".join(f"\n    · {reason}" for reason in reasons),
        )

    def _audited_reasons(self) -> list[str]:
        """The reasons of the job's newest decision, from the control plane's audit trail in DynamoDB."""
        assert self._store is not None
        assert self._job is not None
        records = AuditTrail(self._store).records(job_key(self._job.platform, self._job.name), "audit")
        return list(records[-1].get("record", {}).get("reasons", [])) if records else []

    def _on_slack(self, message: SlackMessage) -> None:
        self.timeline.event(Kind.SLACK, f"webhook post received ({len(message.payload.get('blocks') or [])} blocks)")
        blocks = message.payload.get("blocks") or []
        if blocks and blocks[0].get("type") != "header":  # alerts open with a header; a follow-up is one section
            self._follow_ups.append(str(message.payload.get("text", "")))
        if self._view is not None:
            self._view.on_slack(message)

    def _on_error(self, where: str, exc: BaseException) -> None:
        self._errors.append(f"{where}: {type(exc).__name__}: {exc}")
        self.timeline.event(Kind.ERROR, self._errors[-1])

    # ---- the verdict ----------------------------------------------------------------------------------------

    def _result(
        self,
        started: float,
        final_status: str,
        slack_messages: int,
        ports: tuple[int, int],
        resumed_status: str | None = None,
        goodput: Goodput | None = None,
    ) -> RunResult:
        job = self._first_job
        assert job is not None
        snapshot = self.timeline.snapshot()
        stopped = snapshot.stop_requested_at is not None
        latency = (
            snapshot.stop_requested_at - snapshot.fault_onset if stopped and snapshot.fault_onset is not None else None
        )
        if self.scenario.expect_stop:
            expected = "the job is stopped by a Stallwatch decision, with a Slack message"
            decided_stop = any(d.get("action") == "stop" and d.get("stopped") for d in self._decisions)
            passed = final_status == STOPPED and decided_stop and slack_messages > 0
        else:
            expected = "the job is not stopped and completes"
            passed = final_status == COMPLETED and not stopped
        if self.recover and self.scenario.resumable:
            expected, passed = self._recovered(job, final_status, stopped)
        if self.resume:
            expected += f"; resumed as {resume_name(job.name, 1)} from its checkpoint, which passes the step reached"
            expected += " and completes; the goodput report counts the stall and the restart"
            progressed = any("after the restart" in text for text in self._follow_ups)
            measured = goodput is not None and goodput.stalls_caught == 1 and goodput.restarts == 1
            passed = passed and resumed_status == COMPLETED and progressed and measured
        passed = passed and not self._deadline_passed
        savings = None
        if stopped and snapshot.fault_onset is not None and snapshot.stop_requested_at is not None:
            savings = Savings.estimate(
                job.instance_type,
                job.instance_count,
                MAX_RUNTIME_S,
                job_age_at_stop_s=snapshot.stop_requested_at - job.created_at,
                stall_s=snapshot.stop_requested_at - snapshot.fault_onset,
            )
        hosts = {h.host: h for h in self._hosts} if self._resumed_as is None else self._exited_hosts
        if self._resumed_as is not None:
            hosts |= {f"{self._resumed_as}/{h.host}": h for h in self._hosts}
        verdict = f"job {final_status}" + (f", {self._resumed_as} {resumed_status}" if self._resumed_as else "")
        if self._restarted:
            restarted = len(set(self._restarted))
            verdict += f", restarted in place on {restarted} node{'s' if restarted != 1 else ''}"
            verdict += f" ({len(self._taken_out)} taken out)" if self._taken_out else ""
        return RunResult(
            scenario=self.scenario.name,
            job_name=job.name,
            expected=expected,
            passed=passed,
            verdict=("PASS: " if passed else "FAIL: ") + verdict,
            job_status=final_status,
            fault_onset=snapshot.fault_onset,
            stop_requested_at=snapshot.stop_requested_at,
            detection_latency_s=latency,
            training_exit_codes={name: h.exit_code for name, h in hosts.items()},
            training_pids={name: h.process.pid for name, h in hosts.items()},
            slack_messages=slack_messages,
            decisions=self._decisions,
            moto_port=ports[0],
            slack_port=ports[1],
            duration_s=time.time() - started,
            savings=savings,
            errors=self._errors,
            resumed_as=self._resumed_as,
            resumed_status=resumed_status,
            follow_ups=self._follow_ups,
            goodput=goodput,
            restarted_in_place=sorted(set(self._restarted)),
            taken_out=sorted(self._taken_out),
            recovery_steps=self._recovery_steps,
        )

    def _recovered(self, job: LocalJob, final_status: str, stopped: bool) -> tuple[str, bool]:
        """--recover restart: the nodes with a hardware fault taken out (stopped alone), the training restarted in
        place on the others from its checkpoint and past it, the job never stopped, then completed."""
        bad = {host for index, host in enumerate(job.hosts) if self.scenario.node_fault(index) != "none"}
        healthy = set(job.hosts) - bad
        if bad:
            expected = f"{', '.join(sorted(bad))} fails its health check and is taken out (stopped alone); "
        else:
            expected = "every node passes its health check; "
        expected += (
            f"the training restarts in place on {len(healthy)} nodes from its checkpoint (step "
            f"{CHECKPOINT_BEFORE_FAULT}) past it, no StopInstances of the job, and it completes"
        )
        first = [int(m.group(1)) for text in self._follow_ups if (m := FIRST_STEP.search(text))]
        named = all(any(host in text for text in self._follow_ups) for host in bad)
        passed = (
            final_status == COMPLETED
            and not stopped
            and self._taken_out == bad
            and set(self._restarted) == healthy
            and bool(first)
            and first[0] > CHECKPOINT_BEFORE_FAULT
            and named
        )
        return expected, passed


def _short(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)
