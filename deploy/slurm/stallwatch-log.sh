#!/bin/sh
# A Slurm job's output on each node as one file per job per node, which deploy/slurm/cloudwatch-agent.json sends to
# CloudWatch Logs as one stream per job per node (docs/deploy.md, "Slurm clusters"):
#
#   srun /opt/stallwatch/slurm/stallwatch-log.sh python train.py ...
#
# runs the command with its stdout and stderr appended to /var/log/stallwatch/slurm/<log key>.<node>.log, the file
# the node's Prolog created for the job's user (deploy/slurm/stallwatch-prolog.sh; <log key>: stallwatch-key.sh); the
# agent's stream: <instance id>__var_log_stallwatch_slurm_<log key>.<node>.log. Every task of a node appends to the
# node's file; the command is exec'd, so Slurm's signals (scancel, the time limit) reach it as they would without this.
# Where the file is not there to append to (the Prolog is not installed), the command runs all the same, its output
# where Slurm puts it.
set -eu
HERE=$(dirname "$0")
dir=${STALLWATCH_SLURM_LOG_DIR:-}
for file in "$HERE/stallwatch-slurm.env" /etc/stallwatch/slurm.env; do  # the site's folder, as the Prolog reads it
  if [ -n "$dir" ] || [ ! -r "$file" ]; then continue; fi
  dir=$(sed -n "s/^STALLWATCH_SLURM_LOG_DIR=[\"']\{0,1\}\([^\"']*\)[\"']\{0,1\}$/\1/p" "$file" | tail -n 1)
done
dir=${dir:-/var/log/stallwatch/slurm}
id=${SLURM_JOB_ID:?stallwatch-log.sh runs inside a Slurm job (srun)}
node=${SLURMD_NODENAME:?stallwatch-log.sh runs inside a Slurm job (srun)}
[ "$#" -gt 0 ] || { echo "usage: srun stallwatch-log.sh COMMAND [ARG...]" >&2; exit 2; }
# shellcheck source=/dev/null # stallwatch-key.sh, installed beside it
. "$HERE/stallwatch-key.sh"
file="$dir/$(stallwatch_log_key "${SLURM_CLUSTER_NAME:-slurm}" "$id").$node.log"
if [ -f "$file" ] && [ ! -L "$file" ] && [ -w "$file" ]; then
  exec >> "$file" 2>&1
else
  echo "stallwatch-log.sh: $file is not this job's to write (is deploy/slurm/stallwatch-prolog.sh the Prolog?)" >&2
fi
exec "$@"
