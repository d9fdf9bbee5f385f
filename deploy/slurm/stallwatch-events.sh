#!/bin/sh
# Stallwatch's PrologSlurmctld and EpilogSlurmctld (docs/deploy.md, "Slurm clusters"): one EventBridge event per job
# start and end, which the control plane's on_job_state turns into the job's alarms (and, at its end, retires them).
#
#   slurm.conf:   PrologSlurmctld=/opt/stallwatch/slurm/stallwatch-events.sh
#                 EpilogSlurmctld=/opt/stallwatch/slurm/stallwatch-events.sh
#
# slurmctld runs it on the controller, as SlurmUser, with the job's SLURM_* variables and nothing else (no PATH, no
# SLURM_CONF): its settings come from stallwatch-slurm.env beside it, else /etc/stallwatch/slurm.env. The job is named
# <ClusterName>-<job id>-<job name> (SLURM_CLUSTER_NAME), as the agent names it on the nodes.
#   STALLWATCH_PLATFORM     parallelcluster, pcs, hyperpod or slurm (what the control plane may do with the nodes)
#   STALLWATCH_SSM_TARGET   the controller's SSM name: its instance id (default: from instance metadata; the nodes
#                           are matched to instances in its VPC); on HyperPod, sagemaker-cluster:<cluster-id>_
#                           <controller-group>-<instance-id> (its cluster id names the cluster to SageMaker's APIs)
#   STALLWATCH_DEFAULTS     the cluster's own stallwatch:* settings, which a job's override
#   STALLWATCH_EVENT_BUS    the stack's Slurm event bus (its output SlurmEventBusName; only it is listened to, and
#                           only the controllers' role may put events on it); AWS_REGION: the stack's region
#   SLURM_CONF, PATH        where scontrol and the configuration are (ParallelCluster: /opt/slurm/bin)
# A job's settings are the `stallwatch:NAME=VALUE` words of its --comment (`sbatch --comment="stallwatch:mode=enforce
# stallwatch:stall-minutes=20"`); where a site uses the comment for something else, the words may stand among other
# text, or go in --extra (Slurm 23.02 and later), which the comment overrides.
#
# It never fails the job: whatever happens it exits 0 (a failing PrologSlurmctld would requeue or hold the job), and
# AWS is given at most POST_TIMEOUT_S seconds. What it could not post is logged to syslog (tag stallwatch-slurm).
set -u

HERE=$(dirname "$0")
for file in "$HERE/stallwatch-slurm.env" /etc/stallwatch/slurm.env; do
  if [ -r "$file" ]; then
    # shellcheck disable=SC1090 # the site's own settings
    . "$file"
    break
  fi
done
PATH="${PATH:+$PATH:}/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
export PATH
[ -z "${SLURM_CONF:-}" ] || export SLURM_CONF
POST_TIMEOUT_S=${POST_TIMEOUT_S:-20}
SOURCE=stallwatch.slurm
DETAIL_TYPE="Slurm Job State Change"
MAX_NODES=2000  # the event stays far below PutEvents' 256 KB
FINAL_STATE_WAIT_S=30  # after the epilog, the job's final state is read within this
SETTING='^stallwatch:[a-z0-9-]{1,64}=[A-Za-z0-9_.:/+-]{0,256}$'

say() {
  logger -t stallwatch-slurm -- "$*" 2>/dev/null || printf 'stallwatch-slurm: %s\n' "$*" >&2
}

json() {  # a JSON string of $1: backslash and quote escaped, control characters dropped, at most 512 bytes
  printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\037' | cut -c1-512 | sed 's/\\/\\\\/g; s/"/\\"/g')"
}

settings() {  # the stallwatch:NAME=VALUE words of $@ (defaults first, so later ones win) as JSON members
  # shellcheck disable=SC2020 # each separator becomes a newline
  printf '%s\n' "$@" | tr ' ,;\t' '\n\n\n\n' | grep -E "$SETTING" | awk -F= '
    { name = $1; value = substr($0, length(name) + 2); if (!(name in seen)) order[++n] = name; seen[name] = value }
    END { for (i = 1; i <= n; i++) printf "%s\"%s\":\"%s\"", (i > 1 ? "," : ""), order[i], seen[order[i]] }'
}

