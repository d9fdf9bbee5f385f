#!/usr/bin/env bash
# Launch an EC2 training cluster that Stallwatch watches as one job (docs/deploy.md, "EC2 training clusters").
#
#   STALLWATCH_STACK=stallwatch JOB=llm-70b NODES=8 AMI=ami-... SUBNET=subnet-... SECURITY_GROUP=sg-... \
#     TRAIN_COMMAND="train.py --config configs/70b.yaml" CHECKPOINT_URI=s3://my-bucket/checkpoints/llm-70b/ \
#     ./deploy/ec2/launch.sh
#
# Rank 0 is launched first, then the other nodes with its private IP (it stays theirs across stops and starts).
# Every node carries the tag stallwatch:job=$JOB (the control plane groups the nodes into one job by it; the trainer
# agent reads it from instance metadata) and boots deploy/ec2/user-data.sh with the job's values written in, under
# an instance role with the stack's Ec2InstancePolicyArn attached. Prints each node's instance id.
set -euo pipefail

JOB="${JOB:?set JOB, the job name (letters, digits, - or _, at most 63)}"
NODES="${NODES:?set NODES, the number of nodes}"
AMI="${AMI:?set AMI, e.g. a Deep Learning AMI (GPU driver, PyTorch, the CloudWatch agent)}"
SUBNET="${SUBNET:?set SUBNET}"
SECURITY_GROUP="${SECURITY_GROUP:?set SECURITY_GROUP (nodes must reach each other for NCCL and port 29400)}"
TRAIN_COMMAND="${TRAIN_COMMAND:?set TRAIN_COMMAND, the training script and its arguments (run in TRAIN_DIR)}"
CHECKPOINT_URI="${CHECKPOINT_URI:-}"              # s3://... the script resumes from (STALLWATCH_CHECKPOINT_URI)
RESUME="${RESUME:-}"                              # stallwatch:resume: restarts after Stallwatch's stop (needs a checkpoint)
INSTANCE_TYPE="${INSTANCE_TYPE:-p4d.24xlarge}"
MODE="${MODE:-enforce}"                           # stallwatch:mode: off, observe, notify or enforce
STACK="${STALLWATCH_STACK:-stallwatch}"           # the deployment name (docs/deploy.md)
PROFILE="${INSTANCE_PROFILE:-stallwatch-training}"
PLACEMENT_GROUP="${PLACEMENT_GROUP:-}"            # a cluster placement group, for EFA and NCCL bandwidth
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

[[ $NODES =~ ^[1-9][0-9]*$ ]] || { echo "NODES=$NODES: expected a number of nodes" >&2; exit 2; }
[[ -z $RESUME || -n $CHECKPOINT_URI ]] || { echo "RESUME needs CHECKPOINT_URI: a restart resumes from it" >&2; exit 2; }

output() {  # the stack's output $1
  aws cloudformation describe-stacks --stack-name "$STACK" \
    --query "Stacks[0].Outputs[?OutputKey=='$1'].OutputValue" --output text
}
policy_arn="$(output Ec2InstancePolicyArn)"
wheel_uri="$(output AgentWheelUri)"
agent_config="$(output Ec2AgentConfigParameter)"

# The instance role: the stack's managed policy (metrics, logs, the agent's configuration and wheel). The training
# also reads its data and writes CHECKPOINT_URI: attach your own policy for those.
if ! aws iam get-instance-profile --instance-profile-name "$PROFILE" >/dev/null 2>&1; then
  aws iam create-role --role-name "$PROFILE" --assume-role-policy-document \
    '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}'
  aws iam attach-role-policy --role-name "$PROFILE" --policy-arn "$policy_arn"
  aws iam create-instance-profile --instance-profile-name "$PROFILE"
  aws iam add-role-to-instance-profile --instance-profile-name "$PROFILE" --role-name "$PROFILE"
  sleep 10  # IAM is eventually consistent: a new profile is not usable at once
fi

user_data() {  # user-data.sh with the job's values written in after its first line; $1: rank 0's address
  {
    head -n 1 "$HERE/user-data.sh"
    printf '%s=%q\n' JOB "$JOB" NODES "$NODES" MASTER_ADDR "$1" TRAIN_COMMAND "$TRAIN_COMMAND" \
      CHECKPOINT_URI "$CHECKPOINT_URI" AGENT_WHEEL_URI "$wheel_uri" AGENT_CONFIG_PARAMETER "$agent_config"
    for name in TRAIN_CODE_URI TRAIN_DIR PYTHON NPROC_PER_NODE RDZV_PORT; do
      [ -z "${!name:-}" ] || printf '%s=%q\n' "$name" "${!name}"
    done
    tail -n +2 "$HERE/user-data.sh"
  } > "$WORK/user-data-$2.sh"
  echo "file://$WORK/user-data-$2.sh"
}

tags="{Key=stallwatch:job,Value=$JOB},{Key=stallwatch:mode,Value=$MODE},{Key=Name,Value=$JOB}"
[ -z "$CHECKPOINT_URI" ] || tags+=",{Key=stallwatch:checkpoint,Value=$CHECKPOINT_URI}"
[ -z "$RESUME" ] || tags+=",{Key=stallwatch:resume,Value=$RESUME}"
placement=()
[ -z "$PLACEMENT_GROUP" ] || placement=(--placement "GroupName=$PLACEMENT_GROUP")

launch() {  # launch COUNT USER_DATA: the instances' "id private-ip" lines
  aws ec2 run-instances \
    --image-id "$AMI" \
    --instance-type "$INSTANCE_TYPE" \
    --count "$1" \
    --subnet-id "$SUBNET" \
    --security-group-ids "$SECURITY_GROUP" \
    --iam-instance-profile "Name=$PROFILE" \
    ${placement[@]+"${placement[@]}"} \
    --metadata-options "HttpTokens=required,HttpPutResponseHopLimit=2,InstanceMetadataTags=enabled" \
    --tag-specifications "ResourceType=instance,Tags=[$tags]" \
    --user-data "$2" \
    --query "Instances[].[InstanceId,PrivateIpAddress]" --output text
}

read -r rank0 rank0_ip < <(launch 1 "$(user_data "" rank0)")
echo "$rank0"
if [ "$NODES" -gt 1 ]; then
  launch "$((NODES - 1))" "$(user_data "$rank0_ip" others)" | cut -f1
fi
