#!/bin/sh
# Stallwatch's Prolog on each compute node (docs/deploy.md, "Slurm clusters"): slurmd runs it as root before the
# job's first task on the node. It creates the job's log file on this node, owned by the job's user, mode 0640, in a
# folder only root may write (0755), so no other user of the node can write the job's lines; deploy/slurm's
# stallwatch-log.sh appends the job's output to it, and the CloudWatch agent ships it as the stream
# <instance id>__var_log_stallwatch_slurm_<log key>.<node>.log.
#
#   slurm.conf:   Prolog=/opt/stallwatch/slurm/stallwatch-prolog.sh
#
# It never fails the job: a failing Prolog drains the node and requeues the job, so whatever happens it exits 0
# (what it could not do goes to syslog, tag stallwatch-slurm).
set -u
HERE=$(dirname "$0")
for file in "$HERE/stallwatch-slurm.env" /etc/stallwatch/slurm.env; do
  if [ -r "$file" ]; then
    # shellcheck disable=SC1090 # the site's own settings (STALLWATCH_SLURM_LOG_DIR)
    . "$file"
    break
  fi
done
dir=${STALLWATCH_SLURM_LOG_DIR:-/var/log/stallwatch/slurm}
# shellcheck source=/dev/null # stallwatch-key.sh, installed beside it
. "$HERE/stallwatch-key.sh"

say() {
  logger -t stallwatch-slurm -- "$*" 2>/dev/null || printf 'stallwatch-slurm: %s\n' "$*" >&2
}

case "${SLURM_JOB_ID:-}" in
  '' | *[!0-9]*) say "prolog: SLURM_JOB_ID=${SLURM_JOB_ID:-}: not a job id"; exit 0 ;;
esac
case "${SLURM_JOB_UID:-}" in
  '' | *[!0-9]*) say "prolog: job ${SLURM_JOB_ID}: SLURM_JOB_UID=${SLURM_JOB_UID:-}: not a user id"; exit 0 ;;
esac
node=${SLURMD_NODENAME:-}
case "$node" in
  '' | [!A-Za-z0-9]* | *[!A-Za-z0-9._-]*) say "prolog: SLURMD_NODENAME=$node: not a node name"; exit 0 ;;
esac

# The folder: root's, and no one else's to write (made so if it was not).
if ! mkdir -p "$dir" || ! chown root:root "$dir" || ! chmod 0755 "$dir"; then
  say "prolog: job $SLURM_JOB_ID: could not make $dir root's (0755)"
  exit 0
fi
file="$dir/$(stallwatch_log_key "${SLURM_CLUSTER_NAME:-slurm}" "$SLURM_JOB_ID").$node.log"
# Never through a link, never someone else's file: a file left by an earlier job of this id (a requeue, an id Slurm
# reused) becomes this job's user's.
[ ! -L "$file" ] || rm -f "$file"
if ! (umask 077 && : >> "$file") || ! chown "$SLURM_JOB_UID" "$file" || ! chmod 0640 "$file"; then
  say "prolog: job $SLURM_JOB_ID: could not create $file for uid $SLURM_JOB_UID"
fi
exit 0
