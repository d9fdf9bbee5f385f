"""Write the labeled replay corpus: seeded, so every run writes the same bytes.

    python corpus/generate.py                      # corpus/traces/*.jsonl
    python corpus/generate.py --out /tmp/traces    # elsewhere (the corpus test compares the two)
    python corpus/generate.py --benchmark /tmp/long.jsonl   # the 6-hour, 8-host replay benchmark trace

Each trace is simulated minute by minute from a script of segments (download, train, hang, checkpoint, ...)
with realistic values: p4d (A100, ~380 W busy, ~100 W hung) and p5 (H100, ~640 W busy, ~150 W hung) hosts,
SageMaker host metrics summed over devices, the CloudWatch agent's per-instance GPU metrics on EC2, the
trainer_agent's metrics from rank 0 and per host, and per-host log lines.

Kept whole (over 500 lines): the scenario catalogue the corpus's traces are generated from, one script per
trace; the simulator it drives is above it.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lambdas"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the agent writes the stack dumps' lines

from stallwatch.core import contract
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms import slurm_names as slurm
from stallwatch.core.pricing import instance_spec
from stallwatch.core.signals import Platform
from stallwatch.core.trace import (
    EndEvent,
    Event,
    Expectation,
    LogEvent,
    LogRecord,
    MetricDatum,
    MetricEvent,
    StatusEvent,
    TraceHeader,
    TraceJob,
)
from stallwatch.offline.trace_file import write_trace
from stallwatch.offline.trace_source import TRACE_EPOCH
from trainer_agent.stack_dumps import STALL, StackDump, line_bytes

TRACES_DIR = Path(__file__).resolve().parent / "traces"
MINUTE = 60.0
AGENT_OFFSET_S = 7.0  # the agent's windows close 7 s into each minute
STREAM_EPOCH = int(TRACE_EPOCH)
A100_MEMORY_MIB = 40_960


@dataclass(frozen=True)
class Gpu:
    """Power draw of one device by activity (W)."""

    busy_w: float
    hung_w: float
    idle_w: float


A100 = Gpu(busy_w=380.0, hung_w=100.0, idle_w=58.0)
H100 = Gpu(busy_w=640.0, hung_w=150.0, idle_w=75.0)

# Host activity -> (GPU %, GPU memory %, CPU %) per device, before noise; power picked from the Gpu.
DOWNLOAD, BUSY, HUNG, CHECKPOINT, STARVED, DEAD, IDLE, GONE = (
    "download",
    "busy",
    "hung",
    "checkpoint",
    "starved",
    "dead",
    "idle",
    "gone",  # the job's processes are gone from its nodes (a Slurm job preempted, pending to run again)
)
ACTIVITY = {
    DOWNLOAD: (0.0, 0.0, 4.0),
    BUSY: (97.0, 78.0, 14.0),
    HUNG: (100.0, 78.0, 3.0),
    CHECKPOINT: (2.0, 78.0, 22.0),
    STARVED: (28.0, 76.0, 96.0),
    DEAD: (0.0, 0.0, 0.4),
    IDLE: (0.0, 78.0, 1.1),
    GONE: (0.0, 0.0, 0.4),
}


@dataclass(frozen=True)
class Segment:
    """From `start_s` on, the job does `activity`; `step_s` is the step time while it trains (None: no steps)."""

    start_s: float
    activity: str
    step_s: float | None = None
    logs: bool = True  # hosts keep writing log lines
    phase_budget_s: float | None = None  # a declared phase (checkpoint) with this budget
    nonfinite: bool = False
    data_wait: float = 4.0  # percent of the window spent waiting for input
    secondary: str | None = None  # the SageMaker secondary status this segment starts (a Slurm job's state)
    status: str = "InProgress"  # the status that goes with it (a Slurm job held out of running: "Paused")
    log_every_min: int = 1  # hosts write a line every this many minutes


@dataclass
class Scenario:
    name: str
    summary: str
    platform: Platform
    instance_type: str
    hosts: int
    agent: bool
    segments: list[Segment]
    duration_s: float
    seed: int
    expect: Expectation | None = None
    tags: dict[str, str] = field(default_factory=dict)
    gpu: Gpu = A100
    crash: tuple[float, int, list[str]] | None = None  # (t, host index, the rank's last words)
    # (from t, host index, factor): that host's own step time x factor and its GPU power / factor (a throttled node)
    straggler: tuple[float, int, float] | None = None
    # A heterogeneous cluster: (instance type, hosts) per group, in order; `instance_type` and `hosts` are the totals'.
    groups: tuple[tuple[str, int], ...] = ()
    # Only these hosts log after start-up (torchrun scripts where global rank 0 alone prints); None: every host.
    log_hosts: tuple[int, ...] | None = None
    vanish: tuple[float, int] | None = None  # (t, host index): from then on nothing comes from that host
    lines: tuple[tuple[float, int, str], ...] = ()  # (t, host index, message): lines at given times

    def host_types(self) -> list[str]:
        """Each host's instance type, in host order."""
        return [t for t, n in self.groups for _ in range(n)] if self.groups else [self.instance_type] * self.hosts


