#!/usr/bin/env bash
# Boot script of each EC2 training node (docs/deploy.md, "EC2 training clusters"). launch.sh writes the job's values
# as assignments after the first line; run once, at the node's first boot, it:
#   1. installs the CloudWatch agent (Amazon Linux 2023, Ubuntu, RHEL; x86_64 or arm64) and starts it with the
#      configuration in the stack's SSM parameter (GPU metrics per instance, training logs to the stack's group;
#      without the GPU metrics on a node without nvidia-smi, a Trainium node);
#   2. installs the trainer agent from the wheel the stack publishes, with its dependencies' wheels beside it (never
#      from a package index: a private subnet without a way out boots as well);
#   3. writes /etc/stallwatch/train.env and starts the training as the systemd unit stallwatch-train.service:
#      torchrun with the job's values, started again at every boot (a StartInstances resume), restartable in place
#      with `systemctl restart stallwatch-train.service`; the training script finds its last checkpoint under
#      STALLWATCH_CHECKPOINT_URI.
# A value left empty is read from the instance's tag where one is named (tags in instance metadata enabled).
set -euo pipefail

# ---- the job's values ---------------------------------------------------------------------------------------------
JOB="${JOB:-}"                                   # the job's name (tag stallwatch:job)
NODES="${NODES:-}"                               # the nodes of the job
MASTER_ADDR="${MASTER_ADDR:-}"                   # rank 0's private IP; empty on rank 0 itself (its own)
TRAIN_COMMAND="${TRAIN_COMMAND:-}"               # the script and its arguments, run by torchrun in TRAIN_DIR
CHECKPOINT_URI="${CHECKPOINT_URI:-}"             # the run's checkpoint prefix, s3://... (tag stallwatch:checkpoint)
AGENT_WHEEL_URI="${AGENT_WHEEL_URI:-}"           # the stack's output AgentWheelUri
AGENT_CONFIG_PARAMETER="${AGENT_CONFIG_PARAMETER:-}"  # the stack's output Ec2AgentConfigParameter
TRAIN_CODE_URI="${TRAIN_CODE_URI:-}"             # optional: s3://... copied into TRAIN_DIR before the first start
TRAIN_DIR="${TRAIN_DIR:-/opt/train}"
PYTHON="${PYTHON:-python3}"                      # the training environment's interpreter (it has torch)
NPROC_PER_NODE="${NPROC_PER_NODE:-gpu}"          # processes per node: a number, or gpu (one per GPU)
RDZV_PORT="${RDZV_PORT:-29400}"
MAX_HOURS="${MAX_HOURS:-0}"                      # the node powers off this long after its training starts; 0: never
# -------------------------------------------------------------------------------------------------------------------

ROOT="${STALLWATCH_ROOT:-}"  # tests install under a folder; on a node everything goes to /
VALIDATE_ONLY="${STALLWATCH_VALIDATE_ONLY:-}"  # launch.sh: check the values on the launching machine, then exit
UNIT=stallwatch-train.service
ENV_FILE=/etc/stallwatch/train.env
LAUNCHER=/opt/stallwatch/bin/stallwatch-train
TRAINING_LOG=/var/log/training/train.log
CLOUDWATCH_AGENT_CTL=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
IMDS=http://169.254.169.254/latest

die() {
  echo "stallwatch user-data: $*" >&2
  exit 1
}

imds() {  # GET an instance-metadata path (IMDSv2); empty if absent (and off a node)
  [ -z "$VALIDATE_ONLY" ] || return 0
  local token
  token="$(curl -fsS -m 5 -X PUT "$IMDS/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300")" || return 0
  curl -fsS -m 5 -H "X-aws-ec2-metadata-token: $token" "$IMDS/$1" || true
}

check() {  # check NAME VALUE PATTERN WHAT
  [[ $2 =~ $3 ]] || die "$1=${2@Q}: expected $4"
}

JOB="${JOB:-$(imds meta-data/tags/instance/stallwatch:job)}"
CHECKPOINT_URI="${CHECKPOINT_URI:-$(imds meta-data/tags/instance/stallwatch:checkpoint)}"
MASTER_ADDR="${MASTER_ADDR:-$(imds meta-data/local-ipv4)}"
REGION="$(imds meta-data/placement/region)"

