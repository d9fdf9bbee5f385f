#!/usr/bin/env bash
# Launch an EC2 training cluster that Stallwatch watches as one job (docs/deploy.md, "EC2 training clusters").
#
#   STALLWATCH_STACK=stallwatch JOB=llm-70b NODES=8 ./deploy/ec2/launch.sh
#
# Every node carries the tag stallwatch:job=$JOB: the control plane groups the nodes into one job by it, and the
# trainer_agent reads it from instance metadata (tags in metadata enabled below) as its JobName. The nodes run the
# CloudWatch agent (cloudwatch-agent.json: per-instance GPU metrics, training logs to one stream per instance id)
# under an instance role with the stack's Ec2InstancePolicyArn attached.
set -euo pipefail

JOB="${JOB:?set JOB, the job name (letters, digits, - or _, at most 63)}"
NODES="${NODES:-8}"
INSTANCE_TYPE="${INSTANCE_TYPE:-p4d.24xlarge}"
AMI="${AMI:?set AMI, e.g. a Deep Learning AMI (GPU driver, PyTorch)}"
SUBNET="${SUBNET:?set SUBNET}"
SECURITY_GROUP="${SECURITY_GROUP:?set SECURITY_GROUP (nodes must reach each other for NCCL)}"
MODE="${MODE:-enforce}"                          # stallwatch:mode: off, observe, notify or enforce
STACK="${STALLWATCH_STACK:-stallwatch}"  # the deployment name (docs/deploy.md)
PROFILE="${INSTANCE_PROFILE:-stallwatch-training}"
HERE="$(cd "$(dirname "$0")" && pwd)"

# The instance role: the stack's managed policy (GPU and training metrics, training logs), nothing else.
policy_arn="$(aws cloudformation describe-stacks --stack-name "$STACK" \
  --query "Stacks[0].Outputs[?OutputKey=='Ec2InstancePolicyArn'].OutputValue" --output text)"
if ! aws iam get-instance-profile --instance-profile-name "$PROFILE" >/dev/null 2>&1; then
  aws iam create-role --role-name "$PROFILE" --assume-role-policy-document \
    '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}'
  aws iam attach-role-policy --role-name "$PROFILE" --policy-arn "$policy_arn"
  aws iam create-instance-profile --instance-profile-name "$PROFILE"
  aws iam add-role-to-instance-profile --instance-profile-name "$PROFILE" --role-name "$PROFILE"
  sleep 10  # IAM is eventually consistent: a new profile is not usable at once
fi

# One RunInstances for the whole cluster, each node tagged with the job (and the stop opt-in, for enforce).
aws ec2 run-instances \
  --image-id "$AMI" \
  --instance-type "$INSTANCE_TYPE" \
  --count "$NODES" \
  --subnet-id "$SUBNET" \
  --security-group-ids "$SECURITY_GROUP" \
  --iam-instance-profile "Name=$PROFILE" \
  --metadata-options "HttpTokens=required,HttpPutResponseHopLimit=2,InstanceMetadataTags=enabled" \
  --tag-specifications "ResourceType=instance,Tags=[{Key=stallwatch:job,Value=$JOB},{Key=stallwatch:mode,Value=$MODE},{Key=Name,Value=$JOB}]" \
  --user-data "file://$HERE/user-data.sh" \
  --query "Instances[].InstanceId" --output text
