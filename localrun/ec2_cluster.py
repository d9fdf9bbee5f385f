"""The EC2 side of the run: a training cluster of tagged instances in moto, and what EC2 does with it.

The nodes are launched with one RunInstances, each tagged ``stallwatch:job=<job>`` and with the scenario's policy
tags, as deploy/ec2/launch.sh does; every instance's state change reaches on_job_state as EventBridge delivers it.
Their training output goes to the EC2 log group, one stream per instance id, and their GPU metrics to ``CWAgent`` by
``InstanceId`` (what deploy/ec2/cloudwatch-agent.json configures). A StopInstances sends SIGTERM to the training
processes, as an instance shutdown does. With recovery in place (`recover`), each instance is a managed node of the
moto SSM extension (`localrun.gpu_node`: its GPUs in the scenario's state), so Stallwatch's documents run on it; a
`systemctl restart` there is a restart of that host's training.

On a real node the agent reads its job from the instance's tag and its host from the instance id (instance
metadata); the demo has no instance metadata, so it passes them in the agent's variables instead.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from localrun import aws_events, moto_ssm
from localrun.gpu_node import GpuNode, NodeFault
from localrun.scenarios import EC2_INSTANCE_TYPE, EC2_STATES_READ_S, RECOVER_TAGS, Scenario
from stallwatch.core.platforms.ec2_clusters import JOB_TAG, LIVE_EC2_STATES
from stallwatch.core.signals import Platform

AMI = "ami-12c6146b"  # one of moto's built-in images
RUNNING, STOPPING, STOPPED, COMPLETED, FAILED = "InProgress", "Stopping", "Stopped", "Completed", "Failed"


class Ec2Cluster:
    """The job's instances in moto; `hosts` are their ids."""

    platform = Platform.EC2

    def __init__(self, ec2: Any, scenario: Scenario, now: float, log_group: str, nodes_dir: Path | None = None) -> None:
        """`nodes_dir`: the job recovers in place, and its nodes (their simulated tools) live there."""
        self._ec2 = ec2
        self.name = f"stallwatch-demo-{scenario.name}-{int(now)}"
        self.instance_type = EC2_INSTANCE_TYPE
        self.created_at = now
        self.log_group = log_group
        tags = {**scenario.tags, JOB_TAG: self.name, "Name": self.name} | (RECOVER_TAGS if nodes_dir else {})
        nodes = len(scenario.host_faults)
        response = ec2.run_instances(
            ImageId=AMI,
            InstanceType=self.instance_type,
            MinCount=nodes,
            MaxCount=nodes,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )
        self.hosts = sorted(i["InstanceId"] for i in response["Instances"])
        self.instance_count = len(self.hosts)
        self._finished: str | None = None  # Completed or Failed: the training ended and the nodes shut down
        self._read: tuple[float, dict[str, str]] | None = None  # the last DescribeInstances: when, and its states
        self.nodes: dict[str, GpuNode] = {}
        if nodes_dir is not None:
            for index, host in enumerate(self.hosts):
                self.nodes[host] = GpuNode(nodes_dir / host, NodeFault(scenario.node_fault(index)))
                moto_ssm.manage(host, self.nodes[host])

    def describe(self) -> str:
        return f"RunInstances {self.name}: {self.instance_count} x {self.instance_type} ({', '.join(self.hosts)})"

    def log_place(self, host: str) -> tuple[str, str]:
        """The CloudWatch agent's log group and stream ({instance_id}) for `host`."""
        return self.log_group, host

    def training_env(self, host: str) -> dict[str, str]:
        """What the agent would read from instance metadata: the job tag and the instance id."""
        return {"STALLWATCH_JOB_NAME": self.name, "SM_CURRENT_HOST": host}

    def start(self, t: float) -> list[dict[str, Any]]:
        """The instances are running: one state-change event each."""
        return [aws_events.instance_state_change(host, "running", t) for host in self.hosts]

    def status(self) -> tuple[str, str]:
        """InProgress while a node runs; Stopping once a StopInstances reached all of them."""
        states = self._states()
        if set(states.values()) & LIVE_EC2_STATES:
            return RUNNING, "running"
        return STOPPING, ", ".join(f"{h}: {s}" for h, s in sorted(states.items()))

    def stopped_nodes(self) -> list[str]:
        """The nodes a StopInstances reached while others run (a bad node taken out)."""
        return sorted(h for h, s in self._states().items() if s not in LIVE_EC2_STATES)

    def restart_requests(self) -> list[str]:
        """The nodes where `systemctl restart stallwatch-train.service` ran since the last look."""
        return [host for host, node in sorted(self.nodes.items()) if node.take_restart_request()]

    def node_stopped(self, host: str, t: float) -> list[dict[str, Any]]:
        """One node's state-change event once its training process is gone."""
        return [aws_events.instance_state_change(host, self._states()[host], t)]

    def stopped(self, t: float) -> list[dict[str, Any]]:
        """The training processes are gone after a StopInstances: the instances report stopped."""
        return [aws_events.instance_state_change(host, state, t) for host, state in self._states().items()]

    def finish(self, failed: bool, t: float) -> list[dict[str, Any]]:
        """Every training process exited on its own: the nodes shut down (the launcher's last step)."""
        self._finished = FAILED if failed else COMPLETED
        self._ec2.stop_instances(InstanceIds=self.hosts)
        self._read = None
        return self.stopped(t)

    def final_status(self) -> str:
        return self._finished or (STOPPED if self.status()[0] != RUNNING else RUNNING)

    def _states(self) -> dict[str, str]:
        """Each instance's state, read with one DescribeInstances at most every `EC2_STATES_READ_S`: the run's
        supervisor looks several times a tick, and moto's EC2 answers are dear."""
        now = time.monotonic()
        if self._read is None or now - self._read[0] >= EC2_STATES_READ_S:
            reservations = self._ec2.describe_instances(InstanceIds=self.hosts)["Reservations"]
            self._read = now, {i["InstanceId"]: i["State"]["Name"] for r in reservations for i in r["Instances"]}
        return self._read[1]
