"""The Slurm side of the local run: a real Slurm of three nodes on this machine, as a ParallelCluster would stand in
AWS (moto): each node an EC2 instance with the node's address in the controller's VPC (the CloudWatch agent's GPU
metrics by InstanceId, what deploy/slurm/cloudwatch-agent.json configures), and on the controller Stallwatch's runner
(deploy/slurm/stallwatch-runner), which pulls its commands from the deployment's table and runs them on this Slurm.

deploy/slurm/stallwatch-events.sh is PrologSlurmctld and EpilogSlurmctld (its PutEvents kept in a spool,
`localrun.slurm_events`), stallwatch-prolog.sh each node's Prolog; each node's output goes through
deploy/slurm/stallwatch-log.sh to the file the Prolog made for the job, which `NodeLog` ships as the CloudWatch agent
would, one stream each, named by the node's instance.

    cluster = SlurmCluster(aws, root, log_group, table, timeline, on_error)
    with cluster:                          # daemons up, instances in moto, the runner polling the table
        job = cluster.submit(scenario, requeue=True, checkpoint_dir=...)
        cluster.events()                   # deploy/slurm's events, as EventBridge delivers them
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from localrun import request_log
from localrun.host_metrics import HostMetricsSimulator
from localrun.host_run import FAULT_MARKER, FAULT_OVER_MARKER, RESUMED_MARKER, TRAIN_SCRIPT, parse_progress
from localrun.local_aws import LocalAws
from localrun.log_shipper import LogShipper
from localrun.periodic import Periodic
from localrun.scenarios import (
    EC2_INSTANCE_TYPE,
    FAULT_ACTIVITY,
    HOST_METRICS_INTERVAL_S,
    TRAINING_THREADS,
    HostActivity,
    Scenario,
)
from localrun.slurm_daemons import SlurmDaemons, free_port
from localrun.slurm_events import EventSpool
from localrun.slurm_runner import RunnerProcess
from localrun.timeline import Kind, Timeline
from stallwatch.core.platforms.slurm import log_key, slurm_job_name, stream_name
from stallwatch.core.signals import Platform

CLUSTER = "demo"  # Slurm's ClusterName: jobs are named demo-<id>-<name>
NODES = 3  # a 2-node job and a spare
JOB_NODES = 2
JOB_NAME = "llm"
FLAVOR = "parallelcluster"
AMI = "ami-12c6146b"  # one of moto's built-in images
SUBNET = "127.0.0.0/24"  # the nodes' addresses (`SlurmDaemons.address`)
CONTROLLER_TYPE = "c5.xlarge"
# Environment a training task must not inherit from the demo (the demo's own AWS setup is passed explicitly).
_DROPPED_ENV = ("AWS_PROFILE", "TRAINING_JOB_NAME", "STALLWATCH_JOB_NAME", "SM_CURRENT_HOST")


class NodeLog:
    """One node's output file of one attempt: shipped to its stream as the CloudWatch agent does, and read for what
    the node does (its progress, its fault) to drive its simulated GPU metrics."""

    def __init__(self, path: Path, logs: Any, group: str, stream: str, node: str, timeline: Timeline, on_error: Any):
        self.path = path
        self.node = node
        self._timeline = timeline
        self._offset = 0
        self._partial = ""
        self.fault: str | None = None
        self.fault_over = False
        self.shipper = LogShipper(logs, group, stream, on_error)
        self._started = False

    def read(self, t: float) -> None:
        """Ship what the file gained since the last look (complete lines only)."""
        if not self.path.exists():
            return
        if not self._started:
            with contextlib.suppress(Exception):  # the stream of a requeued attempt's node exists already
                self.shipper.start()
            self._started = True
        with self.path.open(errors="replace") as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        *lines, self._partial = (self._partial + chunk).split("\n")
        for line in lines:
            self.shipper.add(t, line)
            self._on_line(t, line)

    def _on_line(self, t: float, line: str) -> None:
        progress = parse_progress(t, line)
        if progress is not None:
            self._timeline.set_progress(progress)
        elif line.startswith(FAULT_MARKER):
            self.fault = line.split()[1]
            self._timeline.mark_fault_onset(t)
            self._timeline.event(Kind.FAULT, f"{self.node}: {line}")
        elif line.startswith((RESUMED_MARKER, FAULT_OVER_MARKER)):
            self.fault_over = line.startswith(FAULT_OVER_MARKER)
            self._timeline.event(Kind.TRAIN, f"{self.node}: {line}")

    def stop(self) -> None:
        if self._started:
            self.shipper.stop()


class SlurmCluster:
    """The daemons, the nodes' instances and metrics, the controller, the job's files (under `root`)."""

    platform = Platform.SLURM

    def __init__(
        self, aws: LocalAws, root: Path, log_group: str, table: str, timeline: Timeline, on_error: Any
    ) -> None:
        self.aws = aws
        self.root = root
        self.log_group = log_group
        self.table = table
        self.timeline = timeline
        self.on_error = on_error
        self.logs_dir = root / "logs"
        self.spool = EventSpool(root / "events", ssm_target="", platform=FLAVOR, log_dir=self.logs_dir)
        self.daemons: SlurmDaemons | None = None
        self.runner: RunnerProcess | None = None
        self.instances: dict[str, str] = {}  # node -> instance id
        self.controller = ""
        self.node_logs: dict[str, NodeLog] = {}  # "<job>.<node>" file -> its log
        self.activity: dict[str, HostActivity] = {}  # node -> what its GPUs do now
        self._metrics: Periodic | None = None
        self.job_id: str | None = None
        self.task_pids: dict[str, int] = {}  # the training tasks seen, "<job>/<restarts>/<pid>" -> pid
        self.job_name = ""
        self.instance_type = EC2_INSTANCE_TYPE

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        ec2 = self.aws.client("ec2")
        subnet = self._subnet(ec2)
        self.controller = self._launch(ec2, 1, CONTROLLER_TYPE, {"parallelcluster:node-type": "HeadNode"}, subnet)[0]
        self.spool.settings["STALLWATCH_SSM_TARGET"] = self.controller
        script = self.spool.install(self.root / "slurm" / "slurm.conf")
        self.daemons = SlurmDaemons(
            self.root / "slurm",
            nodes=NODES,
            cluster=CLUSTER,
            prolog=script,
            epilog=script,
            node_prolog=self.spool.node_prolog,
        )
        self.daemons.__enter__()
        self.runner = RunnerProcess(self.daemons, self.aws.env, self.table).__enter__()
        for node in self.daemons.nodes:
            tags = {"parallelcluster:cluster-name": CLUSTER, "parallelcluster:node-type": "Compute"}
            [instance] = self._launch(ec2, 1, EC2_INSTANCE_TYPE, tags, subnet, self.daemons.address(node))
            self.instances[node] = instance
            self.activity[node] = HostActivity.IDLE
        cloudwatch = self.aws.client("cloudwatch")
        simulators = [
            HostMetricsSimulator(
                cloudwatch, "", instance, lambda n=node: self.activity[n], seed=i, platform=Platform.EC2
            )
            for i, (node, instance) in enumerate(self.instances.items())
        ]

        def publish() -> None:
            for simulator in simulators:
                simulator.publish()
            self.timeline.set_gpu_util(simulators[0].last_gpu_per_device)  # node1's, where the job's rank 0 runs

        self._metrics = Periodic("node-metrics", HOST_METRICS_INTERVAL_S, publish, self.on_error)
        self._metrics.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._metrics is not None:
            self._metrics.stop()
        for log in self.node_logs.values():
            log.stop()
        if self.runner is not None:
            self.runner.stop()
        if self.daemons is not None:
            self.daemons.stop()

    def _subnet(self, ec2: Any) -> str:
        vpc = ec2.create_vpc(CidrBlock="127.0.0.0/16")["Vpc"]["VpcId"]
        return str(ec2.create_subnet(VpcId=vpc, CidrBlock=SUBNET)["Subnet"]["SubnetId"])

    def _launch(
        self, ec2: Any, count: int, instance_type: str, tags: dict[str, str], subnet: str | None = None, ip: str = ""
    ) -> list[str]:
        placement = {"SubnetId": subnet} | ({"PrivateIpAddress": ip} if ip else {}) if subnet else {}
        response = ec2.run_instances(
            ImageId=AMI,
            InstanceType=instance_type,
            MinCount=count,
            MaxCount=count,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
            **placement,
        )
        return [i["InstanceId"] for i in response["Instances"]]

    # ---- the job ----------------------------------------------------------------------------------------------

    def submit(self, scenario: Scenario, settings: dict[str, str], checkpoint_dir: str, aws_env: dict[str, str]) -> str:
        """sbatch the scenario's training on 2 nodes: srun, each task through deploy/slurm's log wrapper, the
        job's stallwatch:* settings in its comment; a requeued attempt goes on from the checkpoint without a fault."""
        assert self.daemons is not None
        first = {rank: scenario.train_args(rank, checkpoint_dir) for rank in range(JOB_NODES)}
        again = scenario.train_args(0, checkpoint_dir, resumed=True)
        script = self.root / "job.sh"
        cases = "\n".join(f"    {rank}) set -- {shlex.join(args)} ;;" for rank, args in first.items())
        script.write_text(
            "#!/bin/sh\n"
            "# one task per node: the fault by rank on the first attempt; from the checkpoint after a requeue\n"
            f"exec srun {shlex.quote(str(self.spool.log_wrapper))} sh -c '\n"
            '  if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then\n'
            f"    set -- {shlex.join(again)}\n"
            "  else\n"
            '    case "$SLURM_PROCID" in\n'
            f"{cases}\n"
            "    esac\n"
            "  fi\n"
            f'  exec {shlex.quote(sys.executable)} {shlex.quote(str(TRAIN_SCRIPT))} "$@"\n'
            "'\n"
        )
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV} | aws_env
        env |= {
            "STALLWATCH_SLURM_LOG_DIR": str(self.logs_dir),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TRAIN_SCRIPT.parent.parent), env.get("PYTHONPATH")])),
            "OMP_NUM_THREADS": str(TRAINING_THREADS),
            "MKL_NUM_THREADS": str(TRAINING_THREADS),
        }
        comment = " ".join(f"{k}={v}" for k, v in sorted(settings.items()))
        self.job_id = self.daemons.sbatch(
            [
                f"--nodes={JOB_NODES}",
                f"--job-name={JOB_NAME}",
                f"--comment={comment}",
                f"--chdir={self.root}",
                f"--output={self.root / 'slurm-%j.out'}",
                str(script),
            ],
            env=request_log.child_env(env),
        )
        self.job_name = slurm_job_name(CLUSTER, self.job_id, JOB_NAME)
        return self.job_id

    def job(self) -> dict[str, str]:
        assert self.daemons is not None
        assert self.job_id is not None
        return self.daemons.job(self.job_id)

    def events(self) -> list[dict[str, Any]]:
        return self.spool.take()

    def follow(self, t: float, fields: dict[str, str]) -> None:
        """Ship the nodes' new lines, and set what each node's GPUs do from what its training said (`fields`: the
        job as scontrol shows it now)."""
        assert self.daemons is not None
        key = log_key(CLUSTER, self.job_id or "")
        for path in sorted(self.logs_dir.glob(f"{key}.*.log")):
            node = path.name.removeprefix(f"{key}.").removesuffix(".log")
            log = self.node_logs.get(path.name)
            if log is None:
                stream = stream_name(self.instances[node], key, node)
                log = NodeLog(path, self.aws.client("logs"), self.log_group, stream, node, self.timeline, self.on_error)
                self.node_logs[path.name] = log
            log.read(t)
        for pid, command in self.daemons.processes(TRAIN_SCRIPT.name).items():
            # the task, not srun or its wrappers; by its attempt when first seen (a requeued one's ends after it)
            if command.startswith(f"{sys.executable} {TRAIN_SCRIPT}") and pid not in self.task_pids.values():
                self.task_pids[f"{self.job_name}/{fields.get('Restarts', '0')}/{pid}"] = pid
        running = fields.get("JobState") == "RUNNING" and bool(fields.get("NodeList"))
        nodes = set(self.daemons.hostnames(fields["NodeList"])) if running else set()
        requeued = int(fields.get("Restarts", "0") or 0) > 0  # a requeued attempt trains on without a fault
        for node in self.instances:
            log = self.node_logs.get(f"{key}.{node}.log")
            if node not in nodes:
                self.activity[node] = HostActivity.EXITED if log else HostActivity.IDLE
            elif log is not None and log.fault and not log.fault_over and not requeued:
                self.activity[node] = FAULT_ACTIVITY[log.fault]
            else:
                self.activity[node] = HostActivity.TRAINING

    def drained(self) -> dict[str, str]:
        """The nodes drained (or failed), with their reasons."""
        assert self.daemons is not None
        found = {}
        for node in self.daemons.nodes:
            fields = self.daemons.node(node)
            if "DRAIN" in fields.get("State", "") or "FAIL" in fields.get("State", ""):
                found[node] = fields.get("Reason", "")
        return found
