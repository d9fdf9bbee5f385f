"""End to end on moto: a Trainium job (ml.trn1.32xlarge, trn1.32xlarge) whose only accelerator witnesses are the
agent's, from neuron-monitor and the Neuron driver: they reach the engine's signals, its host alarms, and decide a
hang as a GPU job's do."""

from __future__ import annotations

import json

from handlers import on_alarm, on_job_state, sweeper
from localrun.moto_world import MINUTE, World, alarm_event, instance_state_event, scheduled_event
from stallwatch.core import alarms, contract
from stallwatch.core.measures import agent_power, gpu_memory, gpu_util
from stallwatch.core.signals import Platform
from tests.agent.test_neuron import (
    TRN1_ERA_NEURONCORE_COUNTERS,
    TRN1_IDLE_POWER,
    TRN2_HARDWARE_INFO,
    TRN2_RUNTIME_USED_BYTES,
    report,
    sysfs,
)
from trainer_agent import CloudWatchSink, Window
from trainer_agent.contract import SCOPE_HOST
from trainer_agent.neuron import read_power, read_report
from trainer_agent.window import AcceleratorReading, WindowTotals, host_metrics

JOB = "llama-trn1"
TRN1 = "ml.trn1.32xlarge"
ENFORCE = {"stallwatch:mode": "enforce"}


def publish_host_window(world: World, job: str, host: str, t: float, reading: AcceleratorReading) -> None:
    """The agent's host window of `reading`, as its CloudWatch sink puts it."""
    window = Window(SCOPE_HOST, t, job, host, 0, 60.0, host_metrics(WindowTotals(), reading))
    sink = CloudWatchSink(client=world.clients.cloudwatch)
    world.clients.cloudwatch.put_metric_data(Namespace=contract.NAMESPACE, MetricData=sink.datums(window))


def seed_neuron_hang(world: World, job: str, hosts: list[str]) -> None:
    """Steps stop 40 min ago; every NeuronCore stays pinned while the devices' power falls; logs go quiet."""
    world.steps_until(job, last_step_min=40)
    for host in hosts:
        world.agent_host(job, host, "AcceleratorUtilization", world.every_minute(110, 100.0))
        world.agent_host(job, host, "AcceleratorMemoryUtilization", world.every_minute(110, 62.0))
        world.agent_host(job, host, "AcceleratorPowerPercent", world.every_minute(110, lambda m: 60 if m > 40 else 15))


def test_a_trainium_hosts_neuroncore_readings_reach_the_engines_signals(rt, world, tmp_path) -> None:
    # Given a SageMaker trn1 job whose agent read neuron-monitor's report and the driver's power on algo-1
    world.create_job(JOB, hosts=1, instance_type=TRN1)
    neuron = read_report(report(TRN2_HARDWARE_INFO, TRN1_ERA_NEURONCORE_COUNTERS, TRN2_RUNTIME_USED_BYTES))
    power = read_power(sysfs(tmp_path, "NCv2", [TRN1_IDLE_POWER, "POWER_STATUS_VALID,1789180860,0.86,25.00,18.86"]))
    reading = AcceleratorReading(neuron.utilization, neuron.memory_utilization, power_percent=power)
    for minutes in (3, 2):
        publish_host_window(world, JOB, "algo-1", world.now - minutes * MINUTE, reading)

    # When the control plane reads the job's signals
    host = rt.source(Platform.SAGEMAKER).job_signals(JOB, world.now).hosts["algo-1"]

    # Then the NeuronCores' utilization, memory and power are the host's witnesses, as a GPU's would be
    assert gpu_util(host).latest() == neuron.utilization
    assert gpu_memory(host).latest() == neuron.memory_utilization
    assert agent_power(host) == (host.agent["AcceleratorPowerPercent"], "%")
    assert host.agent["AcceleratorPowerPercent"].latest() == power


def test_a_sagemaker_trainium_job_hung_in_a_collective_is_stopped_on_its_neuroncores(rt, world, slack, context) -> None:
    # Given an enforced trn1 job: no step for 40 minutes, its NeuronCores pinned and its devices' power fallen
    world.create_job(JOB, hosts=2, instance_type=TRN1, tags=ENFORCE)
    seed_neuron_hang(world, JOB, ["algo-1", "algo-2"])

    # When its progress alarm fires, and the sweeper runs after the stop grace
    name = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", JOB, alarms.PROGRESS)
    warned = on_alarm.handler(alarm_event(name), context)
    rt.clock.advance(6 * MINUTE)
    (stopped,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then it is a hang read from the NeuronCores, stopped, and Slack shows their power in % of its maximum
    assert (warned["diagnosis"], warned["action"]) == ("hang", "warn")
    assert "a collective spins on every host" in str(slack.posts[0]["blocks"])
    assert (stopped["action"], stopped["stopped"]) == ("stop", True)
    assert "60% of max before -&gt; 15% of max now" in str(slack.posts[-1]["blocks"])


def test_an_ec2_trainium_hosts_idle_alarm_reads_the_agents_neuroncore_utilization(rt, world, context) -> None:
    # Given a trn1.32xlarge instance of a job, which the CloudWatch agent publishes no NVIDIA metric for
    (instance,) = world.launch(1, {"stallwatch:job": JOB} | ENFORCE, instance_type="trn1.32xlarge")

    # When it starts and its alarms are put
    on_job_state.handler(instance_state_event(instance, "running"), context)

    # Then its idle and memory alarms read the agent's NeuronCore metrics of that host
    described = rt.clients.cloudwatch.describe_alarms(AlarmNamePrefix=rt.config.alarm_prefix)["MetricAlarms"]
    read = {
        json.dumps(query["MetricStat"]["Metric"], sort_keys=True)
        for alarm in described
        if alarms.GPU_IDLE in alarm["AlarmName"] or alarms.GPU_MEMORY in alarm["AlarmName"]
        for query in alarm["Metrics"]
        if "MetricStat" in query
    }
    host = [{"Name": contract.DIM_JOB, "Value": JOB}, {"Name": contract.DIM_HOST, "Value": instance}]
    assert read == {
        json.dumps({"Namespace": contract.NAMESPACE, "MetricName": name, "Dimensions": host}, sort_keys=True)
        for name in ("AcceleratorUtilization", "AcceleratorMemoryUtilization")
    }