imds() {  # an instance-metadata path (IMDSv2); empty off EC2
  token=$(curl -fsS -m 2 -X PUT http://169.254.169.254/latest/api/token \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 60" 2>/dev/null) || return 0
  curl -fsS -m 2 -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/$1" 2>/dev/null || true
}

case "${SLURM_SCRIPT_CONTEXT:-}" in
  prolog_slurmctld) state=started ;;
  epilog_slurmctld) state=ended ;;
  *) say "not run by slurmctld as PrologSlurmctld or EpilogSlurmctld (SLURM_SCRIPT_CONTEXT=${SLURM_SCRIPT_CONTEXT:-})"
     exit 0 ;;
esac
job_id=${SLURM_JOB_ID:-}
case "$job_id" in
  '' | *[!0-9]*) say "SLURM_JOB_ID=$job_id: not a job id"; exit 0 ;;
esac
[ -n "${STALLWATCH_EVENT_BUS:-}" ] || { say "job $job_id: STALLWATCH_EVENT_BUS is not set: nothing posted"; exit 0; }
# The restart count slurmctld gave this run of the script: a requeue for a failed node raises the job's after it, so
# a job whose count is higher by the time it is read was requeued.
attempt=${SLURM_JOB_RESTART_COUNT:-0}
case "$attempt" in
  '' | *[!0-9]*) attempt=0 ;;
esac

fields() {  # squeue's fields of the job, '|'-separated: no job name or comment can stand among them
  squeue -h -t all -j "$job_id" -O "SubmitTime:|,StartTime:|,State:|,TimeLimit:|,RestartCnt:|,Reason:|,EndTime:|" \
    2>/dev/null | head -n 1
}
# What the environment lacks: the submit time (Slurm reuses ids; the key holds it), the state, the time limit, why it
# ended. While the epilog runs the job is COMPLETING whatever its end: a requeued job has no end time yet (it runs
# again), any other's final state (COMPLETED, CANCELLED, FAILED, TIMEOUT, PREEMPTED...) is read once the epilog has
# returned, by a copy of this script detached from slurmctld (which waits for its epilog's every process).
IFS='|' read -r submit_time start_time job_state time_limit restarts reason end_time <<FIELDS
$(fields)
FIELDS
# The detached copy (below) is given the attempt's submit time as the epilog read it: by the time the copy reads the
# job again, a requeue may have given the next attempt its own.
[ "${1:-}" != --after-epilog ] || [ -z "${2:-}" ] || attempt_submit=$2
if [ "$state" = ended ]; then
  attempt_submit=${attempt_submit:-${submit_time:-}}
  case "${end_time:-}" in
    NONE | Unknown | N/A) job_state=REQUEUED ;;
    *)
      if [ "${1:-}" = --after-epilog ]; then
        trap '' HUP INT TERM
        waited=0
        while [ "${job_state:-COMPLETING}" = COMPLETING ] && [ "$waited" -lt "$FINAL_STATE_WAIT_S" ]; do
          sleep 1
          waited=$((waited + 1))
          IFS='|' read -r submit_time start_time job_state time_limit restarts reason end_time <<FIELDS
$(fields)
FIELDS
        done
      elif command -v setsid >/dev/null 2>&1; then
        # A subshell's child (init's once it returns), signals ignored from its start: slurmctld's cleanup of its
        # epilog may signal what the epilog started, and the end must still be posted
        (trap '' HUP INT TERM; setsid "$0" --after-epilog "$attempt_submit" </dev/null >/dev/null 2>&1 &)
        exit 0
      fi ;;
  esac
  # Slurm requeued the job (a node failed; scontrol requeue): the attempt ended REQUEUED, whatever the job is now
  case "${restarts:-}" in
    '' | *[!0-9]*) ;;
    *) [ "$restarts" -le "$attempt" ] || job_state=REQUEUED ;;
  esac
  case "${job_state:-}" in
    PENDING | REQUEUE_HOLD | REQUEUE_FED | CONFIGURING | RUNNING) job_state=REQUEUED ;;
  esac
  # The attempt that ended: its own submit time and restart count (Slurm counts the requeue at once)
  submit_time=$attempt_submit
  if [ "$job_state" = REQUEUED ] && [ "${restarts:-0}" -gt 0 ] 2>/dev/null; then
    restarts=$((restarts - 1))
  fi