check JOB "$JOB" '^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$' "letters, digits, - or _ (at most 63), or the tag stallwatch:job"
check NODES "$NODES" '^[1-9][0-9]{0,4}$' "the number of nodes"
check MASTER_ADDR "$MASTER_ADDR" '^[A-Za-z0-9.-]{1,253}$' "rank 0's private IP or host name"
check TRAIN_COMMAND "$TRAIN_COMMAND" '^[A-Za-z0-9 _./:=,+@%-]{1,2048}$' \
  "the training script and its arguments (letters, digits, spaces and _ . / : = , + @ % -; for more, a script)"
check CHECKPOINT_URI "$CHECKPOINT_URI" '^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9_./=+-]*)?)?$' "an s3:// prefix"
check AGENT_WHEEL_URI "$AGENT_WHEEL_URI" '^s3://[a-z0-9.-]+/[A-Za-z0-9_./-]+$' "the stack's output AgentWheelUri"
check AGENT_CONFIG_PARAMETER "$AGENT_CONFIG_PARAMETER" '^[A-Za-z0-9_.-]{1,1011}$' \
  "the stack's output Ec2AgentConfigParameter"
check TRAIN_CODE_URI "$TRAIN_CODE_URI" '^(s3://[a-z0-9.-]+(/[A-Za-z0-9_./=+-]*)?)?$' "an s3:// prefix, or empty"
check TRAIN_DIR "$TRAIN_DIR" '^/[A-Za-z0-9_./-]*$' "an absolute path"
check PYTHON "$PYTHON" '^[A-Za-z0-9_./-]+$' "the training environment's python"
check NPROC_PER_NODE "$NPROC_PER_NODE" '^([1-9][0-9]{0,2}|gpu)$' "a number of processes, or gpu"
check RDZV_PORT "$RDZV_PORT" '^[1-9][0-9]{0,4}$' "a port"
check MAX_HOURS "$MAX_HOURS" '^(0|[1-9][0-9]{0,3})$' "whole hours before the node powers off, or 0: never"
check REGION "$REGION" '^([a-z]{2}(-[a-z]+)+-[0-9]{1,2})?$' "an AWS region, from instance metadata"
[ -z "$VALIDATE_ONLY" ] || exit 0

install_cloudwatch_agent() {
  [ -x "$ROOT$CLOUDWATCH_AGENT_CTL" ] && return 0  # the Deep Learning AMIs have it
  local id arch bucket
  id="$(. "$ROOT/etc/os-release" && echo "$ID ${ID_LIKE:-}")"
  case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) die "no CloudWatch agent package for $(uname -m)" ;;
  esac
  bucket="https://amazoncloudwatch-agent${REGION:+-$REGION}.s3${REGION:+.$REGION}.amazonaws.com"
  case "$id" in
    amzn*)
      command -v dnf >/dev/null || die "Amazon Linux 2's systemd (219) cannot run the unit: use Amazon Linux 2023"
      dnf install -y amazon-cloudwatch-agent ;;
    *ubuntu* | *debian*)
      curl -fsSL -o /tmp/amazon-cloudwatch-agent.deb "$bucket/ubuntu/$arch/latest/amazon-cloudwatch-agent.deb"
      dpkg -i -E /tmp/amazon-cloudwatch-agent.deb ;;
    *rhel* | *centos* | *fedora*)
      curl -fsSL -o /tmp/amazon-cloudwatch-agent.rpm "$bucket/redhat/$arch/latest/amazon-cloudwatch-agent.rpm"
      rpm -U /tmp/amazon-cloudwatch-agent.rpm ;;
    *) die "no CloudWatch agent package for this OS ($id): install it in the AMI" ;;
  esac
}

cloudwatch_agent_config() {  # where the CloudWatch agent reads its configuration from
  # The agent does not start with its nvidia_gpu metrics on a node without nvidia-smi (a Trainium node: "validate input
  # plugin nvidia_smi failed"): there it runs the stack's configuration without them, and the logs still ship.
  if command -v nvidia-smi >/dev/null; then
    echo "ssm:$AGENT_CONFIG_PARAMETER"
    return
  fi
  local config="$ROOT/opt/stallwatch/cloudwatch-agent.json"
  aws ssm get-parameter ${REGION:+--region "$REGION"} --name "$AGENT_CONFIG_PARAMETER" \
    --query Parameter.Value --output text | python3 -c '
import json, sys
config = json.load(sys.stdin)
collected = config.get("metrics", {}).get("metrics_collected", {})
collected.pop("nvidia_gpu", None)
if not collected:
    config.pop("metrics", None)
json.dump(config, sys.stdout)' > "$config"
  echo "file:$config"
}

