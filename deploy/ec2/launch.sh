#!/usr/bin/env bash
# Launch an EC2 training cluster that Stallwatch watches as one job (docs/deploy.md, "EC2 training clusters").
#
#   STALLWATCH_STACK=stallwatch JOB=llm-70b NODES=4 AMI=ami-... SUBNET=subnet-... SECURITY_GROUP=sg-... \
#     INSTANCE_TYPE=p5.48xlarge TRAIN_COMMAND="train.py --config configs/70b.yaml" \
#     CHECKPOINT_URI=s3://my-bucket/checkpoints/llm-70b/ CAPACITY_RESERVATION=cr-0123456789abcdef0 MAX_HOURS=48 \
#     ./deploy/ec2/launch.sh
#   DRY_RUN=1 ... ./deploy/ec2/launch.sh     # check everything, print the plan and its commands, launch nothing
#
# Rank 0 is launched first, then the other nodes with its private IP (it stays theirs across stops and starts), each
# with one EFA per network card (p5, p5e: 32; p4d, p4de: 4; trn1: 8), in a cluster placement group, into the
# capacity reservation or Capacity Block when one is named. Every node carries the tag stallwatch:job=$JOB (the
# control plane groups the nodes into one job by it; the trainer agent reads it from instance metadata) and boots
# deploy/ec2/user-data.sh with the job's values written in. Every value is checked, with the same rules the nodes
# apply at boot, before anything is created or launched. Prints each node's instance id. By default the cluster costs
# what a first look needs: g5.xlarge nodes (one GPU each), which power off MAX_HOURS after their training starts;
# `aws ec2 terminate-instances --instance-ids <the ids>` ends them sooner (docs/deploy.md, "End a job").
#
# The values (environment variables), and their defaults:
#   JOB                   the job's name: letters, digits, - or _, at most 63                        (required)
#   NODES                 the number of nodes (torchrun --nnodes)                                     (required)
#   AMI                   an AMI with the GPU driver, EFA and PyTorch, e.g. a Deep Learning AMI       (required)
#   SUBNET                the subnet, in the reservation's Availability Zone                         (required)
#   SECURITY_GROUP        lets the nodes reach each other: all traffic within the group, for EFA     (required)
#   TRAIN_COMMAND         the training script and its arguments, run by torchrun in TRAIN_DIR         (required)
#   STALLWATCH_STACK      the deployment's stack, whose outputs the nodes use                        (stallwatch)
#   INSTANCE_TYPE         g5.xlarge, p5.48xlarge, p5e.48xlarge, p4d.24xlarge, trn1.32xlarge...        (g5.xlarge)
#   EFA_INTERFACES        EFA interfaces per node, one per network card; 0: no EFA   (the type's count; else required)
#   CAPACITY_RESERVATION  cr-...: an On-Demand Capacity Reservation or a Capacity Block (its kind is read) (none)
#   PLACEMENT_GROUP       a cluster placement group, created if absent; none: no group
#                         (the reservation's group; none in a Capacity Block; else stallwatch-<JOB>)
#   INSTANCE_PROFILE      the nodes' instance profile, used as it is     (stallwatch-<JOB>, created or updated here)
#   MODE                  the tag stallwatch:mode: off, observe, notify or enforce (enforce: Stallwatch may stop
#                         the job)                                      (none: the deployment's mode governs the job)
#   RESUME                the tag stallwatch:resume: restarts after Stallwatch's stop, 1 to 10 (needs CHECKPOINT_URI)
#                                                                                                           (none)
#   CHECKPOINT_URI        s3://... where the script saves and resumes (STALLWATCH_CHECKPOINT_URI)            (none)
#   TRAIN_CODE_URI        s3://... copied into TRAIN_DIR at first boot                          (none: in the AMI)
#   TRAIN_DIR             where the training code is                                                  (/opt/train)
#   PYTHON                the training environment's python                                              (python3)
#   NPROC_PER_NODE        processes per node: a number, or gpu (one per GPU)                  (gpu; trn1: 32)
#   RDZV_PORT             torchrun's rendezvous port on rank 0                                            (29400)
#   MAX_HOURS             each node powers off this many hours after its training starts (each start; a
#                         stopped node costs its volumes only); 0: never                                     (2)
#   DRY_RUN               1: check, print the plan (role, profile, placement group, nodes) and the run-instances
#                         commands, create and launch nothing                                                (none)
set -euo pipefail

if (( BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4) )); then
  echo "launch.sh: needs bash 4.4 or newer, not $BASH_VERSION (macOS: brew install bash, then run it with that bash)" >&2
  exit 2
