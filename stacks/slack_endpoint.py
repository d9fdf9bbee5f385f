"""The Slack interactivity endpoint: the function that answers the alert buttons, behind a Lambda Function URL.

The URL's auth type is NONE because Slack cannot sign requests with SigV4. Every request is authenticated by its
Slack signature instead (the signing secret, a 5-minute window, replays refused: ``stallwatch.runtime.interactions``),
and only the allow-listed Slack users and groups may act. Paste ``url.url`` into the Slack app's
Interactivity "Request URL". Slack is answered at once and the press applied by an asynchronous invocation of the
same function, so the function may invoke itself (and nothing else). That invocation's on-failure destination is an
SQS queue the function reads back: a press Lambda gave up applying (after its retries, or older than
`PRESS_MAX_AGE_SECONDS`) is posted back to the channel and counted, which alarms (`runtime.failed_presses`); a
message it cannot post goes, after a few tries, to the dead-letter queue. The function's reserved concurrency
(`slack.reserved_concurrency`) caps what a flood of requests to its public URL can take from the account.

    endpoint = SlackEndpoint(self, "SlackEndpoint", code=code, config=config, table=table, slack_secret=secret,
                             job_statements=permissions.slack_interactions(), dead_letter_queue=dlq)
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, Duration, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from aws_cdk.aws_dynamodb import ITable
from constructs import Construct

from stacks.constants import (
    DLQ_RETENTION,
    FAILED_PRESS_RECEIVES,
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOG_RETENTION,
    LAMBDA_MEMORY_MB,
    LAMBDA_RUNTIME,
    SLACK_INTERACTIONS_HANDLER,
    SLACK_INTERACTIONS_TIMEOUT,
)
from stacks.nag import arn_template
from stallwatch.core.config import CONFIG_ENV, PRESS_MAX_AGE_SECONDS, StallwatchConfig
from stallwatch.core.contract import SERVICE

# The items the function may touch: a job's state and audit records, its own request claims (store.py), the claims
# on posting back a failed press (press_reports.py), and a stop that answers later (pending_stops.py): a Slurm job's
# "Stop now" is a command for its cluster's runner (aws/platforms/slurm_runner.py).
TABLE_ACTIONS = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem"]
TABLE_LEADING_KEYS = ["job#*", "event#slack#*", "press-report#*", "pending-stop", "slurm-command#*"]
DESCRIPTION = "Stallwatch: Slack buttons (snooze, stop now, not stalled), verified by the Slack signature"
# Lambda's own default, made explicit: a press that fails is tried twice more (1 and 2 minutes later).
PRESS_RETRY_ATTEMPTS = 2
# The on-failure queue is read a few records at a time, by at most two executions (SQS's minimum), so that posting
# failed presses back never takes the concurrency the presses themselves need.
FAILED_PRESS_BATCH = 10
FAILED_PRESS_CONCURRENCY = 2


class SlackEndpoint(Construct):
    """The interactions function (own least-privilege role) and its Function URL (auth NONE, Slack-signed)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code: lambda_.Code,
        config: StallwatchConfig,
        table: ITable,
        slack_secret: secretsmanager.ISecret,
        job_statements: Sequence[iam.PolicyStatement],
        dead_letter_queue: sqs.IQueue,
        service: str = SERVICE,
    ) -> None:
        """`job_statements` let the function read a job and stop it, with the same tag conditions as the watchdog;
        `dead_letter_queue` takes the failed presses that could not be posted back either; `service` (the
        deployment's name) is the `service` dimension of its metrics."""
        super().__init__(scope, construct_id)
        self.service = service
        self.role = self._build_role(table, slack_secret, job_statements)
        self.function = self._build_function(code, config, table, slack_secret)
        self.url = self.function.add_function_url(
            auth_type=lambda_.FunctionUrlAuthType.NONE, invoke_mode=lambda_.InvokeMode.BUFFERED
        )
        self._allow_invoking_itself()
        self.failed_presses = self._build_failed_presses(dead_letter_queue)
        self._acknowledge_nag_findings()

    def _build_role(
        self, table: ITable, slack_secret: secretsmanager.ISecret, job_statements: Sequence[iam.PolicyStatement]
    ) -> iam.Role:
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=DESCRIPTION)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="JobStateAndRequestClaims",
                actions=TABLE_ACTIONS,
                resources=[table.table_arn],
                conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": TABLE_LEADING_KEYS}},
            )
        )
        for statement in job_statements:
            role.add_to_policy(statement)
        slack_secret.grant_read(role)
        return role

    def _build_function(
        self, code: lambda_.Code, config: StallwatchConfig, table: ITable, slack_secret: secretsmanager.ISecret
    ) -> lambda_.Function:
        log_group = logs.LogGroup(self, "Logs", retention=LAMBDA_LOG_RETENTION)
        log_group.grant_write(self.role)
        return lambda_.Function(
            self,
            "Function",
            description=DESCRIPTION,
            code=code,
            handler=SLACK_INTERACTIONS_HANDLER,
            runtime=LAMBDA_RUNTIME,
            architecture=LAMBDA_ARCHITECTURE,
            memory_size=LAMBDA_MEMORY_MB,
            timeout=SLACK_INTERACTIONS_TIMEOUT,
            role=self.role,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            tracing=lambda_.Tracing.ACTIVE,
            reserved_concurrent_executions=config.slack.reserved_concurrency,
            environment={
                CONFIG_ENV: config.model_dump_json(),
                "TABLE_NAME": table.table_name,
                "SLACK_SECRET_ARN": slack_secret.secret_arn,
                "POWERTOOLS_SERVICE_NAME": self.service,
            },
        )

    def _allow_invoking_itself(self) -> None:
        """The deferred press (Slack's 3 s): a policy apart from the role's default one, which the function depends
        on, so that the function's ARN in it makes no circular dependency."""
        iam.Policy(
            self,
            "InvokeItself",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(
                    sid="DeferThePressToItself",
                    actions=["lambda:InvokeFunction"],
                    resources=[self.function.function_arn],
                )
            ],
        )

    def _build_failed_presses(self, dead_letter_queue: sqs.IQueue) -> sqs.Queue:
        """The deferred press's on-failure destination, which the function reads back to post each one to Slack."""
        queue = sqs.Queue(
            self,
            "FailedPresses",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=DLQ_RETENTION,
            # six times the function's timeout, as Lambda advises for an SQS source: never read twice at once
            visibility_timeout=Duration.seconds(SLACK_INTERACTIONS_TIMEOUT.to_seconds() * 6),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=FAILED_PRESS_RECEIVES, queue=dead_letter_queue),
        )
        self.function.configure_async_invoke(
            on_failure=destinations.SqsDestination(queue),
            retry_attempts=PRESS_RETRY_ATTEMPTS,
            max_event_age=Duration.seconds(PRESS_MAX_AGE_SECONDS),
        )
        self.function.add_event_source(
            event_sources.SqsEventSource(
                queue,
                batch_size=FAILED_PRESS_BATCH,
                max_concurrency=FAILED_PRESS_CONCURRENCY,
                report_batch_item_failures=True,
            )
        )
        return queue

    def _acknowledge_nag_findings(self) -> None:
        """The wildcards this function's role keeps, and why."""
        arn = arn_template(Stack.of(self))
        reasons = {
            "*": "X-Ray tracing and ec2:DescribeInstances support no resource-level permissions",
            arn.format(service="sagemaker", resource="training-job/*"): "the job a button names is created after "
            "deploy; the function reads it, and stops it only under the watchdog's tag condition",
            arn.format(service="ec2", resource="instance/*"): "the instance a button names is launched after "
            "deploy; it is stopped only under the watchdog's tag condition",
        }
        Validations.of(self).acknowledge(
            *(
                Acknowledgment(id=f"AwsSolutions::AwsSolutions-IAM5[Resource::{resource}]", reason=reason)
                for resource, reason in reasons.items()
            ),
            Acknowledgment(
                id="AwsSolutions::AwsSolutions-L1",
                reason=f"pinned to {LAMBDA_RUNTIME.name} like the watchdog: the bundled wheels are built for it "
                "(stacks/constants.py); upgrade the runtime and the bundle together",
            ),
        )
