"""Simulated training jobs with faults drawn from a published failure mix, for the fault-mix benchmark.

    jobs = draw_jobs(seed=7, job_days=300)                 # seeded: the same jobs every run
    header, events = simulate(jobs[0])                     # trace format v1, one event at a time, in time order
    jobs[0].fault                                          # what goes wrong, when, where (None: a healthy job)

The mix is Meta's for Llama 3 405B pre-training (419 unexpected interruptions in 54 days on 16,384 H100s; "The
Llama 3 Herd of Models", table 5): each cause is mapped to what it does to a job. A faulty GPU, HBM3, SRAM or a GPU
system processor kills its rank (a CUDA error or an Xid; "fallen off the bus" takes the host's GPU metrics with it), a
software bug kills a rank with a traceback, a network switch, cable, NIC or an NCCL bug hangs a collective, host
maintenance and a host's power, chassis or board lose the host, thermal trouble slows a node. A dead rank's peers
spin in their collective (GPUs busy, power fallen) until PyTorch's NCCL watchdog tears them down after its timeout
(10 minutes by default; some jobs raise it, and their hangs spin silently, with no watchdog line, for up to two
hours), and the job stays up (a wrapper, or EC2 instances): a stall that leaves the job running. Faults are drawn
more often than Meta saw them (about one job in two has one), so that there are enough to measure; the mix is theirs.

Healthy jobs do what healthy jobs do: declared and undeclared checkpoints (some beyond their budget, some silent),
evaluations that log nothing while they run (each job's of about the same length each time, 3 to 25 minutes, begun
at a step count as its log lines are; most end with a line of results), data stalls, restarts by the launcher after
a rank failed (torchrun's `max_restarts`), long downloads, long steps, rank-0-only logging and rare loggers. The
agent's behaviour follows trainer_agent: job metrics from global rank 0, host metrics and an EMF line a window from
every host while its process lives, the time a blocked loop waits outside step() counted as data wait.

Kept whole (over 500 lines): the fault mix's catalogue, its draw and its trace writer are read together to
reproduce one mix from its seed.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from corpus import real_lines
from corpus.generate import slurm_key
from stallwatch.core import contract, log_patterns
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms.slurm import slurm_job_name, stream_name
from stallwatch.core.pricing import instance_spec
from stallwatch.core.signals import Platform
from stallwatch.core.trace import (
    EndEvent,
    Event,
    LogEvent,
    LogRecord,
    MetricDatum,
    MetricEvent,
    StatusEvent,
    TraceHeader,
    TraceJob,
)
from trainer_agent.stack_dumps import STALL, StackDump, line_bytes

MINUTE = 60.0
LOG_LINE_S = 20.0  # a logging host writes its progress line this far into a minute
AGENT_OFFSET_S = 7.0  # the agent's windows close this far into each minute
NCCL_TIMEOUT_S = 600.0  # PyTorch's default ProcessGroupNCCL timeout: the watchdog tears a hung collective down
# The NCCL timeouts jobs run with, and how often: PyTorch's 10 minutes, DeepSpeed's and NeMo's 30, and the hours
# jobs with long checkpoints set (`init_process_group(timeout=timedelta(hours=1))`). A hang spins silently, with no
# watchdog line, for that long.
NCCL_TIMEOUTS_S = ((NCCL_TIMEOUT_S, 0.5), (1800.0, 0.2), (3600.0, 0.15), (7200.0, 0.15))
EVAL_RESULT_SHARE = 0.7  # of jobs, this many print their evaluation's results when it ends (most frameworks do)
AFTER_ONSET_S = 5400.0  # a fault job's trace ends this long after the fault (a stop later than that is a miss)
GPU_MEMORY_MIB = 81_559  # H100 80 GB, as nvidia-smi reports it
# Slurm jobs add this share of the job-days, drawn on a stream of their own after the others (which stay as they were),
# on a ParallelCluster whose job ids count from SLURM_FIRST_ID.
SLURM_SHARE = 0.2
SLURM_CLUSTER = "pcfm"  # a plain cluster name: its jobs' names read back to it and their ids
SLURM_FIRST_ID = 4000
STREAM_EPOCH = 1_700_000_000
# Healthy jobs print real lines they train on after (corpus/real_lines' harmless blocks: a caught exception's
# traceback, a retry, a skipped batch; some printed by every rank at once): this share of jobs, one block every
# HARMLESS_EVERY_S on average, a third of them as an evaluation or a checkpoint begins (a DataLoader's __del__).
HARMLESS_SHARE = 0.6
HARMLESS_EVERY_S = (3600.0, 6 * 3600.0)
HARMLESS_AT_EPISODE = 0.33
# Some crashes recur on every restart of the launcher (torchrun's max_restarts): a bug, or a faulty GPU, hit again at
# the first step after the checkpoint loads. Its restarts: torchrun's usual 3, or as many as the trace holds.
CRASH_LOOP_SHARE = {"software bug": 0.4}
CRASH_LOOP_OTHER_SHARE = 0.15
CRASH_LOOP_RESTARTS = (3, 1000)
LOOP_DOWN_S = 60.0  # the launcher stops every rank after a failure, then waits for the rendezvous
LOOP_CYCLE_S = (150.0, 300.0)  # from one crash to the next: the restart, the checkpoint's load, the first step
# The agent's stall watch (trainer_agent.stack_dumps): every live rank's stacks once per stall, this long without a
# step (at least 3 step times), never within a declared phase's budget; none before a (re)started process's first step.
STALL_DUMP_FLOOR_S = 60.0
STALL_DUMP_STEPS = 3.0
RANKS_PER_HOST = 8

# (cause, share of interruptions, what it does): Llama 3's table 5, the causes the issue names and the rest.
LLAMA3_MIX: tuple[tuple[str, float, str], ...] = (
    ("faulty GPU", 30.1, "crash"),
    ("GPU HBM3 memory", 17.2, "crash"),
    ("software bug", 12.9, "crash"),
    ("network switch or cable", 8.4, "hang"),
    ("host maintenance", 7.6, "lost"),
    ("GPU SRAM memory", 4.5, "crash"),
    ("GPU system processor", 4.1, "crash"),
    ("NIC", 1.7, "hang"),
    ("NCCL watchdog timeout", 1.7, "hang"),
    ("GPU thermal interface and sensor", 1.4, "slow"),
    ("SSD", 0.7, "lost"),
    ("power supply", 0.7, "lost"),
    ("server chassis", 0.5, "lost"),
    ("IO expansion board", 0.5, "lost"),
    ("CPU", 0.5, "lost"),
    ("system memory", 0.5, "lost"),
)
STALL_KINDS = ("crash", "hang", "lost")
SLOW_FACTORS = (1.3, 1.4, 1.5, 1.65, 1.8, 2.0)
FAULT_SHARE = 0.5  # of jobs, about this many have a fault
SLOW_SHARE = 0.12  # ... and this many a node that turns slow (Meta's thermal share is small; stragglers are not)

# The lines each cause leaves in the dead rank's log (the first is the rank's, the rest the launcher's report).
CRASH_LINES: dict[str, tuple[str, ...]] = {
    "faulty GPU": (
        "[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "[rank{rank}]: Traceback (most recent call last):",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED",
    ),
    "GPU HBM3 memory": (
        "[rank{rank}]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 3",
    ),
    "software bug": (
        "[rank{rank}]: Traceback (most recent call last):",
        '[rank{rank}]:   File "/opt/ml/code/train.py", line 381, in <module>',
        "[rank{rank}]: KeyError: 'attention_mask'",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED",
    ),
    "GPU SRAM memory": ("[rank{rank}]: torch.AcceleratorError: CUDA error: unspecified launch failure",),
    "GPU system processor": (
        "NVRM: Xid (PCI:0000:53:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
        "[rank{rank}]: RuntimeError: CUDA error: unspecified launch failure",
    ),
}
# The Transformers Trainer's line at the end of an evaluation.
EVAL_RESULTS = "{{'eval_loss': 2.3124, 'eval_runtime': {runtime:.1f}, 'eval_samples_per_second': 41.8, 'epoch': 0.42}}"
NCCL_LINES = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=81234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600050 "
    "milliseconds before timing out.",
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:1700] Some NCCL operations have failed or timed out. Due to the "
    "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
)


@dataclass(frozen=True)
class Gpu:
    """One device's power draw by activity, watts."""

    busy_w: float
    idle_w: float