fi
HERE="$(cd "$(dirname "$0")" && pwd)"
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set -euo pipefail$/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi

die() {
  echo "launch.sh: $*" >&2
  exit 2
}

check() {  # check NAME VALUE PATTERN WHAT
  [[ $2 =~ $3 ]] || die "$1=${2@Q}: expected $4"
}

# EFA interfaces per instance type: one per network card (Amazon EC2 User Guide, "Maximize network bandwidth on
# instances with multiple network cards"; DescribeInstanceTypes NetworkInfo.EfaInfo.MaximumEfaInterfaces).
declare -A EFA_COUNT=([p5.48xlarge]=32 [p5e.48xlarge]=32 [p4d.24xlarge]=4 [p4de.24xlarge]=4 [trn1.32xlarge]=8
  [g5.xlarge]=0)

JOB="${JOB:-}"
NODES="${NODES:-}"
AMI="${AMI:-}"
SUBNET="${SUBNET:-}"
SECURITY_GROUP="${SECURITY_GROUP:-}"
TRAIN_COMMAND="${TRAIN_COMMAND:-}"
STACK="${STALLWATCH_STACK:-stallwatch}"
INSTANCE_TYPE="${INSTANCE_TYPE:-g5.xlarge}"
EFA_INTERFACES="${EFA_INTERFACES:-${EFA_COUNT[$INSTANCE_TYPE]:-}}"
CAPACITY_RESERVATION="${CAPACITY_RESERVATION:-}"
PLACEMENT_GROUP="${PLACEMENT_GROUP:-}"
INSTANCE_PROFILE="${INSTANCE_PROFILE:-}"
MODE="${MODE:-}"
RESUME="${RESUME:-}"
CHECKPOINT_URI="${CHECKPOINT_URI:-}"
TRAIN_CODE_URI="${TRAIN_CODE_URI:-}"
MAX_HOURS="${MAX_HOURS:-2}"
DRY_RUN="${DRY_RUN:-}"
[[ $INSTANCE_TYPE != trn1.* ]] || NPROC_PER_NODE="${NPROC_PER_NODE:-32}"  # NeuronCores: torchrun's gpu counts CUDA
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# ---- every value, before anything is created or launched -----------------------------------------------------------
check JOB "$JOB" '^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$' "the job's name: letters, digits, - or _ (at most 63)"
check NODES "$NODES" '^[1-9][0-9]{0,4}$' "the number of nodes"
check AMI "$AMI" '^ami-[0-9a-f]{8,17}$' "an AMI id, ami-..."
check SUBNET "$SUBNET" '^subnet-[0-9a-f]{8,17}$' "a subnet id, subnet-..."
check SECURITY_GROUP "$SECURITY_GROUP" '^sg-[0-9a-f]{8,17}$' "a security group id, sg-..."
check STALLWATCH_STACK "$STACK" '^[A-Za-z][A-Za-z0-9-]{0,127}$' "the deployment's stack name"
check INSTANCE_TYPE "$INSTANCE_TYPE" '^[a-z][a-z0-9-]*\.[a-z0-9]+$' "an instance type, e.g. p5.48xlarge"
check EFA_INTERFACES "$EFA_INTERFACES" '^([0-9]|[12][0-9]|3[0-2])$' \
  "0 to 32 EFA interfaces (one per network card); set it for $INSTANCE_TYPE, 0 for none"