class Simulation:
    """Turns a scenario into trace events."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed)
        spec = instance_spec(sc.instance_type)
        self.gpus, self.vcpus = spec.devices, spec.vcpus
        self.host_specs = [instance_spec(t) for t in sc.host_types()]
        if sc.platform is Platform.EC2:
            self.hosts = [f"i-0{self.rng.randrange(16**16):016x}" for _ in range(sc.hosts)]
        elif sc.platform is Platform.SLURM:  # ParallelCluster's node names, each an instance of the account
            self.hosts = [f"gpu-st-{sc.instance_type.replace('.', '')}-{i}" for i in range(1, sc.hosts + 1)]
            self.instances = {h: f"i-0{self.rng.randrange(16**16):016x}" for h in self.hosts}
        else:
            self.hosts = [f"algo-{i}" for i in range(1, sc.hosts + 1)]
        self.events: list[Event] = []
        self.step = 0
        self.last_step_t = 0.0
        self.next_step_t: float | None = None
        self.loss = 2.9 + self.rng.random() * 0.3
        # The job as Stallwatch names it: the training job; on EC2 the instances' job tag, else the instance.
        # A Slurm job is named <cluster>-<id>-<name>: the scenario's name is one.
        named = sc.platform in (Platform.SAGEMAKER, Platform.SLURM)
        self.job = sc.name if named else sc.tags.get(clusters.JOB_TAG, self.hosts[0])

    def segment_at(self, t: float) -> Segment:
        return [s for s in self.sc.segments if s.start_s <= t][-1]

    def noise(self, value: float, spread: float) -> float:
        return max(0.0, value + self.rng.uniform(-spread, spread))

    def metric(self, t: float, namespace: str, name: str, dims: dict[str, str], value: float) -> None:
        datum = MetricDatum(namespace=namespace, name=name, dimensions=dims, value=round(value, 2))
        self.events.append(MetricEvent(t=round(t, 3), metric=datum))

    def log(self, t: float, host: int, message: str) -> None:
        name = self.hosts[host]
        stream = f"{self.job}/{name}-{STREAM_EPOCH}" if self.sc.platform is Platform.SAGEMAKER else f"{name}/train.log"
        if self.sc.platform is Platform.SLURM:
            stream = slurm.stream_name(self.instances[name], slurm_key(self.job), name)
        self.events.append(LogEvent(t=round(t, 3), log=LogRecord(stream=stream, message=message)))

    def crashed(self, t: float, host: int) -> bool:
        return self.sc.crash is not None and host == self.sc.crash[1] and t >= self.sc.crash[0]

    def straggling(self, t: float, host: int) -> float:
        """How much slower than the others `host` runs at `t` (1.0: not a straggler)."""
        lag = self.sc.straggler
        return lag[2] if lag is not None and host == lag[1] and t >= lag[0] else 1.0

    def vanished(self, t: float, host: int) -> bool:
        return self.sc.vanish is not None and host == self.sc.vanish[1] and t >= self.sc.vanish[0]

    def host_minute(self, t: float, host: int, activity: str) -> None:
        if self.vanished(t, host):
            return
        if self.crashed(t, host):
            activity = DEAD
        gpu, mem, cpu = ACTIVITY[activity]
        gpu, mem, cpu = self.noise(gpu, 3.0) if gpu else 0.0, self.noise(mem, 2.0) if mem else 0.0, self.noise(cpu, 1.0)
        gpu, mem = min(gpu, 100.0), min(mem, 100.0)
        name = self.hosts[host]
        if self.sc.platform is Platform.SAGEMAKER:
            dims = {"Host": f"{self.job}/{name}"}
            ns = contract.SAGEMAKER_NAMESPACE
            spec = self.host_specs[host]
            self.metric(t, ns, "GPUUtilization", dims, gpu * spec.devices)
            self.metric(t, ns, "GPUMemoryUtilization", dims, mem * spec.devices)
            self.metric(t, ns, "CPUUtilization", dims, cpu * spec.vcpus)
        else:
            dims = {contract.CWAGENT_DIM_INSTANCE: self.instances[name] if self.sc.platform is Platform.SLURM else name}
            self.metric(t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_UTILIZATION, dims, gpu)
            self.metric(
                t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_USED, dims, mem / 100 * A100_MEMORY_MIB
            )
            self.metric(t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_TOTAL, dims, A100_MEMORY_MIB)
            self.metric(t, contract.EC2_NAMESPACE, "CPUUtilization", dims, cpu)
        if self.sc.agent and activity not in (DOWNLOAD, DEAD, GONE):
            power = {BUSY: self.sc.gpu.busy_w, STARVED: self.sc.gpu.busy_w * 0.45, HUNG: self.sc.gpu.hung_w}
            watts = power.get(activity, self.sc.gpu.idle_w * 1.5) / self.straggling(t, host)
            host_dims = {contract.DIM_JOB: self.job, contract.DIM_HOST: name}
            ta = t + AGENT_OFFSET_S
            self.metric(ta, contract.NAMESPACE, "Heartbeat", host_dims, 1.0)
            self.metric(ta, contract.NAMESPACE, "GPUPowerWatts", host_dims, self.noise(watts, watts * 0.04))

    def steps_in(self, start: float, end: float, seg: Segment) -> list[float]:
        """Step completion times in [start, end) while `seg` trains."""
        if seg.step_s is None:
            self.next_step_t = None
            return []
        if self.next_step_t is None:
            self.next_step_t = start + seg.step_s
        done = []
        while self.next_step_t < end:
            done.append(self.next_step_t)
            self.next_step_t += seg.step_s * self.rng.uniform(0.97, 1.03)
        return done

    def agent_window(self, t: float, seg: Segment, steps: list[float]) -> None:
        """Rank 0's job metrics for the window ending at `t`."""
        dims = {contract.DIM_JOB: self.job}
        ns = contract.NAMESPACE
        self.metric(t, ns, "Steps", dims, len(steps))
        self.metric(t, ns, "Step", dims, self.step)
        self.metric(t, ns, "LastStepAge", dims, t - self.last_step_t)
        if steps and seg.step_s:
            self.metric(t, ns, "StepTime", dims, self.noise(seg.step_s, seg.step_s * 0.02))
            if not seg.nonfinite:  # CloudWatch takes no NaN: the agent reports it as NonFiniteLoss only
                self.metric(t, ns, "Loss", dims, self.loss)
        self.metric(t, ns, "NonFiniteLoss", dims, len(steps) if seg.nonfinite else 0)
        self.metric(t, ns, "DataWaitFraction", dims, self.noise(seg.data_wait, 2.0) if steps else 0.0)
        remaining = 0.0
        if seg.phase_budget_s is not None:
            remaining = max(0.0, seg.phase_budget_s - (t - seg.start_s))
        self.metric(t, ns, "PhaseBudgetRemaining", dims, remaining)

    def host_step_times(self, t: float, seg: Segment, steps: list[float]) -> None:
        """Each host's own StepTime for the window ending at `t` (the agent's per-host metric)."""
        for host, name in enumerate(self.hosts):
            if steps and seg.step_s and not self.crashed(t, host):
                dims = {contract.DIM_JOB: self.job, contract.DIM_HOST: name}
                # the job runs at the straggler's pace (every step waits for it); the others' own work is quicker
                lag = self.sc.straggler[1] if self.sc.straggler else host
                local = seg.step_s * self.straggling(t, host) / self.straggling(t, lag)
                self.metric(t, contract.NAMESPACE, "StepTime", dims, self.noise(local, local * 0.02))

    def host_logs(self, t: float, seg: Segment, steps: list[float]) -> None:
        if int(t / MINUTE) % seg.log_every_min:
            return
        for host in range(len(self.hosts)):
            if self.crashed(t, host) or self.vanished(t, host) or not seg.logs:
                continue
            if self.sc.log_hosts is not None and host not in self.sc.log_hosts and seg.activity != DOWNLOAD:
                continue
            at = t + 20 + host * 0.37
            rank = host * self.gpus
            if seg.activity == DOWNLOAD:
                if int(t / MINUTE) % 5 == 0:
                    self.log(at, host, f"Downloading s3://training-data/shards/part-{int(t / 300):05d}.tar")
            elif steps:
                tokens = int(self.rng.uniform(0.95, 1.05) * 2.6e6 * len(self.hosts))
                self.log(at, host, f"[rank {rank}] step {self.step} loss {self.loss:.4f} tokens/s {tokens}")
            elif seg.activity == CHECKPOINT:
                self.log(at, host, f"[rank {rank}] writing checkpoint shard {host} of step {self.step}")
            elif seg.step_s is not None:
                self.log(at, host, f"[rank {rank}] accumulating micro-batches for step {self.step + 1}")
            else:
                self.log(at, host, f"[rank {rank}] data prefetcher: 8/8 batches ready")

    def run(self) -> list[Event]:
        sc = self.sc
        announced: set[float] = set()
        t = 0.0
        while t < sc.duration_s:
            seg = self.segment_at(t)
            if seg.secondary and seg.start_s not in announced and sc.platform is not Platform.EC2:
                announced.add(seg.start_s)
                self.events.append(StatusEvent(t=t, status=seg.status, secondary=seg.secondary))
            for host in range(len(self.hosts)):
                self.host_minute(t, host, seg.activity)
            steps = self.steps_in(t, t + MINUTE, seg)
            if steps:
                self.step += len(steps)
                self.last_step_t = steps[-1]
                self.loss = max(1.2, self.loss - 0.0004 * len(steps) + self.rng.uniform(-0.01, 0.01))
            # global rank 0 reports the job, while its processes run
            if sc.agent and seg.activity not in (DOWNLOAD, GONE) and not self.vanished(t, 0):
                self.agent_window(t + MINUTE + AGENT_OFFSET_S, seg, steps)
                if sc.straggler is not None:
                    self.host_step_times(t + MINUTE + AGENT_OFFSET_S, seg, steps)
            self.host_logs(t, seg, steps)
            if sc.crash and sc.crash[0] <= t + MINUTE and sc.crash[0] > t:
                for i, line in enumerate(sc.crash[2]):
                    self.log(sc.crash[0] + i * 0.01, sc.crash[1], line)
            for at, host, line in sc.lines:
                if t <= at < t + MINUTE:
                    self.log(at, host, line)
            t += MINUTE
        events = [e for e in self.events if e.t < sc.duration_s]
        return [*events, EndEvent(t=sc.duration_s, end=True)]

    def header(self) -> TraceHeader:
        sc = self.sc
        job = TraceJob(
            name=self.job,
            platform=sc.platform,
            instance_type=sc.instance_type,
            instance_count=sc.hosts,
            gpus_per_host=self.gpus,
            vcpus_per_host=self.vcpus,
            tags=sc.tags,
            instance_ids=self.hosts if sc.platform in (Platform.EC2, Platform.SLURM) else [],
            host_types=dict(zip(self.hosts, sc.host_types(), strict=True)) if sc.groups else None,
            host_instances=getattr(self, "instances", None),
        )
        return TraceHeader(stallwatch_trace=1, job=job, expect=sc.expect, scenario=sc.summary)