A100 = Gpu(busy_w=380.0, idle_w=58.0)
H100 = Gpu(busy_w=640.0, idle_w=75.0)
GPUS = {"p4d.24xlarge": A100, "p5.48xlarge": H100, "g5.12xlarge": Gpu(busy_w=250.0, idle_w=35.0)}


@dataclass(frozen=True)
class Fault:
    """What goes wrong: `kind` (crash, hang, lost, slow) from `cause`, at `onset_s`, on host `host`."""

    kind: str
    cause: str
    onset_s: float
    host: int = 0
    factor: float = 1.0  # slow: the node's step time times this, its GPU power over it

    @property
    def stall(self) -> bool:
        return self.kind in STALL_KINDS


@dataclass(frozen=True)
class Episode:
    """A healthy interruption of training: what, from `start_s`, for `length_s`."""

    kind: str  # checkpoint, eval, data_stall, restart
    start_s: float
    length_s: float
    declared_budget_s: float | None = None  # a checkpoint declared with agent.phase(budget_s=...)
    start_line: bool = True  # the checkpoint or evaluation says so in its log
    end_line: bool = True
    host: int = 0  # restart: the rank whose failure the launcher restarts from

    @property
    def end_s(self) -> float:
        return self.start_s + self.length_s


@dataclass(frozen=True)
class Job:
    """One simulated job: its platform and shape, its habits, what it goes through, and its fault."""

    name: str
    platform: Platform
    instance_type: str  # the EC2 name (SageMaker's is ml.<it>)
    hosts: int
    agent: bool
    duration_s: float
    seed: int
    startup_s: float
    step_s: float
    log_every_s: float  # the logging hosts write a progress line this often
    rank0_only_logs: bool  # only global rank 0's host logs after start-up
    ec2_power: bool  # EC2 and Slurm's nodes: the CloudWatch agent publishes power_draw too
    nccl_timeout_s: float = NCCL_TIMEOUT_S  # a hang's watchdog lines come this long after its onset
    eval_s: float = 600.0  # its evaluations take about this long
    eval_results: bool = True  # an evaluation ends with a line of its results
    # With real lines: the checkpoint sequence it writes, and its crash's last words (None: drawn for it)
    checkpoint_lines: str | None = None
    crash_lines: str | None = None
    episodes: tuple[Episode, ...] = ()
    fault: Fault | None = None
    groups: tuple[tuple[str, int], ...] = ()  # a heterogeneous SageMaker cluster's groups (type, hosts)
    # (t, block name, the host that prints it or None: every rank) of each real harmless block it prints
    harmless: tuple[tuple[float, str, int | None], ...] = ()
    crash_restarts: int = 0  # a crash that recurs on each of this many restarts of its launcher (0: none)
    loop_cycle_s: float = 0.0  # ... from one crash to the next

    @property
    def logging_steps(self) -> int:
        """With steps of a minute or more, it logs every this many steps (about `log_every_s`)."""
        return max(1, round(self.log_every_s / self.step_s))

    @property
    def log_interval_s(self) -> float:
        """How often its logging hosts write a progress line."""
        return self.log_every_s if self.step_s < MINUTE else self.logging_steps * self.step_s

    @property
    def power(self) -> bool:
        """Whether the control plane sees GPU power: the agent's, or the CloudWatch agent's power_draw."""
        return self.agent or self.ec2_power

    @property
    def crash_loop(self) -> bool:
        return self.fault is not None and self.fault.kind == "crash" and self.crash_restarts > 0

    def crashes(self) -> list[float]:
        """When its rank crashes: at the fault's onset, and again after each restart of a crash loop."""
        fault = self.fault
        if fault is None or fault.kind != "crash":
            return []
        return [fault.onset_s + k * self.loop_cycle_s for k in range(self.crash_restarts + 1 if self.crash_loop else 1)]

    @property
    def end_s(self) -> float:
        """Where the trace ends: the job's length, or `AFTER_ONSET_S` after a fault."""
        if self.fault is None or self.fault.kind == "slow":
            return self.duration_s
        return min(self.duration_s, self.fault.onset_s + AFTER_ONSET_S)

    @property
    def days(self) -> float:
        return self.end_s / 86_400

    def host_types(self) -> list[str]:
        return [t for t, n in self.groups for _ in range(n)] if self.groups else [self.instance_type] * self.hosts


