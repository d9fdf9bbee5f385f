#!/bin/sh
# A Slurm job's output on each node as one file per job per node, which deploy/slurm/cloudwatch-agent.json sends to
# CloudWatch Logs as one stream per job per node (docs/deploy.md, "Slurm clusters"):
#
#   srun /opt/stallwatch/slurm/stallwatch-log.sh python train.py ...
#
# runs the command with its stdout and stderr appended to /var/log/stallwatch/slurm/<job id>-<node>.log (the agent's
# stream: <instance id>__var_log_stallwatch_slurm_<job id>-<node>.log). Every task of a node appends to the node's
# file; the command is exec'd, so Slurm's signals (scancel, the time limit) reach it as they would without this.
set -eu
dir=${STALLWATCH_SLURM_LOG_DIR:-/var/log/stallwatch/slurm}
job=${SLURM_JOB_ID:?stallwatch-log.sh runs inside a Slurm job (srun)}
node=${SLURMD_NODENAME:?stallwatch-log.sh runs inside a Slurm job (srun)}
[ "$#" -gt 0 ] || { echo "usage: srun stallwatch-log.sh COMMAND [ARG...]" >&2; exit 2; }
exec >> "$dir/$job-$node.log" 2>&1
exec "$@"
