#!/bin/sh
# Sourced by deploy/slurm's node scripts (stallwatch-prolog.sh, stallwatch-log.sh): the name a job's log files are
# named by, as the control plane computes it (lambdas/stallwatch/core/platforms/slurm.py, `log_key`): unique for the
# cluster and the job id. <cluster>-<id> where the cluster has only letters, digits and '_' and the whole fits 63;
# else <the cluster's first 30 bytes>--<12 hex of the sha256 of "cluster\0id\0">-<id>, every other byte made '-'.
#
#   . /opt/stallwatch/slurm/stallwatch-key.sh
#   key=$(stallwatch_log_key "$SLURM_CLUSTER_NAME" "$SLURM_JOB_ID")

stallwatch_log_key() {
  _cluster=${1:-slurm}
  _plain=$(printf '%s-%s' "$_cluster" "$2" | LC_ALL=C tr -c 'A-Za-z0-9_-' '-')
  case "$_cluster" in
    *[!A-Za-z0-9_]*) ;;
    *) if [ "${#_plain}" -le 63 ]; then printf '%s' "$_plain"; return 0; fi ;;
  esac
  _digest=$(printf '%s\000%s\000' "$_cluster" "$2" | sha256sum | cut -c1-12)
  _head=$(printf '%s' "${_plain%%-*}" | cut -c1-30)
  printf '%s' "$(printf '%s--%s-%s' "$_head" "$_digest" "${_plain#*-}" | cut -c1-63 | sed 's/-*$//')"
}