check CAPACITY_RESERVATION "$CAPACITY_RESERVATION" '^(cr-[0-9a-f]{17})?$' "a capacity reservation id, cr-..."
check PLACEMENT_GROUP "$PLACEMENT_GROUP" '^[A-Za-z0-9_.-]{0,255}$' "a placement group name, or none"
check INSTANCE_PROFILE "$INSTANCE_PROFILE" '^[A-Za-z0-9+=.@_-]{0,128}$' "an instance profile name"
check MODE "$MODE" '^(off|observe|notify|enforce)?$' "off, observe, notify or enforce (or unset: no tag)"
check RESUME "$RESUME" '^([1-9]|10)?$' "1 to 10 restarts (or unset: no tag)"
check MAX_HOURS "$MAX_HOURS" '^(0|[1-9][0-9]{0,3})$' "whole hours after which each node powers off, or 0: never"
check DRY_RUN "$DRY_RUN" '^(1)?$' "1, or unset"
[[ -z $RESUME || -n $CHECKPOINT_URI ]] || die "RESUME needs CHECKPOINT_URI: a restart resumes from it"
(( ${#CHECKPOINT_URI} <= 256 )) || die "CHECKPOINT_URI: at most 256 characters (the stallwatch:checkpoint tag's value)"
command -v aws >/dev/null || die "the AWS CLI v2 is not on PATH: https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html"
PROFILE="${INSTANCE_PROFILE:-stallwatch-$JOB}"
(( ${#PROFILE} <= 64 )) || die "JOB=$JOB: too long for the role stallwatch-<JOB> (64): set INSTANCE_PROFILE"

output() {  # the stack's output $1
  local value
  value="$(aws cloudformation describe-stacks --stack-name "$STACK" \
    --query "Stacks[0].Outputs[?OutputKey=='$1'].OutputValue" --output text)" || die "stack $STACK: not readable"
  [[ -n $value && $value != None ]] || die "stack $STACK has no output $1: deploy it (npx cdk deploy $STACK)"
  echo "$value"
}
policy_arn="$(output Ec2InstancePolicyArn)"
wheel_uri="$(output AgentWheelUri)"
agent_config="$(output Ec2AgentConfigParameter)"

user_data() {  # user_data MASTER_ADDR NAME: user-data.sh with the job's values after its first line; prints its path
  {
    head -n 1 "$HERE/user-data.sh"
    printf '%s=%q\n' JOB "$JOB" NODES "$NODES" MASTER_ADDR "$1" TRAIN_COMMAND "$TRAIN_COMMAND" \
      CHECKPOINT_URI "$CHECKPOINT_URI" AGENT_WHEEL_URI "$wheel_uri" AGENT_CONFIG_PARAMETER "$agent_config" \
      MAX_HOURS "$MAX_HOURS"
    for name in TRAIN_CODE_URI TRAIN_DIR PYTHON NPROC_PER_NODE RDZV_PORT; do
      [ -z "${!name:-}" ] || printf '%s=%q\n' "$name" "${!name}"
    done
    tail -n +2 "$HERE/user-data.sh"
  } > "$WORK/user-data-$2.sh"
  echo "$WORK/user-data-$2.sh"
}

# The nodes' own rules, on this machine: a value a node would refuse at boot is refused before any launch.
validated="$(STALLWATCH_VALIDATE_ONLY=1 bash "$(user_data 192.0.2.1 check)" 2>&1)" \
  || die "${validated#stallwatch user-data: }"

# The capacity: its kind (a Capacity Block launches with MarketType capacity-block), type, zone, state and room.
market=""
if [[ -n $CAPACITY_RESERVATION ]]; then
  read -r kind reserved_type reserved_zone state available group_arn < <(
    aws ec2 describe-capacity-reservations --capacity-reservation-ids "$CAPACITY_RESERVATION" --query \
      "CapacityReservations[0].[ReservationType,InstanceType,AvailabilityZone,State,AvailableInstanceCount,PlacementGroupArn]" \
      --output text
  ) || die "CAPACITY_RESERVATION=$CAPACITY_RESERVATION: not found"
  [[ $reserved_type == "$INSTANCE_TYPE" ]] || die "$CAPACITY_RESERVATION reserves $reserved_type, not $INSTANCE_TYPE"
  [[ $state == active ]] || die "$CAPACITY_RESERVATION is $state: launch once it is active"
  (( available >= NODES )) || die "$CAPACITY_RESERVATION has room for $available instances, not $NODES"
  zone="$(aws ec2 describe-subnets --subnet-ids "$SUBNET" --query "Subnets[0].AvailabilityZone" --output text)"
  [[ $zone == "$reserved_zone" ]] || die "SUBNET=$SUBNET is in $zone, $CAPACITY_RESERVATION in $reserved_zone"
  [[ $kind != capacity-block ]] || market=capacity-block
  [[ $group_arn == None || -n $PLACEMENT_GROUP ]] || PLACEMENT_GROUP="${group_arn##*/}"
fi
# A Capacity Block's instances are placed together in an UltraCluster; elsewhere a cluster group keeps them close.
[[ -n $PLACEMENT_GROUP ]] || PLACEMENT_GROUP="$([[ -n $market ]] && echo none || echo "stallwatch-$JOB")"

# ---- the RunInstances request (values as JSON: no value can break an argument's syntax) ----------------------------
interfaces() {  # the network interfaces: the primary EFA with ENA, then one EFA-only per further network card
  local card type
  if (( EFA_INTERFACES == 0 )); then
    printf '{"DeviceIndex":0,"SubnetId":"%s","Groups":["%s"]}' "$SUBNET" "$SECURITY_GROUP"
    return
  fi
  for ((card = 0; card < EFA_INTERFACES; card++)); do
    (( card == 0 )) && type=efa || type=efa-only
    printf '%s{"NetworkCardIndex":%d,"DeviceIndex":%d,"InterfaceType":"%s","SubnetId":"%s","Groups":["%s"],"DeleteOnTermination":true}' \
      "$([[ $card == 0 ]] || echo ,)" "$card" "$((card == 0 ? 0 : 1))" "$type" "$SUBNET" "$SECURITY_GROUP"
  done
}

tags() {
  local tag=("stallwatch:job" "$JOB" Name "$JOB")
  [ -z "$MODE" ] || tag+=("stallwatch:mode" "$MODE")
  [ -z "$CHECKPOINT_URI" ] || tag+=("stallwatch:checkpoint" "$CHECKPOINT_URI")
  [ -z "$RESUME" ] || tag+=("stallwatch:resume" "$RESUME")
  local i
  for ((i = 0; i < ${#tag[@]}; i += 2)); do
    printf '%s{"Key":"%s","Value":"%s"}' "$([[ $i == 0 ]] || echo ,)" "${tag[i]}" "${tag[i + 1]}"
  done
}

parameters() {  # parameters COUNT: PARAMS, the RunInstances options for COUNT nodes (all or none), values as JSON
  PARAMS=(
    --image-id "$AMI" --instance-type "$INSTANCE_TYPE" --count "$1"
    --network-interfaces "[$(interfaces)]"
    --iam-instance-profile "{\"Name\":\"$PROFILE\"}"
    --metadata-options '{"HttpTokens":"required","HttpPutResponseHopLimit":2,"InstanceMetadataTags":"enabled"}'
    --tag-specifications "[{\"ResourceType\":\"instance\",\"Tags\":[$(tags)]}]"
  )
  [[ $PLACEMENT_GROUP == none ]] || PARAMS+=(--placement "{\"GroupName\":\"$PLACEMENT_GROUP\"}")
  [[ -z $CAPACITY_RESERVATION ]] || PARAMS+=(--capacity-reservation-specification \
    "{\"CapacityReservationTarget\":{\"CapacityReservationId\":\"$CAPACITY_RESERVATION\"}}")
  [[ -z $market ]] || PARAMS+=(--instance-market-options "{\"MarketType\":\"$market\"}")
}

# ---- the instance role: exactly what the nodes do ------------------------------------------------------------------
# The stack's policy (metrics, logs, the agent's configuration and wheel); SSM's core (recovery in place sends its
# health check and restart through SSM); the job's own S3: the code to copy, the checkpoints to write and read.
s3_statements() {
  local sid uri bucket prefix actions statements=()
  for sid in Code Checkpoints; do
    if [[ $sid == Code ]]; then
      uri="$TRAIN_CODE_URI" actions='"s3:GetObject"'
    else
      uri="$CHECKPOINT_URI" actions='"s3:GetObject","s3:PutObject","s3:DeleteObject","s3:AbortMultipartUpload"'
    fi
    [ -n "$uri" ] || continue
    bucket="${uri#s3://}" && bucket="${bucket%%/*}"
    prefix="${uri#s3://"$bucket"}" && prefix="${prefix#/}"
    statements+=("{\"Sid\":\"Training${sid}\",\"Effect\":\"Allow\",\"Action\":[${actions}],\"Resource\":\"arn:aws:s3:::${bucket}/${prefix}*\"}")
    statements+=("{\"Sid\":\"List${sid}\",\"Effect\":\"Allow\",\"Action\":\"s3:ListBucket\",\"Resource\":\"arn:aws:s3:::${bucket}\",\"Condition\":{\"StringLike\":{\"s3:prefix\":\"${prefix}*\"}}}")
  done
  local IFS=,
  echo "${statements[*]}"
}

plan() {  # what a run makes and launches, read (never changed) before anything is made
  local role group bound nodes="rank 0, then $((NODES - 1)) with its private IP" efa="$EFA_INTERFACES EFA each"
  local policies="the stack's policy $policy_arn, AmazonSSMManagedInstanceCore"
  if [[ -n $INSTANCE_PROFILE ]]; then
    role="instance profile $PROFILE, used as it is"
  elif aws iam get-role --role-name "$PROFILE" >/dev/null 2>&1; then
    role="role and instance profile $PROFILE: exist, brought up to date"
  else
    role="role and instance profile $PROFILE: created"
  fi
  [ -z "$(s3_statements)" ] || policies+=" and stallwatch-job-s3 (the job's S3 prefixes)"
  (( EFA_INTERFACES > 0 )) || efa="no EFA"
  (( NODES > 1 )) || nodes="rank 0 alone"
  if [[ $PLACEMENT_GROUP == none ]]; then
    group="no placement group"
  elif aws ec2 describe-placement-groups --group-names "$PLACEMENT_GROUP" >/dev/null 2>&1; then
    group="placement group $PLACEMENT_GROUP: exists, used"
  else
    group="placement group $PLACEMENT_GROUP (cluster): created"
  fi
  if (( MAX_HOURS > 0 )); then
    bound="each node powers off $MAX_HOURS h after its training starts (MAX_HOURS)"
  else
    bound="the nodes run until you stop or terminate them (MAX_HOURS=0)"
  fi
  cat <<PLAN
# DRY_RUN: checked, nothing created or launched. The run would make:
#   $role, with $policies
#   $group
#   $NODES x $INSTANCE_TYPE, ${CAPACITY_RESERVATION:-On-Demand}${market:+ (a Capacity Block)}: $nodes; $efa; in $SUBNET, $SECURITY_GROUP
#   tags stallwatch:job=$JOB${MODE:+, stallwatch:mode=$MODE}${RESUME:+, stallwatch:resume=$RESUME}${CHECKPOINT_URI:+, stallwatch:checkpoint=$CHECKPOINT_URI}
#   each node boots user-data.sh: the CloudWatch agent ($agent_config), the trainer agent ($wheel_uri), then torchrun $TRAIN_COMMAND
#   $bound; to end the job sooner: aws ec2 terminate-instances --instance-ids <the ids a run prints>
# The launches, as they would run (the user data is written at launch):
PLAN
  for count in 1 $((NODES - 1)); do
    (( count > 0 )) || continue
    parameters "$count"
    printf 'aws ec2 run-instances'; printf ' %q' "${PARAMS[@]}"; echo
  done
}

if [[ -n $DRY_RUN ]]; then
  plan
  exit 0
fi

if [[ -z $INSTANCE_PROFILE ]]; then
  if ! aws iam get-role --role-name "$PROFILE" >/dev/null 2>&1; then
    aws iam create-role --role-name "$PROFILE" --description "Stallwatch EC2 training job $JOB (deploy/ec2/launch.sh)" \
      --assume-role-policy-document \
      '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}' \
      >/dev/null
    aws iam create-instance-profile --instance-profile-name "$PROFILE" >/dev/null
    aws iam add-role-to-instance-profile --instance-profile-name "$PROFILE" --role-name "$PROFILE"
    created=1
  fi
  aws iam attach-role-policy --role-name "$PROFILE" --policy-arn "$policy_arn"
  aws iam attach-role-policy --role-name "$PROFILE" --policy-arn "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
  statements="$(s3_statements)"
  if [ -n "$statements" ]; then
    aws iam put-role-policy --role-name "$PROFILE" --policy-name stallwatch-job-s3 \
      --policy-document "{\"Version\":\"2012-10-17\",\"Statement\":[$statements]}"
  else
    aws iam delete-role-policy --role-name "$PROFILE" --policy-name stallwatch-job-s3 >/dev/null 2>&1 || true
  fi
  [ -z "${created:-}" ] || sleep 10  # IAM is eventually consistent: a new profile is not usable at once
fi

if [[ $PLACEMENT_GROUP != none ]] \
  && ! aws ec2 describe-placement-groups --group-names "$PLACEMENT_GROUP" >/dev/null 2>&1; then
  aws ec2 create-placement-group --group-name "$PLACEMENT_GROUP" --strategy cluster >/dev/null
fi

launch() {  # launch COUNT NAME MASTER_ADDR: the instances' "id private-ip" lines
  local user_data_file
  user_data_file="$(user_data "$3" "$2")"
  parameters "$1"
  aws ec2 run-instances "${PARAMS[@]}" --user-data "file://$user_data_file" \
    --query "Instances[].[InstanceId,PrivateIpAddress]" --output text
}

read -r rank0 rank0_ip < <(launch 1 rank0 "")
[[ -n ${rank0:-} ]] || die "rank 0 was not launched"
echo "$rank0"
if (( NODES > 1 )); then
  launch "$((NODES - 1))" others "$rank0_ip" | cut -f1 \
    || die "the other $((NODES - 1)) nodes were not launched; rank 0 waits for them: aws ec2 terminate-instances --instance-ids $rank0"
fi