fi
epoch() {  # a Slurm time (the controller's local time) in epoch seconds; 0 for none (N/A, Unknown, empty)
  case "$1" in
    [0-9][0-9][0-9][0-9]-*) date -d "$1" +%s 2>/dev/null || echo 0 ;;
    *) echo 0 ;;
  esac
}
submit_epoch=$(epoch "${submit_time:-}")
start_epoch=$(epoch "${start_time:-}")
node_list=${SLURM_JOB_NODELIST:-}

nodes=""
count=0
if [ -n "$node_list" ]; then
  for node in $(scontrol show hostnames "$node_list" 2>/dev/null | head -n "$MAX_NODES"); do
    record=$(scontrol -o show node "$node" 2>/dev/null | tr ' ' '\n')
    addr=$(printf '%s\n' "$record" | sed -n 's/^NodeAddr=//p' | head -n 1)
    # Gres=gpu:8, gpu:h100:8(S:0-1) or gpu:h100:4,gpu:a100:4: the node's GPUs, where no EC2 instance tells them
    gpus=$(printf '%s\n' "$record" | sed -n 's/^Gres=//p' | head -n 1 | tr ',' '\n' \
      | sed -n 's/([^)]*)//; s/^gpu:\(.*:\)\{0,1\}\([0-9][0-9]*\)$/\2/p' | awk '{ n += $1 } END { print n + 0 }')
    nodes="$nodes${nodes:+,}{\"name\":$(json "$node"),\"addr\":$(json "$addr"),\"gpus\":${gpus:-0}}"
    count=$((count + 1))
  done
fi

cluster=${SLURM_CLUSTER_NAME:-slurm}
target=${STALLWATCH_SSM_TARGET:-$(imds meta-data/instance-id)}
detail=$(printf '{"version":1,"state":"%s","cluster":%s,"platform":%s,"ssm_target":%s,"job_id":"%s",' \
  "$state" "$(json "$cluster")" "$(json "${STALLWATCH_PLATFORM:-slurm}")" "$(json "$target")" "$job_id"
  printf '"name":%s,"user":%s,"partition":%s,' \
    "$(json "${SLURM_JOB_NAME:-}")" "$(json "${SLURM_JOB_USER:-}")" "$(json "${SLURM_JOB_PARTITION:-}")"
  printf '"submit_time":%s,"submit_epoch":%s,"start_epoch":%s,"job_state":%s,"time_limit":%s,' \
    "$(json "${submit_time:-}")" "${submit_epoch:-0}" "${start_epoch:-0}" "$(json "${job_state:-}")" "$(json "${time_limit:-}")"
  printf '"restarts":%s,"exit_code":%s,"reason":%s,"node_list":%s,"node_count":%s,"nodes":[%s],"settings":{%s}}' \
    "${restarts:-${SLURM_JOB_RESTART_COUNT:-0}}" "$(json "${SLURM_JOB_EXIT_CODE2:-}")" "$(json "${reason:-}")" \
    "$(json "$node_list")" \
    "$count" "$nodes" "$(settings "${STALLWATCH_DEFAULTS:-}" "${SLURM_JOB_EXTRA:-}" "${SLURM_JOB_COMMENT:-}")")

entries=$(mktemp "${TMPDIR:-/tmp}/stallwatch-event.XXXXXX") || { say "job $job_id: no temporary file"; exit 0; }
trap 'rm -f "$entries"' EXIT
escaped=$(printf '%s' "$detail" | sed 's/\\/\\\\/g; s/"/\\"/g')
printf '[{"Source":"%s","DetailType":"%s","EventBusName":"%s","Detail":"%s"}]\n' \
  "$SOURCE" "$DETAIL_TYPE" "$STALLWATCH_EVENT_BUS" "$escaped" > "$entries"
if ! answer=$(timeout "$POST_TIMEOUT_S" aws events put-events --entries "file://$entries" --output json 2>&1); then
  say "job $job_id $state: PutEvents failed: $(printf '%s' "$answer" | head -c 300)"
elif printf '%s' "$answer" | grep -q '"FailedEntryCount": *[1-9]'; then
  say "job $job_id $state: PutEvents refused the event: $(printf '%s' "$answer" | head -c 300)"
fi
exit 0
