"""Least-privilege IAM statements for the functions, one builder per need.

No statement has a `*` action. Stops are conditioned on the opt-in tag (`stallwatch:mode=enforce`) unless
`policy.stop_requires_tag` is False; resumes on the resume tags (`_resume`); alarm writes are scoped to the
alarm-name prefix. The few APIs without
resource-level permissions get resource `*` with a condition where IAM offers one.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_iam as iam

from stacks.ec2_training import log_group_arns
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.contract import NAMESPACE, SAGEMAKER_LOG_GROUP
from stallwatch.core.policy import STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE

# Resume (see docs/resume.md). Mirrors stallwatch.core.resume, which stacks may not import: the opt-in tag on the
# job, the role and the instances, and the tag every job Stallwatch creates carries.
RESUME_TAG = "stallwatch:resume"
RESUMED_FROM_TAG = "stallwatch:resumed-from"
SAGEMAKER_SERVICE = "sagemaker.amazonaws.com"
STOP_TRAINING_JOB = "sagemaker:StopTrainingJob"
STOP_INSTANCES = "ec2:StopInstances"
# IgnoreCase: the engine reads the tag value case-insensitively too.
STOP_OPT_IN_CONDITION = {"StringEqualsIgnoreCase": {f"aws:ResourceTag/{STOP_OPT_IN_TAG}": STOP_OPT_IN_VALUE}}


class WatchdogPermissions:
    """The statements each function needs in `stack`, given the deployment's config."""

    def __init__(self, stack: Stack, config: StallwatchConfig) -> None:
        self.stack = stack
        self.config = config
        self.policy = config.policy

    def on_job_state(self) -> list[iam.PolicyStatement]:
        """Start and end of a job: read it, create or delete its alarms, resume it after Stallwatch's stop, and
        read its run's metrics for the end-of-run goodput summary."""
        return [*self._read_jobs(), *self._manage_alarms(), *self._resume(), self._read_metrics()]

    def on_alarm(self) -> list[iam.PolicyStatement]:
        """An alarm fired: gather signals, decide, maybe stop."""
        return [*self._read_jobs(), self._describe_alarms(), self._read_metrics(), *self._read_logs(), *self._stop()]

    def on_log_line(self) -> list[iam.PolicyStatement]:
        """A fatal line in a training log: find its job (an EC2 instance's tags), gather signals, decide, maybe stop."""
        return [*self._read_jobs(), self._read_metrics(), *self._read_logs(), *self._stop()]

    def sweeper(self) -> list[iam.PolicyStatement]:
        """The periodic pass: find jobs, reconcile their alarms, publish log idleness, decide like `on_alarm`, and
        try again the resumes that failed for a reason a later try can fix (the same grants as `on_job_state`'s)."""
        statements = [
            *self._read_jobs(),
            *self._manage_alarms(),
            self._read_metrics(),
            *self._read_logs(),
            *self._stop(),
            *self._resume(),
        ]
        if self.policy.monitor_sagemaker:
            statements.append(self._in_this_region("ListTrainingJobs", ["sagemaker:ListTrainingJobs"]))
            statements += self._query_logs()
        statements.append(self._publish_metrics())
        return statements

    def host_events(self) -> list[iam.PolicyStatement]:
        """An AWS Health event: find the running jobs on its instances (EC2's, Slurm's) and read their checkpoint
        lines; nothing is acted on (the sweeper moves the jobs that opted in)."""
        return [self._in_this_region("DescribeInstances", ["ec2:DescribeInstances"]), *self._read_logs(sagemaker=False)]

    def slack_interactions(self) -> list[iam.PolicyStatement]:
        """A button pressed in Slack: read the job, maybe stop it ("Stop now")."""
        return [*self._read_jobs(), *self._stop()]

    def _read_jobs(self) -> list[iam.PolicyStatement]:
        statements = []
        if self.policy.monitor_sagemaker:
            statements.append(
                iam.PolicyStatement(
                    sid="ReadTrainingJobs",
                    actions=["sagemaker:DescribeTrainingJob", "sagemaker:ListTags"],
                    resources=[self._training_jobs_arn()],
                )
            )
        if self.policy.monitor_ec2 or self.policy.monitor_slurm:
            # DescribeInstances has no resource-level permissions (EC2 jobs; Slurm nodes' instances, by address).
            statements.append(self._in_this_region("DescribeInstances", ["ec2:DescribeInstances"]))
        return statements

    def _manage_alarms(self) -> list[iam.PolicyStatement]:
        return [
            iam.PolicyStatement(
                sid="ManageStallwatchAlarms",
                actions=["cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:TagResource"],
                resources=[self.alarm_arn(f"{self.config.alarm_prefix}*")],
            ),
            self._describe_alarms(),
        ]

    def _describe_alarms(self) -> iam.PolicyStatement:
        # Read-only; DescribeAlarms by name prefix is authorized against every alarm of the account and region.
        return iam.PolicyStatement(
            sid="DescribeAlarms", actions=["cloudwatch:DescribeAlarms"], resources=[self.alarm_arn("*")]
        )

    def _read_metrics(self) -> iam.PolicyStatement:
        # GetMetricData has no resource-level permissions.
        return self._in_this_region("ReadMetrics", ["cloudwatch:GetMetricData"])

    def _read_logs(self, sagemaker: bool = True) -> list[iam.PolicyStatement]:
        statements = []
        if sagemaker and self.policy.monitor_sagemaker:
            statements.append(
                iam.PolicyStatement(
                    sid="ReadTrainingJobLogs", actions=["logs:FilterLogEvents"], resources=[self._training_log_group()]
                )
            )
        if self.policy.monitor_ec2:
            # EC2 hosts' logs are read by stream (instance id): the configured group and the groups under it, which a
            # job's stallwatch:log-group tag may name.
            read = ["logs:DescribeLogStreams", "logs:FilterLogEvents"]
            ec2_groups = log_group_arns(self.stack, self.config.ec2_log_group)
            statements.append(iam.PolicyStatement(sid="ReadEc2TrainingLogs", actions=read, resources=ec2_groups))
        if self.policy.monitor_slurm and not self.policy.monitor_ec2:
            # Slurm nodes' logs (one stream per job and node, named by its instance): a group under the EC2 one,
            # which the EC2 grant covers when EC2 is watched.
            read = ["logs:DescribeLogStreams", "logs:FilterLogEvents"]
            slurm_groups = log_group_arns(self.stack, self.config.slurm_log_group)[:1]
            statements.append(iam.PolicyStatement(sid="ReadSlurmJobLogs", actions=read, resources=slurm_groups))
        return statements

    def _query_logs(self) -> list[iam.PolicyStatement]:
        """The sweeper's one Logs Insights query a sweep (each host's newest line): started on, and its results read
        from, the SageMaker training log group (the Service Authorization Reference gives both the log-group
        resource type)."""
        return [
            iam.PolicyStatement(
                sid="QueryTrainingJobLogs",
                actions=["logs:StartQuery", "logs:GetQueryResults"],
                resources=[self._training_log_group()],
            )
        ]

    def _training_log_group(self) -> str:
        return self.stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{SAGEMAKER_LOG_GROUP}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def _stop(self) -> list[iam.PolicyStatement]:
        conditions = STOP_OPT_IN_CONDITION if self.policy.stop_requires_tag else None
        statements = []
        if self.policy.monitor_sagemaker:
            statements.append(
                iam.PolicyStatement(
                    sid="StopTrainingJobs",
                    actions=[STOP_TRAINING_JOB],
                    resources=[self._training_jobs_arn()],
                    conditions=conditions,
                )
            )
        if self.policy.monitor_ec2:
            instances = self.stack.format_arn(service="ec2", resource="instance", resource_name="*")
            statements.append(
                iam.PolicyStatement(
                    sid="StopInstances", actions=[STOP_INSTANCES], resources=[instances], conditions=conditions
                )
            )
        return statements

    def _resume(self) -> list[iam.PolicyStatement]:
        """CreateTrainingJob (and AddTags, which CreateTrainingJob with tags needs) only of a job that carries the
        resume chain's tag; iam:PassRole only to SageMaker and only of roles tagged `stallwatch:resume`, so a job's
        role must be opted in as well as the job; StartInstances only of instances tagged `stallwatch:resume`."""
        statements = []
        if self.policy.monitor_sagemaker:
            statements += [
                iam.PolicyStatement(
                    sid="CreateResumedTrainingJobs",
                    actions=["sagemaker:CreateTrainingJob", "sagemaker:AddTags"],
                    resources=[self._training_jobs_arn()],
                    conditions={"Null": {f"aws:RequestTag/{RESUMED_FROM_TAG}": "false"}},
                ),
                iam.PolicyStatement(
                    sid="PassResumeOptedInRoles",
                    actions=["iam:PassRole"],
                    resources=[self.stack.format_arn(service="iam", region="", resource="role", resource_name="*")],
                    conditions={
                        "StringEquals": {"iam:PassedToService": SAGEMAKER_SERVICE},
                        "Null": {f"aws:ResourceTag/{RESUME_TAG}": "false"},
                    },
                ),
            ]
        if self.policy.monitor_ec2:
            instances = self.stack.format_arn(service="ec2", resource="instance", resource_name="*")
            statements.append(
                iam.PolicyStatement(
                    sid="StartResumeOptedInInstances",
                    actions=["ec2:StartInstances"],
                    resources=[instances],
                    conditions={"Null": {f"aws:ResourceTag/{RESUME_TAG}": "false"}},
                )
            )
        return statements

    def _publish_metrics(self) -> iam.PolicyStatement:
        # PutMetricData has no resource-level permissions; the namespace condition keeps it to Stallwatch's.
        return iam.PolicyStatement(
            sid="PublishStallwatchMetrics",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": NAMESPACE}},
        )

    def _in_this_region(self, sid: str, actions: list[str]) -> iam.PolicyStatement:
        """For read APIs without resource-level permissions: any resource, in this region only."""
        return iam.PolicyStatement(
            sid=sid,
            actions=actions,
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": Aws.REGION}},
        )

    def _training_jobs_arn(self) -> str:
        return self.stack.format_arn(service="sagemaker", resource="training-job", resource_name="*")

    def alarm_arn(self, name: str) -> str:
        """The ARN of the alarm(s) `name` (may end in `*`) in this stack's account and region."""
        return self.stack.format_arn(
            service="cloudwatch", resource="alarm", resource_name=name, arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