install_trainer_agent() {
  command -v aws >/dev/null || die "the AWS CLI is missing (Ubuntu: snap install aws-cli --classic)"
  local wheels="$ROOT/opt/stallwatch/wheel"
  mkdir -p "$wheels"
  aws s3 cp --only-show-errors "$AGENT_WHEEL_URI" "$wheels/agent.zip"
  python3 -m zipfile -e "$wheels/agent.zip" "$wheels"
  local wheel
  wheel="$(ls "$wheels"/trainer_agent-*-py3-none-any.whl)" || die "$AGENT_WHEEL_URI holds no trainer-agent wheel"
  # Never a package index: the wheel's dependencies travel beside it in the stack's zip (a private subnet has no way
  # out); what the training environment already has (boto3 in a Deep Learning AMI) is kept when it fits.
  "$PYTHON" -m pip install --quiet --no-cache-dir --no-index --find-links "$wheels" "$wheel[aws,nvml]"
}

install_cloudwatch_agent
mkdir -p "$ROOT/var/log/training" "$ROOT$TRAIN_DIR" "$ROOT/etc/stallwatch" "$ROOT/opt/stallwatch/bin" \
  "$ROOT/etc/systemd/system"
"$ROOT$CLOUDWATCH_AGENT_CTL" -a fetch-config -m ec2 -s -c "$(cloudwatch_agent_config)"
install_trainer_agent
[ -z "$TRAIN_CODE_URI" ] || aws s3 sync --only-show-errors "$TRAIN_CODE_URI" "$ROOT$TRAIN_DIR"

# The unit's environment: read by systemd at every start, so a restart needs nothing but the checkpoint.
cat > "$ROOT$ENV_FILE" <<ENV
JOB="$JOB"
STALLWATCH_JOB_NAME="$JOB"
NODES="$NODES"
MASTER_ADDR="$MASTER_ADDR"
RDZV_PORT="$RDZV_PORT"
NPROC_PER_NODE="$NPROC_PER_NODE"
TRAIN_COMMAND="$TRAIN_COMMAND"
PYTHON="$PYTHON"
STALLWATCH_CHECKPOINT_URI="$CHECKPOINT_URI"
MAX_HOURS="$MAX_HOURS"
ENV

cat > "$ROOT$LAUNCHER" <<'LAUNCHER'
#!/usr/bin/env bash
# ExecStart of stallwatch-train.service: torchrun with the job's values (EnvironmentFile=/etc/stallwatch/train.env).
# exec: torchrun is the unit's main process, so a stop's SIGTERM reaches it, and it ends its workers.
set -euo pipefail
read -r -a command <<< "$TRAIN_COMMAND"
# The job's bound: the node powers off MAX_HOURS after the training starts (re-armed at every start), a stopped node
# costing its volumes only; StartInstances brings it back, and its training resumes from the checkpoint.
[ "${MAX_HOURS:-0}" = 0 ] || shutdown -P "+$((MAX_HOURS * 60))" "stallwatch: MAX_HOURS=$MAX_HOURS reached"
exec "$PYTHON" -m torch.distributed.run --nnodes="$NODES" --nproc-per-node="$NPROC_PER_NODE" \
  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$RDZV_PORT" --rdzv-id="$JOB" "${command[@]}"
LAUNCHER
chmod 0755 "$ROOT$LAUNCHER"

cat > "$ROOT/etc/systemd/system/$UNIT" <<UNIT
[Unit]
Description=Stallwatch training job $JOB: torchrun on $NODES nodes (deploy/ec2/user-data.sh)
Wants=network-online.target
After=network-online.target amazon-cloudwatch-agent.service
# A failing training is started again at most 5 times an hour (reset-failed lifts the limit).
StartLimitIntervalSec=3600
StartLimitBurst=5

[Service]
Type=exec
EnvironmentFile=$ENV_FILE
WorkingDirectory=$TRAIN_DIR
ExecStart=$LAUNCHER
# Started again after a failure (a crashed rank); not after a stop, nor when the training ends well.
Restart=on-failure
RestartSec=30
# A stop sends SIGTERM to torchrun, which ends its workers (the trainer agent flushes its last window); whatever
# is left after TimeoutStopSec is killed.
KillMode=mixed
TimeoutStopSec=300
StandardOutput=append:$TRAINING_LOG
StandardError=inherit

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now "$UNIT"
echo "stallwatch user-data: $UNIT started (job $JOB, $NODES nodes, rank 0 at $MASTER_ADDR)"