def _stop_within(onset_s: float, minutes: float = 30.0, diagnosis: str | None = None) -> Expectation:
    """The label for a stall: stopped after its onset and within `minutes` of it."""
    return Expectation(action="stop", window_s=(onset_s, onset_s + minutes * 60), diagnosis=diagnosis)


def _no_stop(diagnosis: str | None = None, alerts: int | None = None, warnings: int | None = None) -> Expectation:
    """The label for a job that must not be stopped: at most `alerts` alerts and `warnings` warnings (default 0)."""
    return Expectation(action="none", diagnosis=diagnosis, alerts=alerts, warnings=warnings)


def _start(download_s: float, step_s: float = 1.9) -> list[Segment]:
    return [
        Segment(0.0, DOWNLOAD, logs=True, secondary="Downloading"),
        Segment(download_s, BUSY, step_s=step_s, secondary="Training"),
    ]


NCCL_CRASH = [
    "[rank 32] RuntimeError: CUDA error: an illegal memory access was encountered",
    "Traceback (most recent call last):",
    '  File "/opt/ml/code/train.py", line 412, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED",
]


def scenarios() -> list[Scenario]:
    """Every case the engine must tell apart, on both platforms, 1 and 8 hosts, with and without the agent."""
    sm, ec2 = Platform.SAGEMAKER, Platform.EC2
    hang_onset = 3_930.0
    return [
        Scenario(
            name="sm-hang-8host-agent",
            summary="NCCL hang at 100% GPU utilization on 8 p4d hosts: power drops, steps stop, logs keep flowing.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=8,
            agent=True,
            segments=[*_start(420.0), Segment(hang_onset, HUNG)],
            duration_s=hang_onset + 2_400,
            seed=101,
            expect=_stop_within(hang_onset, diagnosis="hang"),
        ),
        Scenario(
            name="sm-crashed-rank-8host",
            summary="One rank of 8 p4d hosts dies on an illegal memory access; the other 7 spin at 100%; no agent.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=8,
            agent=False,
            segments=[*_start(360.0), Segment(4_110.0, HUNG, logs=False)],
            duration_s=4_110.0 + 2_400,
            seed=102,
            crash=(4_110.0, 4, NCCL_CRASH),
            expect=_stop_within(4_110.0, diagnosis="crashed_rank"),
        ),
        Scenario(
            name="sm-idle-silent-1host",
            summary="Single p4d host without the agent: GPUs go idle and the logs fall silent (a deadlocked script).",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=False,
            segments=[*_start(300.0), Segment(3_000.0, IDLE, logs=False)],
            duration_s=3_000.0 + 3_600,
            seed=103,
            expect=_stop_within(3_000.0, diagnosis="idle"),
        ),
        Scenario(
            name="ec2-idle-silent-noagent",
            summary="EC2 p4d instance (CloudWatch agent metrics only): GPUs idle, process gone quiet.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=1,
            agent=False,
            segments=[Segment(0.0, BUSY, step_s=1.9), Segment(2_700.0, IDLE, logs=False)],
            duration_s=2_700.0 + 3_600,
            seed=104,
            expect=_stop_within(2_700.0, diagnosis="idle"),
        ),
        Scenario(
            name="sm-long-download-1host",
            summary="A 48-minute data download before training (within the 60-minute startup grace), then training.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=_start(2_880.0),
            duration_s=2_880.0 + 3_600,
            seed=105,
            expect=_no_stop(diagnosis="starting"),
        ),
        Scenario(
            name="sm-checkpoint-within-budget-2host",
            summary="2 p5 hosts write a 24-minute checkpoint inside its declared 30-minute budget, then train on.",
            platform=sm,
            instance_type="ml.p5.48xlarge",
            hosts=2,
            agent=True,
            segments=[
                *_start(300.0, step_s=2.4),
                Segment(3_300.0, CHECKPOINT, phase_budget_s=1_800.0),
                Segment(3_300.0 + 1_440.0, BUSY, step_s=2.4),
            ],
            duration_s=7_200.0,
            seed=106,
            gpu=H100,
            expect=_no_stop(diagnosis="phase"),
        ),
        Scenario(
            name="sm-checkpoint-overrun-2host",
            summary="2 p5 hosts: a checkpoint with a 10-minute budget hangs on storage and never finishes.",
            platform=sm,
            instance_type="ml.p5.48xlarge",
            hosts=2,
            agent=True,
            segments=[*_start(300.0, step_s=2.4), Segment(3_300.0, CHECKPOINT, phase_budget_s=600.0)],
            duration_s=3_300.0 + 4_200,
            seed=107,
            gpu=H100,
            expect=_stop_within(3_300.0 + 600.0, diagnosis="phase_overrun"),
        ),
        Scenario(
            name="sm-slow-25min-steps-1host",
            summary="A job whose every step takes 25 minutes (huge gradient accumulation): slow, never stalled.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=_start(300.0, step_s=1_500.0),
            duration_s=4 * 3_600.0,
            seed=108,
            expect=_no_stop(),
        ),
        Scenario(
            name="sm-slowdown-25min-1host",
            summary="Steps slow from 2 s to 25 minutes each (throttled storage), GPUs busy at full power: never stop.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=[*_start(300.0), Segment(2_400.0, BUSY, step_s=1_500.0)],
            duration_s=2_400.0 + 5_400,
            seed=116,
            expect=_no_stop(diagnosis="slow", alerts=1),
        ),
        Scenario(
            name="ec2-dataloader-starvation-agent",
            summary="EC2 p4d: the input pipeline cannot keep up; GPUs ~28% busy, 80% of the time waiting for data.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=[Segment(0.0, BUSY, step_s=1.9), Segment(1_800.0, STARVED, step_s=6.5, data_wait=80.0)],
            duration_s=5_400.0,
            seed=109,
            expect=_no_stop(diagnosis="data_starvation", alerts=1),
        ),
        Scenario(
            name="sm-nonfinite-loss-alert",
            summary="The loss turns NaN and stays NaN; the default policy alerts and never stops.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=[*_start(300.0), Segment(2_400.0, BUSY, step_s=1.9, nonfinite=True)],
            duration_s=5_400.0,
            seed=110,
            expect=_no_stop(diagnosis="nonfinite_loss", alerts=1),
        ),
        Scenario(
            name="sm-nonfinite-loss-stop",
            summary="The loss turns NaN; the job is tagged stallwatch:stop-on-nonfinite-loss=true, so it is stopped.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=[*_start(300.0), Segment(2_400.0, BUSY, step_s=1.9, nonfinite=True)],
            duration_s=5_400.0,
            seed=111,
            tags={"stallwatch:stop-on-nonfinite-loss": "true"},
            expect=_stop_within(2_400.0, diagnosis="nonfinite_loss"),
        ),
        Scenario(
            name="sm-healthy-8host-agent",
            summary="8 p5 hosts training steadily for an hour.",
            platform=sm,
            instance_type="ml.p5.48xlarge",
            hosts=8,
            agent=True,
            segments=_start(480.0, step_s=3.1),
            duration_s=3_600.0,
            seed=112,
            gpu=H100,
            expect=_no_stop(),
        ),
        Scenario(
            name="ec2-healthy-noagent",
            summary="EC2 p4d training steadily for 2 hours, no agent: busy GPUs and a log line a minute.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=1,
            agent=False,
            segments=[Segment(0.0, BUSY, step_s=1.9)],
            duration_s=7_200.0,
            seed=113,
            expect=_no_stop(),
        ),
        Scenario(
            name="ec2-hang-agent",
            summary="EC2 p4d with the agent: a collective hangs at 100% utilization, power drops, a thread logs on.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=[Segment(0.0, BUSY, step_s=1.9), Segment(2_430.0, HUNG)],
            duration_s=2_430.0 + 3_600,
            seed=114,
            expect=_stop_within(2_430.0, diagnosis="hang"),
        ),
        Scenario(
            name="sm-hang-observe-1host",
            summary="A hang on a job tagged stallwatch:mode=observe: Stallwatch records what it would do, never stops.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=True,
            segments=[*_start(300.0), Segment(2_790.0, HUNG)],
            duration_s=2_790.0 + 3_000,
            seed=115,
            tags={"stallwatch:mode": "observe"},
            expect=_no_stop(diagnosis="hang"),
        ),
        *_cluster_scenarios(),
    ]


