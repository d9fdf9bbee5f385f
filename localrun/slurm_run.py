"""The local run on a real Slurm: moto, a 3-node Slurm on this machine, a 2-node sbatch'd torch job with the agent
on each node, the real handlers, and a real scancel or requeue run by the cluster's runner
(deploy/slurm/stallwatch-runner).

    result = SlurmRun(SCENARIOS["hang"], console).run()                 # the job ends CANCELLED
    result = SlurmRun(SCENARIOS["crash"], console, requeue=True).run()   # requeued, the job runs again

Order of events: moto and the Slack receiver start; the stack's runtime resources are created; the Slurm daemons
start with deploy/slurm's script as PrologSlurmctld and EpilogSlurmctld, the nodes and the controller become instances
in moto; the job is sbatch'd with its stallwatch:* settings in its comment. Its start event reaches on_job_state (its
alarms put); each node's output goes to its stream, its GPU metrics to CWAgent; the local alarm evaluator, the
rechecks and the sweeper run until the job has ended and its end event was delivered; the cluster's runner answers
the stops and the sweeper's reports from the table. Everything started is stopped
in reverse order, on success, failure or Ctrl-C.
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

from localrun import aws_events
from localrun.alarm_loop import THRESHOLD_CROSSED, AlarmLoop
from localrun.aws_events import AlarmStateRecord
from localrun.lambda_runtime import LambdaRuntime
from localrun.local_aws import LocalAws, scoped_environ
from localrun.moto_scheduler import OneTimeSchedules
from localrun.periodic import Periodic
from localrun.resources import ON_ALARM, ON_JOB_STATE, SWEEPER, create_resources
from localrun.scenarios import (
    CHECKPOINT_BEFORE_FAULT,
    CONTROL_TICK_S,
    MAX_RUNTIME_S,
    REPORT_PERIOD_S,
    REQUEUE_TAGS,
    RUN_DEADLINE_S,
    SWEEPER_INTERVAL_S,
    Scenario,
)
from localrun.slack_receiver import SlackMessage, SlackReceiver
from localrun.slurm_cluster import JOB_NODES, SlurmCluster
from localrun.summary import RunResult, Savings
from localrun.timeline import Kind, Timeline
from localrun.view import RunView
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.goodput import run_spans
from stallwatch.aws.store import Store
from stallwatch.core.alarms import job_alarm_prefix
from stallwatch.core.goodput import Goodput, measure_goodput
from stallwatch.core.signals import Platform

POLL_S = 0.5
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"})
RESUMED = re.compile(r"resumed from checkpoint at step (\d+)")
STEP = re.compile(r"^step (\d+) ")


class SlurmRun:
    """One scenario on a real Slurm, end to end; `run` returns its result and leaves nothing running."""

    def __init__(
        self,
        scenario: Scenario,
        console: Console,
        deadline_s: float = RUN_DEADLINE_S,
        interrupted: threading.Event | None = None,
        requeue: bool = False,
    ) -> None:
        self.scenario = scenario
        self.console = console
        self.deadline_s = deadline_s
        self.interrupted = interrupted or threading.Event()
        self.requeue = requeue  # the job opts in to recovery by requeue (stallwatch:recover=requeue)
        self.timeline = Timeline()
        self._errors: list[str] = []
        self._decisions: list[dict[str, Any]] = []
        self._follow_ups: list[str] = []
        self._ended_events: list[str] = []  # the end events' job states, as delivered
        self._runtime: LambdaRuntime | None = None
        self._cluster: SlurmCluster | None = None
        self._store: Store | None = None
        self._view: RunView | None = None
        self._prefix = ""
        self._deadline_passed = False

    # ---- the run --------------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        started = time.time()
        with contextlib.ExitStack() as stack:
            aws = stack.enter_context(LocalAws())
            slack = stack.enter_context(SlackReceiver(on_message=self._on_slack))
            self.timeline.event(Kind.SETUP, f"moto server on {aws.endpoint_url}, Slack receiver on port {slack.port}")
            resources = create_resources(
                aws.client("dynamodb"),
                aws.client("secretsmanager"),
                aws.client("scheduler"),
                slack.webhook_url,
            )
            stack.enter_context(scoped_environ(dict(resources.function_env())))
            self._store = Store(aws.client("dynamodb"), resources.table_name, resources.config.incident_ttl_days)
            self._runtime = self._lambda_runtime(aws)
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sw-slurm-")))
            cluster = self._cluster = stack.enter_context(
                SlurmCluster(
                    aws,
                    root,
                    resources.config.log_group(Platform.SLURM),
                    resources.table_name,
                    self.timeline,
                    self._on_error,
                )
            )
            assert cluster.daemons is not None
            nodes = ", ".join(f"{n} {cluster.daemons.address(n)} = {i}" for n, i in cluster.instances.items())
            self.timeline.event(Kind.SETUP, f"Slurm: slurmctld and {len(cluster.instances)} slurmds ({nodes})")
            job_id = cluster.submit(self.scenario, self._settings(), str(root / "checkpoints"), aws.env)
            self._prefix = job_alarm_prefix(resources.config.alarm_prefix, Platform.SLURM, cluster.job_name)
            title = f"Stallwatch local run · {self.scenario.name} on Slurm: {self.scenario.summary}"
            self._view = stack.enter_context(RunView(self.console, self.timeline, title, self._prefix))
            self.timeline.event(Kind.JOB, f"sbatch --nodes={JOB_NODES}: job {job_id} ({cluster.job_name})")
            loop = AlarmLoop(aws.client("cloudwatch"), self._prefix, self._on_alarm_transition)
            rechecks = OneTimeSchedules(aws.client("scheduler"), resources.recheck_group, self._on_recheck)
            ticker = Periodic("alarm-evaluator", CONTROL_TICK_S, lambda: self._tick(loop, rechecks), self._on_error)
            sweeper = Periodic("sweeper", SWEEPER_INTERVAL_S, self._sweep, self._on_error)
            stack.callback(ticker.stop)
            stack.callback(sweeper.stop)
            ticker.start()
            sweeper.start()
            final = self._supervise(started)
            ticker.stop()
            sweeper.stop()
            self._sweep()  # the sweeper's next run: the controller's answer to the stop, if not read yet
            goodput = self._goodput(cluster.job_name) if self.requeue else None
            result = self._result(started, final, len(slack.messages), (aws.port, slack.port), goodput)
        return result

    def _settings(self) -> dict[str, str]:
        """The job's stallwatch:* settings, in its --comment: the scenario's compressed policy, and the requeue."""
        return {**self.scenario.tags, **(REQUEUE_TAGS if self.requeue else {})}

    def _lambda_runtime(self, aws: LocalAws) -> LambdaRuntime:
        from handlers import on_alarm, on_job_state, sweeper
        from stallwatch.runtime import environment

        environment.runtime.cache_clear()  # a cold start: this run's endpoint, table and secret
        handlers = {ON_ALARM: on_alarm.handler, ON_JOB_STATE: on_job_state.handler, SWEEPER: sweeper.handler}
        return LambdaRuntime(aws.client("logs"), handlers)

    def _supervise(self, started: float) -> dict[str, str]:
        """Play Slurm's side until the job has ended and the epilog's event of that end was delivered (it follows the
        end: however late it comes on a busy machine, the deadline bounds the wait): its events to on_job_state, its
        nodes' output and GPU metrics; the job's fields at the end."""
        cluster = self._cluster
        assert cluster is not None
        fields: dict[str, str] = {}
        while True:
            if self.interrupted.is_set():
                raise KeyboardInterrupt
            if time.time() - started > self.deadline_s:
                self._deadline_passed = True
                self._errors.append(f"deadline: the run took longer than {self.deadline_s:.0f} s")
                self.timeline.event(Kind.ERROR, self._errors[-1])
                return fields
            now = time.time()
            fields = cluster.job() or fields
            cluster.follow(now, fields)
            state = fields.get("JobState", "")
            if self.timeline.set_job_status(state, f"restarts {fields.get('Restarts', '0')}"):
                where = f" on {fields['NodeList']}" if fields.get("NodeList") and state == "RUNNING" else ""
                self.timeline.event(Kind.JOB, f"job {fields.get('JobId')} {state}{where}")
            self._deliver(cluster.events())
            if state in ENDED and self._ended_events and self._ended_events[-1] == state:
                return fields
            time.sleep(POLL_S)

    # ---- the functions --------------------------------------------------------------------------------------

    def _invoke(self, function: str, event: dict[str, Any]) -> dict[str, Any]:
        assert self._runtime is not None
        invocation = self._runtime.invoke(function, event)
        if invocation.error is not None:
            self._errors.append(f"{function}: {type(invocation.error).__name__}: {invocation.error}")
            self.timeline.event(Kind.ERROR, self._errors[-1])
        return invocation.result or {}

    def _deliver(self, events: list[dict[str, Any]]) -> None:
        """deploy/slurm's events, each to on_job_state as EventBridge delivers it."""
        for event in events:
            detail = event["detail"]
            about = f"{detail['state']} {detail['job_state']}, restarts {detail['restarts']}"
            if detail["state"] == "ended":
                self._ended_events.append(detail["job_state"])
            result = self._invoke(ON_JOB_STATE, event)
            counts = [f"{result[key]} {key.replace('_', ' ')}" for key in ("alarms", "alarms_deleted") if key in result]
            self.timeline.event(Kind.JOB, f"on_job_state({about}): {', '.join([result.get('status', '?'), *counts])}")
            if result.get("status") == "retired":
                self.timeline.clear_alarms()

    def _tick(self, loop: AlarmLoop, rechecks: OneTimeSchedules) -> None:
        loop.tick(time.time())
        rechecks.fire_due(time.time())

    def _on_recheck(self, target_arn: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        outcome = self._invoke(ON_ALARM, payload)
        self._decided("recheck", outcome)
        return outcome

    def _on_alarm_transition(self, alarm: dict[str, Any], state: AlarmStateRecord, previous: AlarmStateRecord) -> None:
        name = alarm["AlarmName"]
        self.timeline.set_alarm(name, state.value)
        if (previous.value, state.value) != ("INSUFFICIENT_DATA", "OK"):
            reason = state.reason.removeprefix(THRESHOLD_CROSSED)
            self.timeline.event(
                Kind.ALARM, f"{name.removeprefix(self._prefix)}: {previous.value} → {state.value} ({reason})"
            )
        if state.value != "ALARM" or not alarm.get("ActionsEnabled", True):
            return
        self._decided("on_alarm", self._invoke(ON_ALARM, aws_events.alarm_action(alarm, state, previous)))

    def _sweep(self) -> None:
        result = self._invoke(SWEEPER, aws_events.scheduled(time.time()))
        for outcome in result.get("redecided", []):
            self._decided("sweeper", outcome)
        for answer in result.get("stop_answers", []):
            if answer.get("status") != "waiting":
                self.timeline.event(Kind.DECISION, f"sweeper: the controller answered: {answer.get('detail')}")

    def _decided(self, function: str, outcome: dict[str, Any]) -> None:
        if outcome.get("status") != "decided":
            return
        self._decisions.append(outcome)
        stop = (outcome.get("details") or {}).get("stop") or {}
        if outcome.get("action") == "stop" and stop.get("ok"):
            self.timeline.mark_stop_requested(time.time())
        said = f" ({stop.get('detail')})" if stop else ""
        self.timeline.event(Kind.DECISION, f"{function}: {outcome.get('diagnosis')} → {outcome.get('action')}{said}")

    def _on_slack(self, message: SlackMessage) -> None:
        blocks = message.payload.get("blocks") or []
        self.timeline.event(Kind.SLACK, f"webhook post received ({len(blocks)} blocks)")
        if blocks and blocks[0].get("type") != "header":  # alerts open with a header; a follow-up is one section
            self._follow_ups.append(str(message.payload.get("text", "")))
        if self._view is not None:
            self._view.on_slack(message)

    def _on_error(self, where: str, exc: BaseException) -> None:
        self._errors.append(f"{where}: {type(exc).__name__}: {exc}")
        self.timeline.event(Kind.ERROR, self._errors[-1])

    # ---- the verdict ----------------------------------------------------------------------------------------

    def _goodput(self, job: str) -> Goodput | None:
        assert self._store is not None
        try:
            source = AwsClients()
            return measure_goodput(*run_spans(source, self._store, job, time.time(), REPORT_PERIOD_S, Platform.SLURM))
        except Exception as exc:  # the report is a bonus of the run: its failure is the run's error, not a crash
            self._on_error("goodput", exc)
            return None

    def _result(
        self,
        started: float,
        fields: dict[str, str],
        slack_messages: int,
        ports: tuple[int, int],
        goodput: Goodput | None,
    ) -> RunResult:
        cluster = self._cluster
        assert cluster is not None
        snapshot = self.timeline.snapshot()
        state = fields.get("JobState", "")
        drained = cluster.drained()
        stopped = any(
            d.get("action") == "stop" and d.get("details", {}).get("stop", {}).get("ok") for d in self._decisions
        )
        output = "\n".join(log.path.read_text(errors="replace") for log in cluster.node_logs.values())
        resumed = [int(m) for m in RESUMED.findall(output)]
        if self.requeue:
            expected, passed = self._requeued(fields, drained, resumed, output)
        else:
            expected = (
                "the job is cancelled by a Stallwatch decision (scancel on the controller, through SSM), and Slack"
            )
            expected += " hears it"
            passed = state == "CANCELLED" and stopped and slack_messages > 0 and "CANCELLED" in self._ended_events
        passed = passed and not self._deadline_passed
        latency = None
        if snapshot.stop_requested_at is not None and snapshot.fault_onset is not None:
            latency = snapshot.stop_requested_at - snapshot.fault_onset
        savings = None
        if latency is not None and snapshot.stop_requested_at is not None and snapshot.fault_onset is not None:
            savings = Savings.estimate(
                cluster.instance_type,
                JOB_NODES,
                MAX_RUNTIME_S,
                job_age_at_stop_s=snapshot.stop_requested_at - started,
                stall_s=latency,
            )
        verdict = f"job {fields.get('JobId')} {state}, restarts {fields.get('Restarts', '0')}"
        if drained:
            verdict += "; drained: " + ", ".join(f"{n} ({why})" for n, why in drained.items())
        return RunResult(
            scenario=self.scenario.name,
            job_name=cluster.job_name,
            expected=expected,
            passed=passed,
            verdict=("PASS: " if passed else "FAIL: ") + verdict,
            job_status=state,
            fault_onset=snapshot.fault_onset,
            stop_requested_at=snapshot.stop_requested_at,
            detection_latency_s=latency,
            training_exit_codes={},
            training_pids=dict(cluster.task_pids),
            slack_messages=slack_messages,
            decisions=self._decisions,
            moto_port=ports[0],
            slack_port=ports[1],
            duration_s=time.time() - started,
            savings=savings,
            errors=self._errors,
            follow_ups=self._follow_ups,
            goodput=goodput,
            taken_out=sorted(drained),
        )

    def _requeued(
        self, fields: dict[str, str], drained: dict[str, str], resumed: list[int], output: str
    ) -> tuple[str, bool]:
        """--recover requeue: the job requeued and run again from its checkpoint, past it, to completion; no node
        drained, for no health signal blames one (a rank's CUDA error is the application's; a hang every rank is in
        names none: `core.way_back.blamed_hosts`)."""
        expected = (
            "no node drained (a rank's error blames no node); the job requeued and run again from its checkpoint "
            f"(step {CHECKPOINT_BEFORE_FAULT}), past it, to COMPLETED"
        )
        steps = [int(m.group(1)) for line in output.splitlines() if (m := STEP.match(line))]
        passed = (
            fields.get("JobState") == "COMPLETED"
            and int(fields.get("Restarts", "0") or 0) >= 1
            and not drained
            and CHECKPOINT_BEFORE_FAULT in resumed
            and max(steps, default=0) > CHECKPOINT_BEFORE_FAULT
            and "REQUEUED" in self._ended_events
        )
        return expected, passed
