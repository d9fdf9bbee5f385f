"""Where people hear from Stallwatch: the Slack secret the Lambdas read, and the SNS topic for control-plane health.

The topic is encrypted with its own KMS key and SSL-only. Its policy (which replaces SNS's default one) and the key's
let CloudWatch publish for this account's health alarms alone (`aws:SourceAccount`, and `aws:SourceArn` over the
alarms' names, `health.health_alarm_arns`): without the allow, CloudWatch is "not authorized to perform SNS:Publish"
and no health alarm reaches anyone.
"""

from __future__ import annotations

import re

from aws_cdk import Aws, Duration, RemovalPolicy, SecretValue
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.constants import CLOUDWATCH_SERVICE_PRINCIPAL
from stallwatch.core.config import SlackConfig

# Secrets Manager appends "-" and six characters to a secret's name; an ARN without them is partial.
_COMPLETE_SECRET_ARN = re.compile(r"-[A-Za-z0-9]{6}$")
_EMPTY_SLACK_SECRET = "{}"
_KEY_PENDING_WINDOW = Duration.days(30)


class Notifications(Construct):
    """The Slack secret (created empty, or imported by ARN) and an encrypted SNS topic with e-mail subscriptions,
    which the alarms `alarm_arns` (an ArnLike pattern) of this account may publish to."""

    def __init__(
        self, scope: Construct, construct_id: str, *, slack: SlackConfig, emails: list[str], alarm_arns: str
    ) -> None:
        super().__init__(scope, construct_id)
        # The confused-deputy conditions: CloudWatch acts only for this account's health alarms.
        self.alarm_conditions = {
            "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
            "ArnLike": {"aws:SourceArn": alarm_arns},
        }
        self.slack_secret = self._build_slack_secret(slack)
        self.topic_key = self._build_topic_key()
        self.topic = self._build_topic(emails)

    def _build_slack_secret(self, slack: SlackConfig) -> secretsmanager.ISecret:
        if slack.secret_arn is None:
            return secretsmanager.Secret(
                self,
                "SlackSecret",
                description='Stallwatch Slack credentials: {"webhook_url": ...} or '
                '{"bot_token": ..., "channel": ..., "signing_secret": ...}',
                # A placeholder, not a credential: the operator puts the real JSON (docs/deploy.md).
                secret_string_value=SecretValue.unsafe_plain_text(_EMPTY_SLACK_SECRET),
            )
        if _COMPLETE_SECRET_ARN.search(slack.secret_arn):
            return secretsmanager.Secret.from_secret_complete_arn(self, "SlackSecret", slack.secret_arn)
        return secretsmanager.Secret.from_secret_partial_arn(self, "SlackSecret", slack.secret_arn)

    def _build_topic_key(self) -> kms.Key:
        key = kms.Key(
            self,
            "TopicKey",
            description="Encrypts the Stallwatch control-plane health topic",
            enable_key_rotation=True,
            pending_window=_KEY_PENDING_WINDOW,
            removal_policy=RemovalPolicy.DESTROY,  # scheduled for deletion after the pending window, with the topic
        )
        # CloudWatch alarms publish to the encrypted topic only if the key lets them.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="HealthAlarmsEncryptToTheTopic",
                principals=[iam.ServicePrincipal(CLOUDWATCH_SERVICE_PRINCIPAL)],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" is this key
                conditions=self.alarm_conditions,
            )
        )
        return key

    def _build_topic(self, emails: list[str]) -> sns.Topic:
        topic = sns.Topic(
            self,
            "HealthTopic",
            display_name="Stallwatch control-plane health",
            master_key=self.topic_key,
            enforce_ssl=True,
        )
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="HealthAlarmsPublish",
                principals=[iam.ServicePrincipal(CLOUDWATCH_SERVICE_PRINCIPAL)],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
                conditions=self.alarm_conditions,
            )
        )
        for email in emails:
            topic.add_subscription(subscriptions.EmailSubscription(email))
        return topic