def _cluster_scenarios() -> list[Scenario]:
    """EC2 clusters as one job (instances sharing a stallwatch:job tag) and a heterogeneous SageMaker cluster."""
    ec2, sm = Platform.EC2, Platform.SAGEMAKER
    return [
        Scenario(
            name="ec2-hang-8node-agent",
            summary="8 EC2 p4d nodes of one torchrun job (stallwatch:job tag), agent on: an NCCL all-reduce hangs at "
            "100% utilization, power drops, steps stop; one StopInstances for all 8.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=8,
            agent=True,
            segments=[Segment(0.0, BUSY, step_s=2.1), Segment(1_860.0, HUNG, logs=False)],
            duration_s=1_860.0 + 1_800,
            seed=301,
            tags={clusters.JOB_TAG: "ec2-hang-8node-agent"},
            expect=_stop_within(1_860.0, diagnosis="hang"),
        ),
        Scenario(
            name="ec2-node-crash-8node-noagent",
            summary="8 EC2 p4d nodes without the agent: node 6 dies on an illegal memory access (its log shows it), "
            "the other 7 spin at 100% in the collective and fall silent.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=8,
            agent=False,
            segments=[Segment(0.0, BUSY, step_s=2.1), Segment(1_680.0, HUNG, logs=False)],
            duration_s=1_680.0 + 1_800,
            seed=302,
            crash=(1_680.0, 5, NCCL_CRASH),
            tags={clusters.JOB_TAG: "ec2-node-crash-8node"},
            expect=_stop_within(1_680.0, diagnosis="crashed_rank"),
        ),
        Scenario(
            name="ec2-idle-after-training-4node",
            summary="4 EC2 p4d nodes finish training and exit; nobody stops the instances: GPUs idle and empty, logs "
            "silent.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=4,
            agent=False,
            segments=[Segment(0.0, BUSY, step_s=2.1), Segment(2_400.0, DEAD, logs=False)],
            duration_s=2_400.0 + 2_700,
            seed=303,
            tags={clusters.JOB_TAG: "ec2-idle-after-training"},
            expect=_stop_within(2_400.0, minutes=45.0, diagnosis="idle"),
        ),
        Scenario(
            name="sm-hetero-hang-agent",
            summary="Heterogeneous SageMaker cluster (2 x ml.p4d.24xlarge + 2 x ml.g5.12xlarge), agent on: a "
            "collective hangs on every host; GPU metrics are per device of each group's type.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=4,
            agent=True,
            segments=[*_start(420.0), Segment(2_100.0, HUNG)],
            duration_s=2_100.0 + 1_800,
            seed=304,
            groups=(("ml.p4d.24xlarge", 2), ("ml.g5.12xlarge", 2)),
            expect=_stop_within(2_100.0, diagnosis="hang"),
        ),
    ]


