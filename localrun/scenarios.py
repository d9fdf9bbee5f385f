"""The demo's scenarios and its compressed clock: what goes wrong, when, and what must happen.

Time is compressed only through the job's policy tags and high-resolution alarm periods; the
engine runs unchanged. Every other timing constant of the local run lives here too.

    scenario = SCENARIOS["hang"]
    scenario.train_args(0)  # ["--steps", "0", "--interval", "2.0", "--fault", "hang", "--fault-after", "600", ...]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from stallwatch.core.platforms.ec2_recovery import MIN_NODES_TAG
from stallwatch.core.policy import MODE_TAG, RECOVER_REQUEUE, RECOVER_RESTART, RECOVER_TAG, STOP_OPT_IN_VALUE
from stallwatch.core.pricing import instance_spec

DEMO_ALARM_PERIOD_S = 10  # high-resolution alarms; also the deployment's period, which the signals are read at
# The job's policy overrides (tags), so a stall is decided in seconds instead of minutes.
COMPRESSED_TAGS: dict[str, str] = {
    MODE_TAG: STOP_OPT_IN_VALUE,
    "stallwatch:alarm-period-seconds": str(DEMO_ALARM_PERIOD_S),
    "stallwatch:stall-minutes": "0.5",
    "stallwatch:stop-grace-minutes": "0.25",
    "stallwatch:idle-minutes": "0.5",
    "stallwatch:log-silence-minutes": "0.5",
    "stallwatch:phase-overrun-minutes": "0.25",
    "stallwatch:crash-confirm-minutes": "0.25",
    "stallwatch:startup-grace-minutes": "1",
}

AGENT_INTERVAL_S = 2.0  # the agent's emission window (high-resolution PutMetricData)
STACK_DUMP_AFTER_S = 5.0  # the agent writes every thread's stack this long into a stall (its floor: 60 s)
HOST_METRICS_INTERVAL_S = 2.0  # how often the simulated SageMaker host metrics are published
LOG_FLUSH_INTERVAL_S = 1.0  # how often stdout is shipped to CloudWatch Logs
CONTROL_TICK_S = 2.0  # how often the local alarm evaluator looks at the metrics
EC2_STATES_READ_S = 1.0  # how stale the run's view of its EC2 instances' states may be (a StopInstances seen within it)
SWEEPER_INTERVAL_S = 10.0  # the sweeper's compressed schedule (the stack runs it every few minutes)
SIGTERM_GRACE_S = 15.0  # SageMaker waits 120 s after SIGTERM before SIGKILL; the demo waits less
TRAINING_THREADS = 1  # torch threads per training process, so the control plane keeps a core on two-core machines
TRAINING_BATCH = 2  # sequences a step (the example's default is 8): a third of the CPU a step, the same model and steps
RUN_DEADLINE_S = 160.0  # the whole run, from job creation; past it the run fails (the budget is 3 min)

# The simulated platform: p4d hosts, and what a stalled run would otherwise have burned.
INSTANCE_TYPE = "ml.p4d.24xlarge"
EC2_INSTANCE_TYPE = "p4d.24xlarge"  # --platform ec2: the same hosts as plain EC2 instances
EC2_MIN_NODES = 2  # --platform ec2 runs a cluster: a one-host scenario's fault on each of this many nodes
GPUS_PER_HOST = instance_spec(INSTANCE_TYPE).devices
VCPUS_PER_HOST = instance_spec(INSTANCE_TYPE).vcpus
MAX_RUNTIME_S = 24 * 3600  # SageMaker's default StoppingCondition; a stalled job holds its GPUs until then
HEALTHY_STEPS = 250  # steps before the fault (~10-30 ms each on two CPU cores, at TRAINING_BATCH)
STEPS_AFTER_CHECKPOINT = 100  # the checkpoint scenario trains on after its checkpoint, then completes
LOG_EVERY_STEPS = 20  # the training's progress line
# --resume: the job opts in to one restart and checkpoints every 100 steps (to CheckpointConfig's local path);
# the hang at step 250 is resumed from step 200, which redoes 50 steps and trains on to 350, then completes.
RESUME_TAGS = {"stallwatch:resume": "1"}
CHECKPOINT_EVERY_STEPS = 100
CHECKPOINT_BEFORE_FAULT = HEALTHY_STEPS // CHECKPOINT_EVERY_STEPS * CHECKPOINT_EVERY_STEPS  # where a restart goes on
STEPS_AFTER_RESUME = 100
CHECKPOINT_S3_URI = "s3://stallwatch-demo/checkpoints"
RESUME_DEADLINE_S = 300.0  # two jobs: the hang stopped, then the resumed job to completion
# --recover restart: the EC2 job opts in to recovery in place; its training restarts from its checkpoint (step 200)
# on the nodes that pass the health check, and completes at step 350. Its first step must come within the startup
# grace of the restart: 3 minutes, for a busy machine's Python and torch start-up (the job's other timings: above).
RECOVER_TAGS = {RECOVER_TAG: RECOVER_RESTART, "stallwatch:startup-grace-minutes": "3"}
RECOVER_DEADLINE_S = 300.0  # the hang, the health check, the restart and the training to completion
# --recover requeue: the Slurm job opts in to recovery by requeue (a node drained only where a hardware signal blames
# it), and Slurm runs it again from its checkpoint (step 200) to step 350 (the startup grace as for a restart in place).
REQUEUE_TAGS = {RECOVER_TAG: RECOVER_REQUEUE, "stallwatch:startup-grace-minutes": "3"}
# The goodput report's period: the shortest CloudWatch takes (1, 5, 10, 20, 30 or a multiple of 60, MetricStat.Period)
# that holds whole agent windows.
REPORT_PERIOD_S = 5


class HostActivity(StrEnum):
    """What a simulated host is doing, which decides the host metrics SageMaker would publish."""

    TRAINING = "training"  # GPUs 90-99 % per device
    HUNG = "hung"  # NCCL hang: GPUs pinned at 100 %, one spinning core per rank
    IDLE = "idle"  # nothing to compute: GPUs ~0 %, memory still allocated
    CHECKPOINT = "checkpoint"  # writing a checkpoint: GPUs ~0 %, CPU and disk busy
    EXITED = "exited"  # the training process is gone: GPUs idle, their memory released


# How a host looks while its process is in each fault (examples/train_gpt.py --fault).
FAULT_ACTIVITY: dict[str, HostActivity] = {
    "hang": HostActivity.HUNG,
    "idle": HostActivity.IDLE,
    "checkpoint": HostActivity.CHECKPOINT,
    "crash": HostActivity.EXITED,
}


@dataclass(frozen=True)
class Scenario:
    """One demo run: the fault each host's training injects, and the outcome that makes the run pass."""

    name: str
    summary: str
    host_faults: tuple[str, ...]  # examples/train_gpt.py --fault, one training process per host (algo-1, ...)
    expect_stop: bool
    node_faults: tuple[str, ...] = ()  # EC2: each node's hardware fault (localrun.gpu_node.NodeFault); none: healthy
    steps: int = 0  # 0: train until stopped
    extra_args: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=lambda: dict(COMPRESSED_TAGS))

    @property
    def hosts(self) -> list[str]:
        return [f"algo-{i}" for i in range(1, len(self.host_faults) + 1)]

    def as_cluster(self) -> Scenario:
        """The scenario on an EC2 cluster: a one-host scenario's fault on each of `EC2_MIN_NODES` nodes."""
        if len(self.host_faults) >= EC2_MIN_NODES:
            return self
        return replace(self, host_faults=self.host_faults * EC2_MIN_NODES, node_faults=self.node_faults * EC2_MIN_NODES)

    def node_fault(self, host_index: int) -> str:
        """The hardware fault of node `host_index` (0-based) that its health check finds ("none": healthy)."""
        return self.node_faults[host_index] if host_index < len(self.node_faults) else "none"

    @property
    def resumable(self) -> bool:
        """Whether Stallwatch resumes this scenario's stop (a hang or a crashed rank; idle means the work is done)."""
        return self.expect_stop and self.name in RESUMABLE_SCENARIOS

    def train_args(self, host_index: int, checkpoint_dir: str | None = None, resumed: bool = False) -> list[str]:
        """The training script's arguments on host `host_index` (0-based); with `checkpoint_dir`, it checkpoints
        there; `resumed`, it is the resumed job, which goes on from the checkpoint without a fault and completes."""
        args = [
            "--steps",
            str(HEALTHY_STEPS + STEPS_AFTER_RESUME if resumed else self.steps),
            "--interval",
            str(AGENT_INTERVAL_S),
            "--fault",
            "none" if resumed else self.host_faults[host_index],
            "--fault-after",
            str(HEALTHY_STEPS),
            "--log-every",
            str(LOG_EVERY_STEPS),
            "--dump-after",
            str(STACK_DUMP_AFTER_S),
            "--batch-size",
            str(TRAINING_BATCH),
            *self.extra_args,
        ]
        if checkpoint_dir is not None:
            args += ["--checkpoint-dir", checkpoint_dir, "--checkpoint-every", str(CHECKPOINT_EVERY_STEPS)]
        return args


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="hang",
            summary="an NCCL-style hang: no step completes while the GPUs stay pinned at 100 %",
            host_faults=("hang",),
            expect_stop=True,
        ),
        Scenario(
            name="crash",
            summary="algo-2 dies of a CUDA error; algo-1 spins in the collective it will never complete",
            host_faults=("hang", "crash"),
            expect_stop=True,
        ),
        Scenario(
            name="idle",
            summary="the GPUs go idle: no step, no log line, while the instances stay up",
            host_faults=("idle",),
            expect_stop=True,
        ),
        Scenario(
            name="xid",
            summary="an NCCL hang on 2 nodes; the second one's GPU fell off the bus (Xid 79): with --recover restart "
            "on EC2 it is taken out (the job may train on 1: stallwatch:min-nodes=1), the other restarts in place",
            host_faults=("hang", "hang"),
            node_faults=("none", "xid"),
            expect_stop=True,
            tags=COMPRESSED_TAGS | {MIN_NODES_TAG: "1"},
        ),
        Scenario(
            name="checkpoint",
            summary="a 45 s checkpoint, longer than the stall threshold but within its declared 60 s budget: no stop",
            host_faults=("checkpoint",),
            expect_stop=False,
            steps=HEALTHY_STEPS + STEPS_AFTER_CHECKPOINT,
            extra_args=("--checkpoint-seconds", "45", "--checkpoint-budget", "60"),
        ),
    )
}
DEFAULT_SCENARIO = "hang"
RESUMABLE_SCENARIOS = frozenset({"hang", "crash", "xid"})