# --- drawing the jobs --------------------------------------------------------------------------------------------

HOST_COUNTS = ((1, 10), (2, 10), (4, 14), (8, 20), (16, 14), (32, 10), (64, 9), (128, 4), (256, 2), (512, 2))


def _duration_s(hosts: int) -> float:
    """Long jobs for small clusters, shorter ones for big (the replay's cost grows with host-hours)."""
    return 86_400.0 if hosts <= 16 else 43_200.0 if hosts <= 64 else 4 * 3600.0


def draw_jobs(seed: int, job_days: float) -> list[Job]:
    """SageMaker and EC2 jobs until `job_days` of them (their traces' lengths) are drawn, then Slurm jobs until
    `SLURM_SHARE` as many more, from a stream of their own (`seed + 1`)."""
    jobs: list[Job] = []
    for stream, platform, budget in ((seed, None, job_days), (seed + 1, Platform.SLURM, job_days * SLURM_SHARE)):
        rng, days = random.Random(stream), 0.0
        while days < budget:
            job = _draw_job(rng, len(jobs), rng.randrange(2**31), platform)
            jobs.append(job)
            days += job.days
    return jobs


def _draw_job(rng: random.Random, index: int, seed: int, platform: Platform | None = None) -> Job:
    """A job of `platform` (default: SageMaker or EC2, drawn)."""
    hosts = rng.choices([h for h, _ in HOST_COUNTS], weights=[w for _, w in HOST_COUNTS])[0]
    platform = platform or (Platform.EC2 if rng.random() < 0.4 else Platform.SAGEMAKER)
    instance_type = rng.choice(("p4d.24xlarge", "p5.48xlarge"))
    groups: tuple[tuple[str, int], ...] = ()
    if platform is Platform.SAGEMAKER and hosts >= 4 and rng.random() < 0.15:
        groups = ((instance_type, hosts // 2), ("g5.12xlarge", hosts - hosts // 2))
    agent = rng.random() < 0.5
    duration = _duration_s(hosts)
    startup = rng.uniform(120, 900) if rng.random() < 0.85 else rng.uniform(900, 3000)  # a long download now and then
    step_s = rng.uniform(0.8, 6.0) if rng.random() < 0.95 else rng.uniform(300, 1500)  # a few long-step jobs
    log_every = 60.0 if rng.random() < 0.85 else 1200.0  # some log rarely (a line every 20 min)
    rank0_only = hosts > 1 and rng.random() < 0.5
    name = f"fm-{index:04d}-{platform.value[:2]}-{hosts}h-{'agent' if agent else 'noagent'}"
    job = Job(
        name=slurm_job_name(SLURM_CLUSTER, str(SLURM_FIRST_ID + index), name) if platform is Platform.SLURM else name,
        platform=platform,
        instance_type=instance_type,
        hosts=hosts,
        agent=agent,
        duration_s=duration,
        seed=seed,
        startup_s=startup,
        step_s=step_s,
        log_every_s=log_every,
        rank0_only_logs=rank0_only,
        ec2_power=platform is not Platform.SAGEMAKER and rng.random() < 0.7,
        nccl_timeout_s=rng.choices([t for t, _ in NCCL_TIMEOUTS_S], weights=[w for _, w in NCCL_TIMEOUTS_S])[0],
        eval_s=rng.uniform(180, 1500),
        eval_results=rng.random() < EVAL_RESULT_SHARE,
        groups=groups,
    )
    fault = _draw_fault(rng, job)
    episodes = _draw_episodes(rng, job, fault)
    job = Job(**{**job.__dict__, "fault": fault, "episodes": episodes})
    # Drawn on streams of their own, so that the jobs above stay as they were for the same seed.
    return Job(**{**job.__dict__, **_draw_crash_loop(job), "harmless": _draw_harmless(job)})


def _draw_crash_loop(job: Job) -> dict[str, object]:
    """Whether its crash recurs on every restart of its launcher, how many, and how fast."""
    rng = random.Random(f"crash-loop-{job.seed}")
    fault = job.fault
    share = CRASH_LOOP_SHARE.get(fault.cause, CRASH_LOOP_OTHER_SHARE) if fault is not None else 0.0
    if fault is None or fault.kind != "crash" or rng.random() >= share:
        return {}
    return {"crash_restarts": rng.choice(CRASH_LOOP_RESTARTS), "loop_cycle_s": rng.uniform(*LOOP_CYCLE_S)}


def _draw_harmless(job: Job) -> tuple[tuple[float, str, int | None], ...]:
    """The real harmless blocks it prints while it trains (none during a pause, nor once its fault struck)."""
    rng = random.Random(f"harmless-{job.seed}")
    blocks = real_lines.harmless_blocks()
    if not blocks or rng.random() >= HARMLESS_SHARE:
        return ()
    end = job.end_s if job.fault is None or not job.fault.stall else job.fault.onset_s - 2 * MINUTE
    every = rng.uniform(*HARMLESS_EVERY_S)
    printed: list[tuple[float, str, int | None]] = []
    t = job.startup_s + rng.uniform(0.2, 1.0) * every
    while t < end:
        block = rng.choice(blocks)
        host = None if block.every_rank else rng.randrange(job.hosts)
        starting = [e.start_s for e in job.episodes if e.kind in ("eval", "checkpoint") and e.start_s > t]
        at = starting[0] - 1.0 if starting and rng.random() < HARMLESS_AT_EPISODE else t
        if at < end and _episode_at(job, at) is None:
            printed.append((round(at, 3), block.name, host))
        t += every * rng.uniform(0.5, 1.5)
    return tuple(printed)


def _draw_fault(rng: random.Random, job: Job) -> Fault | None:
    gpu_hosts = [i for i, t in enumerate(job.host_types()) if t != "g5.12xlarge" or not job.groups] or [0]
    if rng.random() < SLOW_SHARE and job.hosts >= 4 and job.agent and job.step_s < 60:
        onset = rng.uniform(job.startup_s + 3600, job.duration_s - 5400)
        return Fault("slow", "GPU thermal throttling", onset, rng.choice(gpu_hosts), rng.choice(SLOW_FACTORS))
    if rng.random() >= FAULT_SHARE:
        return None
    causes = [(c, k) for c, _, k in LLAMA3_MIX if k != "slow"]
    cause, kind = rng.choices(causes, weights=[w for _, w, k in LLAMA3_MIX if k != "slow"])[0]
    if kind == "lost" and job.hosts == 1:
        kind = "crash"  # a lone host lost takes its job with it: the platform reports that, no stall to find
    latest = job.duration_s - 2 * 3600
    onset = rng.uniform(job.startup_s + 1800, max(latest, job.startup_s + 2400))
    return Fault(kind, cause, onset, rng.choice(gpu_hosts))


def _draw_episodes(rng: random.Random, job: Job, fault: Fault | None) -> tuple[Episode, ...]:
    """Checkpoints every 30 to 120 minutes, and now and then an evaluation, a data stall or a launcher restart; none
    overlapping each other or the fault's first hour."""
    episodes: list[Episode] = []
    every = rng.uniform(1800, 7200)
    declared = job.agent and rng.random() < 0.6
    t = job.startup_s + rng.uniform(600, every)
    busy_until = 0.0
    while t < job.duration_s - 600:
        if fault is not None and fault.onset_s - 3600 < t < fault.onset_s + (AFTER_ONSET_S if fault.stall else 2400):
            t += every  # a stall's first hour and a slow node's first 40 minutes are the fault's alone
            continue
        if t > busy_until:
            episode = _draw_episode(rng, job, _after_a_log_line(job, t), declared)
            episodes.append(episode)
            busy_until = episode.end_s + 300
        t += every * rng.uniform(0.9, 1.1)
    return tuple(episodes)


def _after_a_log_line(job: Job, t: float) -> float:
    """The moment after the job's first log line from `t`: checkpoints and evaluations come at a step count, as its
    log lines do."""
    every = max(1, int(job.log_every_s // MINUTE)) * MINUTE
    return (t // every + 1) * every + LOG_LINE_S + 10.0


def _draw_episode(rng: random.Random, job: Job, t: float, declared: bool) -> Episode:
    roll = rng.random()
    if roll < 0.65:  # a checkpoint: most are minutes; some run long, past their budget or past any threshold
        length = rng.uniform(60, 600) if rng.random() < 0.7 else rng.uniform(600, 2400)
        if declared:
            budget = max(300.0, length * rng.uniform(0.8, 1.6))  # some overrun their budget (within the allowance)
            return Episode("checkpoint", t, length, declared_budget_s=budget)
        if rng.random() < 0.2:  # a silent one (no line at all) is a short one: beyond minutes, it is a deadlock's twin
            return Episode("checkpoint", t, min(length, 480.0), start_line=False, end_line=False)
        return Episode("checkpoint", t, length, start_line=True, end_line=rng.random() < 0.6)
    if roll < 0.80:  # an evaluation on the GPUs, undeclared, logging nothing until it ends
        return Episode("eval", t, job.eval_s * rng.uniform(0.9, 1.1), start_line=rng.random() < 0.5)
    if roll < 0.92:  # the input pipeline stalls (a slow bucket, a throttled file system)
        return Episode("data_stall", t, rng.uniform(120, 1200), start_line=False)
    return Episode("restart", t, rng.uniform(180, 600), host=rng.randrange(job.hosts))


# --- simulating one job ----------------------------------------------------------------------------------------------

BUSY, SPIN, IDLE_HELD, EVAL, DATA_WAIT, LOADING, DEAD, GONE, STARTUP = (
    "busy",
    "spin",
    "idle_held",
    "eval",
    "data_wait",
    "loading",
    "dead",
    "gone",
    "startup",
)


@dataclass
class _Sim:
    job: Job
    rng: random.Random
    hosts: list[str]
    name: str  # the job's name as Stallwatch knows it
    streams: list[str]  # each host's log stream
    instances: dict[str, str] = field(default_factory=dict)  # a host's EC2 instance, where it is named otherwise
    step: int = 0
    last_step_t: float = 0.0
    next_step_t: float | None = None
    agent_started_t: float = 0.0
    events: list[Event] = field(default_factory=list)
    emf: list[str] = field(default_factory=list)  # each host's EMF line (the heartbeat's; its values never change)
    dumped_for: float | None = None  # the last step whose stall the agent's stall watch dumped
    # With real lines: (t, host, line) in time order, written in place of the simulator's own checkpoint and crash lines
    real: deque[tuple[float, int, str]] | None = None


def _episode_at(job: Job, t: float) -> Episode | None:
    return next((e for e in job.episodes if e.start_s <= t < e.end_s), None)


def _host_state(job: Job, t: float, host: int) -> str:
    """What host `host` does in the minute starting at `t`."""
    if t < job.startup_s:
        return STARTUP
    fault = job.fault
    if job.crash_loop and t >= fault.onset_s:  # type: ignore[union-attr]
        into = t - fault.onset_s  # type: ignore[union-attr]
        if into >= job.crash_restarts * job.loop_cycle_s + LOOP_DOWN_S:
            return DEAD  # the launcher gave up: every process exited, the job stays up
        return DEAD if into % job.loop_cycle_s < LOOP_DOWN_S else LOADING  # stopped, then restarted and loading
    if fault is not None and fault.stall and t >= fault.onset_s:
        if fault.kind == "lost" and host == fault.host:
            return GONE
        if fault.kind == "crash" and host == fault.host:
            return DEAD
        if t >= fault.onset_s + job.nccl_timeout_s:
            return DEAD  # the watchdog tore the collective down: the processes exited, the job stays up
        return SPIN  # the others wait in the collective the dead or lost rank never joins
    episode = _episode_at(job, t)
    if episode is None:
        return BUSY
    if episode.kind == "checkpoint":
        return IDLE_HELD
    if episode.kind == "eval":
        return EVAL
    if episode.kind == "data_stall":
        return DATA_WAIT
    into = t - episode.start_s
    return DEAD if into < 60 else LOADING  # restart: the launcher stops every rank, then loads the checkpoint


def simulate(job: Job, real: bool = False) -> tuple[TraceHeader, Iterator[Event]]:
    """The job's trace: the header, and its events in time order, minute by minute. `real`: its checkpoints' lines,
    its crash's last words and its watchdog lines are real ones (`corpus.real_lines`), not the simulator's."""
    rng = random.Random(job.seed)
    hosts, streams, instances = _layout(job, rng)
    sim = _Sim(job, rng, hosts, job.name, streams, instances, emf=[_emf(job.name, host) for host in hosts])
    sim.real = deque(_real_lines(job)) if real else None
    return _header(sim), _events(sim)


def _layout(job: Job, rng: random.Random) -> tuple[list[str], list[str], dict[str, str]]:
    """Where the job's platform puts it: its hosts' names, their log streams, and the EC2 instance behind a host named
    otherwise (SageMaker's algo-N and <job>/<host>-<epoch>; EC2's instances, a stream each; ParallelCluster's nodes,
    each an instance, one stream per job and node)."""
    if job.platform is Platform.SAGEMAKER:
        hosts = [f"algo-{i}" for i in range(1, job.hosts + 1)]
        return hosts, [f"{job.name}/{host}-{STREAM_EPOCH}" for host in hosts], {}
    instances = [f"i-0{rng.randrange(16**16):016x}" for _ in range(job.hosts)]
    if job.platform is Platform.EC2:
        return instances, instances, {}
    nodes = [f"gpu-st-{job.instance_type.replace('.', '')}-{i}" for i in range(1, job.hosts + 1)]
    key = slurm_key(job.name)
    streams = [stream_name(instance, key, node) for node, instance in zip(nodes, instances, strict=True)]
    return nodes, streams, dict(zip(nodes, instances, strict=True))


def _real_lines(job: Job) -> list[tuple[float, int, str]]:
    """The real lines a job writes, drawn for it (seeded by the job): its framework's checkpoint sequence (one whose
    training goes on while it saves is no pause, and left out) at each checkpoint that logs, its silent write
    stretched to the checkpoint's length; its fault's real lines."""
    rng = random.Random(f"real-lines-{job.seed}")
    framework = rng.choice([s for s in real_lines.sequences(kind="checkpoint") if s.blocking])
    if job.checkpoint_lines is not None:
        framework = next(s for s in real_lines.sequences(kind="checkpoint") if s.name == job.checkpoint_lines)
    writers = [0] if job.rank0_only_logs else list(range(job.hosts))
    lines: list[tuple[float, int, str]] = []
    for episode in job.episodes:
        if episode.kind == "checkpoint" and episode.start_line and framework.write_after is not None:
            seq = framework.stretched(episode.length_s)
            t0 = episode.start_s - (seq.lines[framework.write_after].t - seq.lines[0].t)
            lines += [(t, host, text) for t, text in seq.at(t0) for host in writers]
    if job.fault is not None and job.fault.stall:
        lines += _real_fault_lines(job, job.fault, rng)
    return sorted(lines, key=lambda line: line[0])  # stable: a sequence's order at equal times


def _real_fault_lines(job: Job, fault: Fault, rng: random.Random) -> list[tuple[float, int, str]]:
    """A crash's real last words, their first fatal line at the onset, and a real NCCL watchdog burst on each host the
    timeout tears down."""
    crashes = real_lines.sequences(kind="crash")
    timeouts = {log_patterns.NCCL_TIMEOUT}
    watchdog = next(s for s in crashes if {log_patterns.match(line.text) for line in s.lines} == timeouts)
    lines: list[tuple[float, int, str]] = []
    if fault.kind == "crash":
        sagemaker = job.platform is Platform.SAGEMAKER
        words = rng.choice([s for s in crashes if s is not watchdog and (sagemaker or s.framework != "sagemaker")])
        if job.crash_lines is not None:
            words = next(s for s in crashes if s.name == job.crash_lines)
        first_fatal = next(line.t for line in words.lines if log_patterns.match(line.text)) - words.lines[0].t
        for crash in job.crashes():  # a crash loop's rank says the same each time
            lines += [(t, fault.host, text) for t, text in words.at(crash - first_fatal)]
    timeout = fault.onset_s + job.nccl_timeout_s
    for host in range(job.hosts):
        if (fault.kind == "hang" or host != fault.host) and not job.crash_loop:
            lines += [(t, host, text) for t, text in watchdog.at(timeout + host * 0.02)]
    return lines


def _header(sim: _Sim) -> TraceHeader:
    job = sim.job
    sagemaker = job.platform is Platform.SAGEMAKER
    spec = instance_spec(job.instance_type)
    tags = {clusters.JOB_TAG: sim.name} if job.platform is Platform.EC2 else {}
    host_types = None
    if job.groups:
        host_types = dict(zip(sim.hosts, [f"ml.{t}" for t in job.host_types()], strict=True))
    return TraceHeader(
        stallwatch_trace=1,
        job=TraceJob(
            name=sim.name,
            platform=job.platform,
            instance_type=f"ml.{job.instance_type}" if sagemaker else job.instance_type,
            instance_count=job.hosts,
            gpus_per_host=spec.devices,
            vcpus_per_host=spec.vcpus,
            tags=tags,
            instance_ids=[] if sagemaker else sim.hosts,
            host_types=host_types,
            host_instances=sim.instances or None,
        ),
        scenario=f"fault-mix job: {job.fault.kind + ' (' + job.fault.cause + ')' if job.fault else 'healthy'}",
    )


def _events(sim: _Sim) -> Iterator[Event]:
    job = sim.job
    if job.platform is Platform.SAGEMAKER:
        yield StatusEvent(t=0.0, status="InProgress", secondary="Downloading")
    t = 0.0
    while t < job.end_s:
        if job.platform is Platform.SAGEMAKER and t <= job.startup_s < t + MINUTE:
            yield StatusEvent(t=job.startup_s, status="InProgress", secondary="Training")
        sim.events = []
        _minute(sim, t)
        yield from sorted((e for e in sim.events if e.t < job.end_s), key=lambda e: e.t)
        t += MINUTE
    yield EndEvent(t=job.end_s, end=True)


def _minute(sim: _Sim, t: float) -> None:
    job = sim.job
    states = [_host_state(job, t, h) for h in range(job.hosts)]
    steps = _steps(sim, t, states)
    for host, state in enumerate(states):
        _platform_metrics(sim, t, host, state)
    if job.agent:
        _agent(sim, t, states, steps)
        _stall_dumps(sim, t)
    _logs(sim, t, states, steps)


def _pace(job: Job, t: float) -> float:
    """Seconds a step takes at `t`: a slow node sets the pace of the whole job."""
    fault = job.fault
    if fault is not None and fault.kind == "slow" and t >= fault.onset_s:
        return job.step_s * fault.factor
    return job.step_s


def _steps(sim: _Sim, t: float, states: list[str]) -> list[float]:
    """Step completion times in [t, t + 60): only while every host trains."""
    if any(s != BUSY for s in states):
        sim.next_step_t = None
        return []
    pace = _pace(sim.job, t)
    if sim.next_step_t is None:
        sim.next_step_t = t + pace * sim.rng.uniform(0.5, 1.0)
    done = []
    while sim.next_step_t < t + MINUTE:
        done.append(sim.next_step_t)
        sim.next_step_t += pace * sim.rng.uniform(0.97, 1.03)
    if done:
        sim.step += len(done)
        sim.last_step_t = done[-1]
    return done


def _metric(sim: _Sim, t: float, namespace: str, name: str, dims: dict[str, str], value: float) -> None:
    datum = MetricDatum.model_construct(namespace=namespace, name=name, dimensions=dims, value=round(value, 2))
    sim.events.append(MetricEvent.model_construct(t=round(t, 3), metric=datum))


def _log(sim: _Sim, t: float, host: int, message: str) -> None:
    record = LogRecord.model_construct(stream=sim.streams[host], message=message)
    sim.events.append(LogEvent.model_construct(t=round(t, 3), log=record))


# per state: (GPU utilization %, GPU memory %, CPU %, power as a share of busy, else None: idle power)
LOOK = {
    BUSY: (96.0, 80.0, 14.0, 1.0),
    SPIN: (100.0, 80.0, 6.0, 0.28),
    IDLE_HELD: (1.5, 80.0, 28.0, None),
    EVAL: (93.0, 82.0, 12.0, 0.9),
    DATA_WAIT: (3.0, 79.0, 55.0, None),
    LOADING: (2.0, 40.0, 30.0, None),
    DEAD: (0.0, 0.0, 0.5, None),
    STARTUP: (0.0, 0.0, 5.0, None),
}


def _look(sim: _Sim, t: float, host: int, state: str) -> tuple[float, float, float, float]:
    """(GPU %, memory %, CPU %, watts per device) of a host in `state`, with noise."""
    gpu_type = GPUS.get(sim.job.host_types()[host], A100)
    util, memory, cpu, power = LOOK[state]
    rng = sim.rng
    fault = sim.job.fault
    watts = gpu_type.busy_w * power if power is not None else gpu_type.idle_w * rng.uniform(1.0, 1.3)
    if fault is not None and fault.kind == "slow" and host == fault.host and t >= fault.onset_s and state == BUSY:
        watts /= fault.factor
    noisy = lambda v, d: min(100.0, max(0.0, v + rng.uniform(-d, d))) if v else 0.0  # noqa: E731
    return (
        noisy(util, 2.5 if state != SPIN else 0.0),
        noisy(memory, 2.0),
        noisy(cpu, 1.5),
        watts * rng.uniform(0.96, 1.04),
    )


def _platform_metrics(sim: _Sim, t: float, host: int, state: str) -> None:
    if state == GONE:
        return
    job = sim.job
    util, memory, cpu, watts = _look(sim, t, host, state)
    name = sim.hosts[host]
    spec = instance_spec(job.host_types()[host])
    if job.platform is Platform.SAGEMAKER:
        dims = {"Host": f"{sim.name}/{name}"}
        ns = contract.SAGEMAKER_NAMESPACE
        _metric(sim, t, ns, "GPUUtilization", dims, util * spec.devices)
        _metric(sim, t, ns, "GPUMemoryUtilization", dims, memory * spec.devices)
        _metric(sim, t, ns, "CPUUtilization", dims, cpu * spec.vcpus)
        return
    dims = {contract.CWAGENT_DIM_INSTANCE: sim.instances.get(name, name)}
    _metric(sim, t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_UTILIZATION, dims, util)
    _metric(sim, t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_USED, dims, memory / 100 * GPU_MEMORY_MIB)
    _metric(sim, t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_TOTAL, dims, GPU_MEMORY_MIB)
    if job.ec2_power:
        _metric(sim, t, contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_POWER, dims, watts)
    _metric(sim, t, contract.EC2_NAMESPACE, "CPUUtilization", dims, cpu)


def _alive(state: str) -> bool:
    """Whether the host's training process (and so its agent) runs."""
    return state not in (DEAD, GONE, STARTUP)


def _agent(sim: _Sim, t: float, states: list[str], steps: list[float]) -> None:
    """The agent's windows ending at t + 60 + AGENT_OFFSET_S: rank 0's job metrics, every live host's host metrics."""
    job = sim.job
    end = t + MINUTE + AGENT_OFFSET_S
    episode = _episode_at(job, t)
    if episode is not None and episode.kind == "restart" and t - episode.start_s < MINUTE:
        sim.agent_started_t = episode.end_s - episode.length_s + MINUTE  # the new processes' agents
    restarted = [c + LOOP_DOWN_S for c in job.crashes()[:-1] if t <= c + LOOP_DOWN_S < t + MINUTE]
    if job.crash_loop and restarted:
        sim.agent_started_t = restarted[0]  # a crash loop's launcher started new processes (and their agents)
    for host, state in enumerate(states):
        if not (_alive(state) and _alive(_host_state(job, t + MINUTE, host))):
            continue  # a process that died in the window emits nothing at its end
        util, memory, _, watts = _look(sim, t, host, state)
        dims = {contract.DIM_JOB: sim.name, contract.DIM_HOST: sim.hosts[host]}
        _metric(sim, end, contract.NAMESPACE, "Heartbeat", dims, 1.0)
        _metric(sim, end, contract.NAMESPACE, "GPUPowerWatts", dims, watts)
        _metric(sim, end, contract.NAMESPACE, "GPUUtilization", dims, util)
        _metric(sim, end, contract.NAMESPACE, "GPUMemoryUtilization", dims, memory)
        if steps:
            local = _pace(job, t) / (job.fault.factor if _slow_other(job, t, host) else 1.0)
            _metric(sim, end, contract.NAMESPACE, "StepTime", dims, local * sim.rng.uniform(0.98, 1.02))
        _log(sim, end + 0.2, host, sim.emf[host])
    if not (_alive(states[0]) and _alive(_host_state(job, t + MINUTE, 0))):
        return  # global rank 0's process reports the job's metrics
    dims = {contract.DIM_JOB: sim.name}
    ns = contract.NAMESPACE
    last = sim.last_step_t if sim.step else sim.agent_started_t
    _metric(sim, end, ns, "Steps", dims, len(steps))
    _metric(sim, end, ns, "Step", dims, sim.step)
    _metric(sim, end, ns, "LastStepAge", dims, max(0.0, end - max(last, sim.agent_started_t)))
    if steps:
        _metric(sim, end, ns, "StepTime", dims, _pace(job, t) * sim.rng.uniform(0.98, 1.02))
        _metric(sim, end, ns, "Loss", dims, 2.0 + sim.rng.uniform(-0.05, 0.05))
        _metric(sim, end, ns, "NonFiniteLoss", dims, 0.0)
    budget = 0.0
    if episode is not None and episode.declared_budget_s is not None:
        budget = max(0.0, episode.start_s + episode.declared_budget_s - end)
    _metric(sim, end, ns, "PhaseBudgetRemaining", dims, budget)
    # Time outside step() and any declared phase waits for input: a loop blocked in a collective is inside step().
    state = states[0]
    inside = state in (BUSY, SPIN) or (episode is not None and episode.declared_budget_s is not None)
    _metric(sim, end, ns, "DataWaitFraction", dims, sim.rng.uniform(1, 6) if inside else 100.0)


# Where a rank's main thread is when the agent's stall watch dumps it, by what its host does: (file, line, function,
# source line, library) innermost first, as trainer_agent.stack_dumps writes them.
_TRAIN = ("train.py", 301, "main", "loss = train_step(model, batch)", False)
_FRAMES: dict[str, tuple[tuple[str, int, str, str, bool], ...]] = {
    SPIN: (
        ("torch/distributed/distributed_c10d.py", 2501, "all_reduce", "work.wait()", True),
        ("train.py", 212, "train_step", "dist.all_reduce(loss_sum)", False),
        _TRAIN,
    ),
    IDLE_HELD: (
        ("torch/distributed/distributed_c10d.py", 4159, "barrier", "work.wait()", True),
        ("train.py", 388, "save_checkpoint", "dist.barrier()", False),
        _TRAIN,
    ),
    EVAL: (
        ("torch/nn/modules/module.py", 1747, "_call_impl", "return forward_call(*args, **kwargs)", True),
        ("train.py", 260, "evaluate", "outputs = model(**batch)", False),
        _TRAIN,
    ),
    DATA_WAIT: (
        ("torch/utils/data/dataloader.py", 733, "__next__", "data = self._next_data()", True),
        ("train.py", 298, "main", "batch = next(loader_iter)", False),
    ),
}
_SAVING = (  # rank 0 of a checkpoint writes it while the others wait in the barrier
    ("torch/serialization.py", 943, "save", "_save(obj, opened_zipfile, pickle_module, pickle_protocol)", True),
    ("train.py", 386, "save_checkpoint", "torch.save(state, path)", False),
    _TRAIN,
)


def _stall_dumps(sim: _Sim, t: float) -> None:
    """The agent's stall watch: every live rank's stacks once per stall, written when its loop has gone without a
    step for max(3 step times, 60 s) (trainer_agent.stack_dumps), past any declared phase's budget."""
    job = sim.job
    if not sim.step or sim.last_step_t < sim.agent_started_t or sim.dumped_for == sim.last_step_t:
        return  # a (re)started process dumps only after its first step; one dump a stall
    at = sim.last_step_t + max(STALL_DUMP_STEPS * _pace(job, t), STALL_DUMP_FLOOR_S)
    episode = _episode_at(job, at)
    if episode is not None and episode.declared_budget_s is not None:
        at = max(at, episode.start_s + episode.declared_budget_s)
    if not t <= at < t + MINUTE or at >= job.end_s or (sim.next_step_t is not None and sim.next_step_t <= at):
        return
    states = [_host_state(job, at, h) for h in range(job.hosts)]
    if any(state == BUSY for state in states):
        return  # stepping again by then
    sim.dumped_for = sim.last_step_t
    world = job.hosts * RANKS_PER_HOST
    for host, state in enumerate(states):
        if not _alive(state) or state not in _FRAMES:
            continue
        for local in range(RANKS_PER_HOST):
            rank = host * RANKS_PER_HOST + local
            frames = _SAVING if state == IDLE_HELD and rank == 0 else _FRAMES[state]
            dump = StackDump(
                job=sim.name,
                host=sim.hosts[host],
                rank=rank,
                world_size=world,
                local_rank=local,
                pid=4_000 + rank,
                steps=sim.step,
                reason=STALL,
                stalled_s=round(at - sim.last_step_t, 1),
                t=STREAM_EPOCH + at,
                main=[{"file": f, "line": n, "func": fn, "code": code, "lib": lib} for f, n, fn, code, lib in frames],
                threads=[],
                thread_count=1,
                max_bytes=line_bytes(world),
            )
            _log(sim, at + rank * 0.001, host, dump.line())


def _slow_other(job: Job, t: float, host: int) -> bool:
    """Every host but a slow node computes its share faster than the pace the slow one sets."""
    fault = job.fault
    return fault is not None and fault.kind == "slow" and t >= fault.onset_s and host != fault.host


def _emf(job: str, host: str) -> str:
    """The agent's EMF line (its stdout sink), which CloudWatch Logs keeps with the training log."""
    metrics = [{"Namespace": contract.NAMESPACE, "Dimensions": [[contract.DIM_JOB, contract.DIM_HOST]]}]
    return json.dumps({"_aws": {"CloudWatchMetrics": metrics}, "JobName": job, "Host": host, "Heartbeat": 1})


def _logs(sim: _Sim, t: float, states: list[str], steps: list[float]) -> None:
    job, fault = sim.job, sim.job.fault
    loggers = [0] if job.rank0_only_logs else range(job.hosts)
    minute = int(t // MINUTE)
    every = max(1, int(job.log_every_s // MINUTE))
    if t < job.startup_s:
        if minute % 5 == 0:
            for host in range(job.hosts):
                _log(sim, t + 3 + host * 0.01, host, f"Downloading s3://corpus/shards/part-{minute:05d}.tar")
        return
    if t - MINUTE < job.startup_s <= t:
        for host in range(job.hosts):
            _log(
                sim,
                t + 1 + host * 0.01,
                host,
                f"[rank {host * 8}] initialized process group, world size {8 * job.hosts}",
            )
    for episode in job.episodes:
        if sim.real is not None and episode.kind == "checkpoint":
            continue  # its real lines are written below
        if t <= episode.start_s < t + MINUTE:
            _episode_start_lines(sim, episode)
        if t <= episode.end_s < t + MINUTE:
            _episode_end_lines(sim, episode)
    while sim.real and sim.real[0][0] < t + MINUTE:
        at, host, text = sim.real.popleft()
        _log(sim, at, host, text)
    _harmless_lines(sim, t)
    _launcher_lines(sim, t)
    for at, step in _progress_lines(sim, t, steps, minute % every == 0):
        for host in loggers:
            at += host * 0.37
            if states[host] == BUSY and _host_state(job, at, host) == BUSY:  # a rank that died or paused is silent
                _log(sim, at, host, f"[rank {host * 8}] step {step} loss 2.0{minute % 97:02d}")
    if fault is not None and fault.stall and sim.real is None:
        _fault_lines(sim, t)


def _harmless_lines(sim: _Sim, t: float) -> None:
    """The real harmless blocks it prints in the minute from `t`, on every host or on one, and trains on after."""
    blocks = {b.name: b for b in real_lines.harmless_blocks()}
    for at, name, printer in sim.job.harmless:
        if t <= at < t + MINUTE:
            for host in range(sim.job.hosts) if printer is None else (printer,):
                for i, text in enumerate(blocks[name].lines):
                    _log(sim, at + host * 0.01 + i * 0.001, host, text)


def _launcher_lines(sim: _Sim, t: float) -> None:
    """A crash loop's launcher: after each crash, its report and the restart of every rank; after the last, its
    failure."""
    job = sim.job
    crashes = job.crashes() if job.crash_loop else []
    for k, crash in enumerate(crashes):
        if not t <= crash + 1 < t + MINUTE:
            continue
        host = job.fault.host  # type: ignore[union-attr]
        left = job.crash_restarts - k
        if left == 0:
            _log(sim, crash + 1, host, CRASH_LINES["faulty GPU"][-1])  # ChildFailedError: the launcher gives up
            continue
        _log(
            sim,
            crash + 1,
            host,
            f"[WARNING] Worker group FAILED. {left}/{job.crash_restarts} attempts left; will restart worker group",
        )
        for h in range(job.hosts):
            _log(sim, crash + 20 + h * 0.01, h, f"[rank {h * 8}] Rendezvous complete; restarting from checkpoint")
            _log(sim, crash + LOOP_DOWN_S + h * 0.01, h, f"[rank {h * 8}] Loading checkpoint from s3://ckpt/latest")


def _progress_lines(sim: _Sim, t: float, steps: list[float], marked: bool) -> list[tuple[float, int]]:
    """(time, step) of the progress lines of the minute from `t`: one in each minute `marked` by the job's logging
    interval that completed a step; with steps of a minute or more, one every N steps (N steps about the logging
    interval), when the step completes, as a framework's `logging_steps` writes it."""
    job = sim.job
    if job.step_s < MINUTE:
        return [(t + LOG_LINE_S, sim.step)] if steps and marked else []
    first = sim.step - len(steps) + 1
    return [(at, first + i) for i, at in enumerate(steps) if (first + i) % job.logging_steps == 0]


def _episode_start_lines(sim: _Sim, episode: Episode) -> None:
    writers = [0] if sim.job.rank0_only_logs else range(sim.job.hosts)
    t = episode.start_s
    if episode.kind == "checkpoint" and episode.start_line:
        for host in writers:
            _log(sim, t + 0.5 + host * 0.01, host, f"[rank {host * 8}] Saving checkpoint to s3://ckpt/step-{sim.step}")
    elif episode.kind == "eval" and episode.start_line:
        _log(sim, t + 0.5, 0, "***** Running Evaluation *****")
    elif episode.kind == "restart":
        rank = episode.host * 8
        _log(sim, t, episode.host, f"[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered")
        _log(sim, t + 1, episode.host, "[WARNING] Worker group FAILED. 3/3 attempts left; will restart worker group")
        for host in range(sim.job.hosts):
            _log(sim, t + 20 + host * 0.01, host, f"[rank {host * 8}] Rendezvous complete; restarting from checkpoint")
            _log(sim, t + 60 + host * 0.01, host, f"[rank {host * 8}] Loading checkpoint from s3://ckpt/latest")


def _episode_end_lines(sim: _Sim, episode: Episode) -> None:
    if episode.kind == "eval" and sim.job.eval_results:
        _log(sim, episode.end_s + 0.5, 0, EVAL_RESULTS.format(runtime=episode.length_s))
    if episode.kind == "checkpoint" and episode.end_line:
        writers = [0] if sim.job.rank0_only_logs else range(sim.job.hosts)
        for host in writers:
            _log(sim, episode.end_s + 0.5, host, f"[rank {host * 8}] Checkpoint saved in {episode.length_s:.0f} s")


def _fault_lines(sim: _Sim, t: float) -> None:
    """The dead rank's last words at the onset; the survivors' NCCL watchdog when the timeout runs out."""
    fault = sim.job.fault
    assert fault is not None
    for crash in sim.job.crashes():
        if t <= crash < t + MINUTE:
            lines = CRASH_LINES.get(fault.cause, CRASH_LINES["faulty GPU"])
            for i, line in enumerate(lines):
                _log(sim, crash + i * 0.05, fault.host, line.format(rank=fault.host * 8))
    timeout = fault.onset_s + sim.job.nccl_timeout_s
    if t <= timeout < t + MINUTE and not sim.job.crash_loop:  # a loop's launcher tears the collective down
        for host in range(sim.job.hosts):
            if fault.kind != "hang" and host == fault.host:
                continue
            for i, line in enumerate(NCCL_LINES):
                _log(sim, timeout + host * 0.02 + i * 0.01, host, line.format(rank=host * 8))


def describe(job: Job) -> dict[str, object]:
    """A job's summary for the benchmark's report."""
    return {
        "job": job.name,
        "platform": job.platform.value,
        "hosts": job.hosts,
        "agent": job.agent,
        "days": round(job.days, 3),
        "fault": None if job.fault is None else job.fault.__dict__,
        "episodes": len(job.episodes),
    }


def onset_minutes(job: Job, t: float | None) -> float | None:
    """Minutes from the fault's onset to `t`."""
    if t is None or job.fault is None:
        return None
    return (t - job.fault.onset_s) / 60