# --- issue 30: Slurm jobs (ParallelCluster nodes, each an instance of the account; one stream per job and node) ------

SLURM_CRASH = [
    "[rank 24]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "srun: error: gpu-st-p548xlarge-4: task 3: Exited with exit code 1",
]


def slurm_key(job: str) -> str:
    """The log key of a Slurm scenario's job, named as on a plain cluster (``pc1-4242-llama-hang``)."""
    parts = slurm.plain_parts(job)
    if parts is None:
        raise ValueError(f"{job!r}: a Slurm scenario's job is named <cluster>-<id>-<name>, its cluster plain")
    return slurm.log_key(*parts)


def slurm_scenarios() -> list[Scenario]:
    """A Slurm job's hang, crashed rank and lost node are stopped; a preempted job, requeued and waiting to run again,
    is not (issue 30)."""
    pc = Platform.SLURM
    return [
        Scenario(
            name="pc1-4242-llama-hang",
            summary="A 4-node Slurm job on ParallelCluster (p5), agent on: a collective hangs at 100% on every node, "
            "power drops, steps stop; the nodes' streams keep NCCL's watchdog lines.",
            platform=pc,
            instance_type="p5.48xlarge",
            hosts=4,
            agent=True,
            segments=[Segment(0.0, BUSY, step_s=2.4, secondary="RUNNING"), Segment(2_520.0, HUNG)],
            duration_s=2_520.0 + 1_800,
            seed=401,
            gpu=H100,
            tags={"stallwatch:mode": "enforce"},
            expect=_stop_within(2_520.0, diagnosis="hang"),
        ),
        Scenario(
            name="pc1-4243-llama-crashed-rank",
            summary="A 4-node Slurm job without the agent: rank 24 on node 4 dies of an illegal memory access (srun "
            "says so), the other nodes spin in the collective and fall silent.",
            platform=pc,
            instance_type="p5.48xlarge",
            hosts=4,
            agent=False,
            segments=[Segment(0.0, BUSY, step_s=2.4, secondary="RUNNING"), Segment(1_980.0, HUNG, logs=False)],
            duration_s=1_980.0 + 1_800,
            seed=402,
            gpu=H100,
            crash=(1_980.0, 3, SLURM_CRASH),
            expect=_stop_within(1_980.0, diagnosis="crashed_rank"),
        ),
        Scenario(
            name="pc1-4244-llama-lost-node",
            summary="A 4-node Slurm job, agent on: node 2 is lost (nothing more comes from it, metrics or lines), the "
            "others wait in the collective at 100%; Slurm has not failed the node yet.",
            platform=pc,
            instance_type="p5.48xlarge",
            hosts=4,
            agent=True,
            segments=[Segment(0.0, BUSY, step_s=2.4, secondary="RUNNING"), Segment(2_160.0, HUNG, logs=False)],
            duration_s=2_160.0 + 1_800,
            seed=403,
            gpu=H100,
            vanish=(2_160.0, 1),
            expect=_stop_within(2_160.0),
        ),
        Scenario(
            name="pc1-4245-llama-preempted",
            summary="A 2-node Slurm job preempted by a higher-priority partition (PreemptMode=REQUEUE): its processes "
            "are killed, the epilog says REQUEUED, it waits 25 min in the queue, then runs again from its checkpoint: "
            "idle GPUs and silent logs meanwhile are no stall.",
            platform=pc,
            instance_type="p5.48xlarge",
            hosts=2,
            agent=True,
            segments=[
                Segment(0.0, BUSY, step_s=2.4, secondary="RUNNING"),
                Segment(2_400.0, GONE, logs=False, secondary="REQUEUED", status="Paused"),
                Segment(3_900.0, BUSY, step_s=2.4, secondary="RUNNING"),
            ],
            duration_s=3_900.0 + 1_800,
            seed=404,
            gpu=H100,
            tags={"stallwatch:mode": "enforce"},
            expect=_no_stop(),
        ),
    ]


