"""The incident and job-state table the Lambdas share."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from stallwatch.core.config import TABLE_PARTITION_KEY, TABLE_SORT_KEY, TABLE_TTL_ATTRIBUTE


class StateStore(Construct):
    """DynamoDB (pk/sk, TTL `expires_at`), on demand, encrypted, with point-in-time recovery; kept on teardown."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.table = self._build_table()

    def _build_table(self) -> dynamodb.Table:
        # A classic AWS::DynamoDB::Table: the `stallwatch` operator CLI finds the table by that resource type.
        return dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=TABLE_PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=TABLE_SORT_KEY, type=dynamodb.AttributeType.STRING),
            time_to_live_attribute=TABLE_TTL_ATTRIBUTE,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            deletion_protection=True,
            removal_policy=RemovalPolicy.RETAIN,  # the audit trail of every stop outlives the stack
        )
