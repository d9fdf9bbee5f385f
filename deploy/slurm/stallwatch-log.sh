#!/bin/sh
# A Slurm job's output on each node as one file per job per node, which deploy/slurm/cloudwatch-agent.json sends to
# CloudWatch Logs as one stream per job per node (docs/deploy.md, "Slurm clusters"):
#
#   srun /opt/stallwatch/slurm/stallwatch-log.sh python train.py ...
#
# runs the command with its stdout and stderr appended to /var/log/stallwatch/slurm/<job>.<node>.log, <job> the name
# the agent and the control plane give the job (<ClusterName>-<job id>-<job name>, each byte but letters, digits, '-'
# and '_' made '-', at most 63: trainer_agent.contract.slurm_job_name); the agent's stream:
# <instance id>__var_log_stallwatch_slurm_<job>.<node>.log. Every task of a node appends to the node's file; the
# command is exec'd, so Slurm's signals (scancel, the time limit) reach it as they would without this.
set -eu
dir=${STALLWATCH_SLURM_LOG_DIR:-/var/log/stallwatch/slurm}
id=${SLURM_JOB_ID:?stallwatch-log.sh runs inside a Slurm job (srun)}
node=${SLURMD_NODENAME:?stallwatch-log.sh runs inside a Slurm job (srun)}
[ "$#" -gt 0 ] || { echo "usage: srun stallwatch-log.sh COMMAND [ARG...]" >&2; exit 2; }
job=$(printf '%s' "${SLURM_CLUSTER_NAME:-slurm}-$id${SLURM_JOB_NAME:+-$SLURM_JOB_NAME}" \
  | LC_ALL=C tr -c 'A-Za-z0-9_-' '-' | LC_ALL=C cut -b 1-63)
exec >> "$dir/$job.$node.log" 2>&1
exec "$@"