# --- issue 12: decision quality (learned cadence, no nagging, stragglers, slowdowns) --------------------------------


def decision_quality_scenarios() -> list[Scenario]:
    """Healthy jobs that must not be nagged, and problems that are alerts, never stops."""
    sm = Platform.SAGEMAKER
    return [
        Scenario(
            name="sm-rare-logger-noagent",
            summary="No agent, busy GPUs, one log line every 20 minutes for 5 hours: healthy, alerted at most once.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=1,
            agent=False,
            segments=[
                Segment(0.0, DOWNLOAD, secondary="Downloading"),
                Segment(60.0, BUSY, step_s=1.9, secondary="Training", log_every_min=20),
            ],
            duration_s=5 * 3_600.0,
            seed=120,
            expect=_no_stop(alerts=1),
        ),
        Scenario(
            name="sm-eval-40min-noagent",
            summary="No agent, no declared phase, no GPU power: a 40-minute evaluation on busy GPUs writes no log "
            "line, and the job says so (stallwatch:busy-silence-minutes=60; busy GPUs silent 30 minutes are a hang "
            "otherwise); one alert.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=2,
            agent=False,
            segments=[
                *_start(300.0),
                Segment(3_600.0, BUSY, logs=False),
                Segment(3_600.0 + 2_400.0, BUSY, step_s=1.9),
            ],
            duration_s=3 * 3_600.0,
            seed=121,
            tags={"stallwatch:busy-silence-minutes": "60"},
            expect=_no_stop(alerts=1),
        ),
        Scenario(
            name="sm-straggler-8host-agent",
            summary="8 p4d hosts with the agent; algo-6's GPUs throttle: its steps take 1.8x the others'.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=8,
            agent=True,
            segments=[*_start(420.0), Segment(1_500.0, BUSY, step_s=1.9 * 1.8)],
            duration_s=4_500.0,
            seed=122,
            straggler=(1_500.0, 5, 1.8),
            expect=_no_stop(diagnosis="straggler", alerts=2),  # the slowdown, then the host that causes it
        ),
        Scenario(
            name="sm-step-time-doubles-2host",
            summary="2 p4d hosts with the agent: halfway through, every step takes twice as long (a slowdown).",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=2,
            agent=True,
            segments=[*_start(300.0), Segment(3_600.0, BUSY, step_s=3.8)],
            duration_s=2 * 3_600.0,
            seed=123,
            expect=_no_stop(diagnosis="slow", alerts=1),
        ),
    ]


# --- issue 21: evidence the corpus never showed (late or blind decisions) --------------------------------------------

OOM_AND_ABORT = [
    "[rank24]: Traceback (most recent call last):",
    "[rank24]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of "
    "39.39 GiB of which 1.21 GiB is free.",
    "[rank24]:[E ProcessGroupNCCL.cpp:1182] [PG 0 Rank 24] NCCL communicator was aborted on rank 24.",
]
XID_79 = [
    "[Tue Dec  1 09:14:22 2026] NVRM: Xid (PCI:0000:10:1c): 79, pid=4242, name=python, GPU has fallen off the bus."
]
NCCL_WATCHDOG = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5121, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600031 milliseconds "
    "before timing out."
)


