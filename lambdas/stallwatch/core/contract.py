"""The agent's metric names as the control plane reads them.

Mirrors ``trainer_agent/contract.py`` (the control plane never imports the agent);
``tests/test_contract.py`` fails if the two drift apart.
"""

from __future__ import annotations

NAMESPACE = "Stallwatch"
DIM_JOB = "JobName"
DIM_HOST = "Host"

JOB_METRICS: dict[str, str] = {
    "Steps": "Count",
    "Step": "None",
    "LastStepAge": "Seconds",
    "StepTime": "Seconds",
    "TokensPerSecond": "Count/Second",
    "SamplesPerSecond": "Count/Second",
    "TFLOPsPerAccelerator": "None",
    "TFLOPsPerGPU": "None",
    "MFU": "Percent",
    "DataWaitFraction": "Percent",
    "Loss": "None",
    "NonFiniteLoss": "Count",
    "PhaseBudgetRemaining": "Seconds",
    "ETA": "Seconds",
}

HOST_METRICS: dict[str, str] = {
    "Heartbeat": "Count",
    "AcceleratorPowerWatts": "None",
    "AcceleratorPowerPercent": "Percent",
    "AcceleratorUtilization": "Percent",
    "AcceleratorMemoryUtilization": "Percent",
    "GPUPowerWatts": "None",
    "GPUUtilization": "Percent",
    "GPUMemoryUtilization": "Percent",
    "StepTime": "Seconds",
}

# Renamed for accelerators that are not GPUs (old name -> new name): read from an older agent for one release.
RENAMED_METRICS: dict[str, str] = {
    "TFLOPsPerGPU": "TFLOPsPerAccelerator",
    "GPUPowerWatts": "AcceleratorPowerWatts",
    "GPUUtilization": "AcceleratorUtilization",
    "GPUMemoryUtilization": "AcceleratorMemoryUtilization",
}

# The agent's stack dump (trainer_agent.stack_dumps): one JSON line per rank and stall, its first key this marker
# (`stacks`).
STACKS_MARKER = "StallwatchStacks"
STACKS_VERSION = 1
STACKS_READ_BYTES = 2_800_000  # a decision reads this much of one stall's dumps (aws.stack_dump_reads)

# Published by the control plane itself (sweeper), per host, from log-stream freshness.
LOG_IDLE_SECONDS = "LogIdleSeconds"

# deploy/slurm/stallwatch-events.sh's EventBridge events (one per Slurm job start and end): the rule's pattern.
SLURM_EVENT_SOURCE = "stallwatch.slurm"
SLURM_EVENT_DETAIL_TYPE = "Slurm Job State Change"

# AWS Health's EventBridge events of EC2's scheduled changes (retirement, reboot, stop, maintenance of an instance):
# the rule's pattern (stacks.health_events), and what on_health_event reads (aws.health_events).
HEALTH_EVENT_SOURCE = "aws.health"
HEALTH_EVENT_DETAIL_TYPE = "AWS Health Event"
HEALTH_EVENT_SERVICE = "EC2"
HEALTH_SCHEDULED_CATEGORY = "scheduledChange"

# Where the platforms publish host metrics.
SAGEMAKER_NAMESPACE = "/aws/sagemaker/TrainingJobs"
SAGEMAKER_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
CWAGENT_NAMESPACE = "CWAgent"
EC2_NAMESPACE = "AWS/EC2"
# The CloudWatch agent's NVIDIA metrics, aggregated per instance (deploy/ec2/cloudwatch-agent.json, core.alarms).
CWAGENT_GPU_UTILIZATION = "nvidia_smi_utilization_gpu"
CWAGENT_GPU_MEMORY_USED = "nvidia_smi_memory_used"
CWAGENT_GPU_MEMORY_TOTAL = "nvidia_smi_memory_total"
CWAGENT_GPU_POWER = "nvidia_smi_power_draw"  # watts, read where the engine has no power from the training agent
CWAGENT_DIM_INSTANCE = "InstanceId"

# The control plane's own health metrics (Powertools EMF, dimension `service`: the deployment's name, SERVICE by
# default), for its alarms and dashboards.
CONTROL_PLANE_NAMESPACE = "Stallwatch/ControlPlane"
SERVICE = "stallwatch"
DECISIONS = "Decisions"
DUPLICATE_DECISIONS = "DuplicateDecisions"  # a duplicated event or a concurrent decision that lost the commit
COALESCED_ALARMS = "CoalescedAlarms"  # an alarm of a job another invocation was deciding (an alarm burst)
COALESCED_LINES = "CoalescedFatalLines"  # a fatal line a decision that sees it covers already (a burst of lines)
RECHECK_SCHEDULE_FAILURES = "RecheckScheduleFailures"  # a recheck not scheduled: the sweeper decides it later
JOBS_STOPPED = "JobsStopped"
STOP_FAILURES = "StopFailures"
JOBS_RESUMED = "JobsResumed"  # a run restarted from its checkpoint after Stallwatch's stop
RESUME_FAILURES = "ResumeFailures"  # CreateTrainingJob / StartInstances of a resume failed
JOBS_RECOVERED = "JobsRecovered"  # a stalled EC2 job restarted in place and made a step again
RECOVERY_FALLBACKS = "RecoveryFallbacks"  # a recovery in place that ended in a stop (undeliverable, bad node, ...)
SLACK_FAILURES = "SlackFailures"
SLACK_POSTS_GIVEN_UP = "SlackPostsGivenUp"  # a message the sweeper stopped re-sending
MALFORMED_EVENTS = "MalformedEvents"
SUBSCRIPTION_BYTES_DROPPED = "SubscriptionBytesDropped"  # a delivery's compressed bytes past its inflated bound
ALARMS_PUT = "AlarmsPut"
SWEEP_ERRORS = "SweepErrors"
OPERATOR_ACTIONS = "OperatorActions"  # a Slack button press applied
OPERATOR_ACTIONS_DENIED = "OperatorActionsDenied"  # pressed by someone not on the allow-list
OPERATOR_ACTIONS_FAILED = "OperatorActionsFailed"  # a press Lambda gave up applying: posted back to the channel
SLACK_REQUESTS_REJECTED = "SlackRequestsRejected"  # bad signature, expired, replayed or malformed
HOST_EVENTS = "HostEvents"  # an AWS Health scheduled event for an instance a watched job runs on
HOST_MOVES = "HostMoves"  # a job moved off such an instance before its window (restarted without it, requeued)
# Each run's goodput when it ends (runtime.run_goodput): GPU-hours per goodput category, one EMF line per category
# with the dimension sets below (each with `service`), which the fleet dashboard's goodput widgets sum.
RUN_GPU_HOURS = "RunGPUHours"
DIM_CATEGORY = "Category"
DIM_PLATFORM = "Platform"
DIM_TEAM = "Team"
DIM_INSTANCE_TYPE = "InstanceType"
FLEET_DIMENSIONS = (DIM_PLATFORM, DIM_TEAM, DIM_INSTANCE_TYPE)  # each alone beside `Category` (and `service`)