def evidence_scenarios() -> list[Scenario]:
    """Faults whose evidence is a host's, not the job's: a hung declared phase, a crash where only rank 0 logs, a
    lost reporting host, a fatal line from a rare logger; and a live job that looks idle (an undeclared checkpoint)
    and a mild straggler."""
    sm, ec2 = Platform.SAGEMAKER, Platform.EC2
    eval_deadline = 3_600.0 + 900.0
    return [
        Scenario(
            name="sm-eval-phase-hangs-2host-agent",
            summary="2 p4d hosts with the agent: phase('eval', budget_s=900) hangs in a collective and never ends; "
            "stopped about 15 min after its budget (10-min allowance, 5-min grace).",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=2,
            agent=True,
            segments=[*_start(300.0), Segment(eval_deadline - 900.0, HUNG, phase_budget_s=900.0, logs=False)],
            duration_s=eval_deadline + 2_400,
            seed=401,
            expect=_stop_within(eval_deadline, minutes=20.0, diagnosis="phase_overrun"),
        ),
        Scenario(
            name="ec2-crash-rank0-logs-4node-noagent",
            summary="4 EC2 p4d nodes without the agent, only node 1 logs after start-up: node 3 dies of a CUDA OOM "
            "(traceback, NCCL abort), its GPUs fall to 0 % while the other three spin at 100 % in the collective.",
            platform=ec2,
            instance_type="p4d.24xlarge",
            hosts=4,
            agent=False,
            segments=[Segment(0.0, BUSY, step_s=2.1), Segment(2_400.0, HUNG, logs=False)],
            duration_s=2_400.0 + 5_400,
            seed=402,
            crash=(2_400.0, 2, OOM_AND_ABORT),
            log_hosts=(0,),
            tags={clusters.JOB_TAG: "ec2-crash-rank0-logs"},
            expect=_stop_within(2_400.0, minutes=15.0, diagnosis="crashed_rank"),
        ),
        Scenario(
            name="sm-rank0-host-lost-4host-agent",
            summary="4 p5 hosts with the agent: the host of global rank 0 vanishes (no metric, no line), so the job "
            "metrics stop; the others' heartbeats go on, their power fallen by three quarters, no log line anywhere.",
            platform=sm,
            instance_type="ml.p5.48xlarge",
            hosts=4,
            agent=True,
            segments=[*_start(420.0, step_s=2.8), Segment(3_000.0, HUNG, logs=False)],
            duration_s=3_000.0 + 5_400,
            seed=403,
            gpu=H100,
            vanish=(3_000.0, 0),
            expect=_stop_within(3_000.0, minutes=15.0, diagnosis="crashed_rank"),
        ),
        Scenario(
            name="sm-xid-rare-logger-noagent",
            summary="4 p4d hosts without the agent, a line every 20 minutes: an Xid 79 on algo-2 (fallen off the "
            "bus), the others spin, then their NCCL watchdogs tear them down; never held back by the learned cadence.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=4,
            agent=False,
            segments=[
                Segment(0.0, DOWNLOAD, secondary="Downloading"),
                Segment(60.0, BUSY, step_s=1.9, secondary="Training", log_every_min=20),
                Segment(14_430.0, HUNG, logs=False),
                Segment(14_430.0 + 600, DEAD, logs=False),
            ],
            duration_s=14_430.0 + 3_600,
            seed=404,
            crash=(14_430.0, 1, XID_79),
            lines=tuple((14_430.0 + 600 + h * 0.1, h, NCCL_WATCHDOG.format(rank=8 * h)) for h in (0, 2, 3)),
            expect=_stop_within(14_430.0, minutes=15.0, diagnosis="crashed_rank"),
        ),
        Scenario(
            name="sm-undeclared-checkpoint-noagent",
            summary="2 p4d hosts without the agent write a 25-minute checkpoint they did not declare: GPUs near 0 %, "
            "memory held, logs silent between 'Saving checkpoint' and its end. A live job: never stopped.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=2,
            agent=False,
            segments=[*_start(300.0), Segment(3_600.0, CHECKPOINT, logs=False), Segment(5_100.0, BUSY, step_s=1.9)],
            duration_s=7_200.0,
            seed=405,
            lines=(
                *(
                    (3_600.0 + h * 0.1, h, f"[rank {8 * h}] Saving checkpoint to s3://ckpt/run/step-1700")
                    for h in (0, 1)
                ),
                *((5_100.0 + h * 0.1, h, f"[rank {8 * h}] Checkpoint saved in 1500 s") for h in (0, 1)),
            ),
            expect=_no_stop(),
        ),
        Scenario(
            name="sm-hang-loader-stacks-4host-agent",
            summary="4 p4d hosts with the agent: rank 13's DataLoader never returns its batch; the 31 other ranks wait "
            "in the step's all_reduce (flight recorder on). Every rank dumps its stacks a minute in: rank 13 is named.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=4,
            agent=True,
            segments=[*_start(300.0), Segment(3_000.0, HUNG)],
            duration_s=3_000.0 + 2_400,
            seed=407,
            lines=stack_dumps(3_000.0, hosts=4, ranks_per_host=8, odd=13, seq=88_421),
            expect=_stop_within(3_000.0, diagnosis="hang"),
        ),
        Scenario(
            name="sm-straggler-30pct-8host-agent",
            summary="8 p4d hosts with the agent; algo-4's GPUs throttle: its steps take 1.3x the others' (named).",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=8,
            agent=True,
            segments=[*_start(420.0), Segment(1_500.0, BUSY, step_s=1.9 * 1.3)],
            duration_s=1_500.0 + 2_700,
            seed=406,
            straggler=(1_500.0, 3, 1.3),
            expect=_no_stop(diagnosis="straggler", alerts=2),
        ),
        Scenario(
            name="sm-hang-watchdog-4host-noagent",
            summary="4 p4d hosts without the agent hang in a collective (GPUs pinned at 100 %, logs silent); 10 "
            "minutes later every host's NCCL watchdog times out, and those lines are every host's last words: their "
            "subscription wakes the engine, no alarm needed.",
            platform=sm,
            instance_type="ml.p4d.24xlarge",
            hosts=4,
            agent=False,
            segments=[*_start(300.0), Segment(3_000.0, HUNG, logs=False)],
            duration_s=3_000.0 + 3_600,
            seed=407,
            lines=tuple((3_000.0 + 600 + h * 0.4, h, NCCL_WATCHDOG.format(rank=8 * h)) for h in range(4)),
            expect=_stop_within(3_000.0, minutes=15.0, diagnosis="hang"),
        ),
    ]


# The agent's stack dumps (trainer_agent.stack_dumps) of a DDP job blocked in its step's all_reduce, and of a rank whose
# DataLoader waits on its workers (a stuck read on one host's storage): frames innermost first, (file, line, function,
# source line, library).
IN_ALL_REDUCE = (
    ("torch/distributed/distributed_c10d.py", 2501, "all_reduce", "work.wait()", True),
    ("torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)", True),
    ("train.py", 212, "train_step", "dist.all_reduce(loss_sum)", False),
    ("train.py", 301, "main", "loss = train_step(model, batch)", False),
    ("train.py", 330, "<module>", "main()", False),
)
IN_DATALOADER = (
    ("threading.py", 331, "wait", "gotit = waiter.acquire(True, timeout)", True),
    ("queue.py", 180, "get", "self.not_empty.wait(remaining)", True),
    ("torch/utils/data/dataloader.py", 1133, "_try_get_data", "data = self._data_queue.get(timeout=timeout)", True),
    ("torch/utils/data/dataloader.py", 1295, "_get_data", "success, data = self._try_get_data()", True),
    ("torch/utils/data/dataloader.py", 1333, "_next_data", "idx, data = self._get_data()", True),
    ("torch/utils/data/dataloader.py", 733, "__next__", "data = self._next_data()", True),
    ("train.py", 298, "main", "batch = next(loader_iter)", False),
    ("train.py", 330, "<module>", "main()", False),
)


def stack_dumps(t: float, hosts: int, ranks_per_host: int, odd: int, seq: int) -> tuple[tuple[float, int, str], ...]:
    """Every rank's dump a minute into a stall at `t` (trace seconds): all in the step's all_reduce at `seq` but
    `odd`, whose loader never returned its batch (its last collective `seq - 1`)."""
    world = hosts * ranks_per_host
    lines = []
    for rank in range(world):
        frames = IN_DATALOADER if rank == odd else IN_ALL_REDUCE
        at = t + MINUTE + rank * 0.01
        dump = StackDump(
            job="sm-hang-loader-stacks-4host-agent",
            host=f"algo-{rank // ranks_per_host + 1}",
            rank=rank,
            world_size=world,
            local_rank=rank % ranks_per_host,
            pid=4_000 + rank,
            steps=1_842,
            reason=STALL,
            stalled_s=MINUTE,
            t=TRACE_EPOCH + at,
            main=[
                {"file": f, "line": n, "func": fn, "code": code} | ({"lib": True} if lib else {})
                for f, n, fn, code, lib in frames
            ],
            threads=[{"name": "pt_autograd_0", "at": "threading.py:327 wait"}],
            thread_count=1,
            collective={
                "group": "default_pg",
                "seq": seq - (rank == odd),
                "op": "all_reduce",
                "state": "completed" if rank == odd else "started",
            },
            max_bytes=line_bytes(world),
        )
        lines.append((at, rank // ranks_per_host, dump.line()))
    return tuple(lines)


def benchmark_scenario(hours: float = 6.0, hosts: int = 8) -> Scenario:
    """The replay-speed benchmark: a healthy `hours`-long, `hosts`-host job with the agent (replayed to its end)."""
    return Scenario(
        name=f"bench-{hosts}host-{hours:g}h",
        summary=f"{hours:g}-hour, {hosts}-host p4d job with the agent, healthy throughout.",
        platform=Platform.SAGEMAKER,
        instance_type="ml.p4d.24xlarge",
        hosts=hosts,
        agent=True,
        segments=_start(600.0),
        duration_s=hours * 3_600,
        seed=200,
        expect=_no_stop(),
    )


def write_scenario(sc: Scenario, path: Path) -> None:
    sim = Simulation(sc)
    events = sim.run()
    write_trace(sim.header(), events, path)


def generate(out: Path, select: Callable[[Scenario], bool] = lambda _: True) -> list[Path]:
    """Write every corpus trace into `out`; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for sc in [*scenarios(), *decision_quality_scenarios(), *evidence_scenarios(), *slurm_scenarios()]:
        if select(sc):
            path = out / f"{sc.name}.jsonl"
            write_scenario(sc, path)
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TRACES_DIR, help="directory for the corpus traces")
    parser.add_argument("--benchmark", type=Path, help="write only the benchmark trace (a healthy job) to this file")
    parser.add_argument("--hours", type=float, default=6.0, help="the benchmark trace's length (default 6)")
    parser.add_argument("--hosts", type=int, default=8, help="the benchmark trace's hosts (default 8)")
    args = parser.parse_args(argv)
    if args.benchmark:
        write_scenario(benchmark_scenario(hours=args.hours, hosts=args.hosts), args.benchmark)
        print(args.benchmark)
        return 0
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
