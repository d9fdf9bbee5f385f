#!/bin/sh
# Stallwatch on a Slurm cluster (docs/deploy.md, "Slurm clusters"): run it from a lifecycle script or a custom action,
# as root, from the folder that holds deploy/slurm (upload it with your lifecycle scripts).
#
#   install.sh --controller --runner    # the controller (ParallelCluster head node, HyperPod controller group)
#   install.sh --runner                 # a login node instead (PCS: its controller is AWS's)
#   install.sh --node                   # each compute node
#
# It copies the scripts to /opt/stallwatch/slurm, writes their settings to /etc/stallwatch/slurm.env from the
# environment (STALLWATCH_TABLE, STALLWATCH_EVENT_BUS, AWS_REGION: the stack's outputs TableName and
# SlurmEventBusName, and its region; STALLWATCH_PLATFORM: parallelcluster, pcs or hyperpod; STALLWATCH_SSM_TARGET,
# STALLWATCH_DEFAULTS, SLURM_CONF where wanted), starts the runner (systemd) and makes the nodes' log folder root's.
# slurm.conf is left to you: it says which lines to set (PrologSlurmctld, EpilogSlurmctld, Prolog).
# STALLWATCH_ROOT installs under another root (a test's); systemd is then left alone.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${STALLWATCH_ROOT:-}
OPT="$ROOT/opt/stallwatch/slurm"
ETC="$ROOT/etc/stallwatch"
SETTINGS="STALLWATCH_TABLE STALLWATCH_EVENT_BUS AWS_REGION STALLWATCH_PLATFORM STALLWATCH_SSM_TARGET STALLWATCH_DEFAULTS
SLURM_CONF STALLWATCH_SLURM_LOG_DIR STALLWATCH_CLUSTER"

controller='' runner='' node=''
for arg in "$@"; do
  case "$arg" in
    --controller) controller=1 ;;
    --runner) runner=1 ;;
    --node) node=1 ;;
    *) echo "usage: install.sh [--controller] [--runner] [--node]" >&2; exit 2 ;;
  esac
done
[ -n "$controller$runner$node" ] || { echo "usage: install.sh [--controller] [--runner] [--node]" >&2; exit 2; }

put() {  # put FILE MODE: deploy/slurm's FILE into /opt/stallwatch/slurm, root's
  install -D -m "$2" "$HERE/$1" "$OPT/$1"
}

mkdir -p "$ETC"
umask 022
{
  echo "# Stallwatch on this Slurm cluster (deploy/slurm/install.sh)"
  for name in $SETTINGS; do
    eval "value=\${$name:-}"
    # shellcheck disable=SC2154 # set by the eval above
    [ -z "$value" ] || printf "%s='%s'\nexport %s\n" "$name" "$(printf '%s' "$value" | tr -d "'")" "$name"
  done
} > "$ETC/slurm.env"
chmod 0644 "$ETC/slurm.env"

if [ -n "$controller" ]; then
  [ -n "${STALLWATCH_EVENT_BUS:-}" ] || echo "install.sh: STALLWATCH_EVENT_BUS is not set: no job event will be posted" >&2
  put stallwatch-events.sh 0755
  echo "slurm.conf: PrologSlurmctld=$OPT/stallwatch-events.sh and EpilogSlurmctld=$OPT/stallwatch-events.sh"
fi
if [ -n "$runner" ]; then
  [ -n "${STALLWATCH_TABLE:-}" ] || { echo "install.sh: STALLWATCH_TABLE is not set (the stack's TableName)" >&2; exit 2; }
  put stallwatch-runner 0755
  install -D -m 0644 "$HERE/stallwatch-runner.service" "$ROOT/etc/systemd/system/stallwatch-runner.service"
  if [ -z "$ROOT" ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload
    systemctl enable --now stallwatch-runner.service
  fi
fi
if [ -n "$node" ]; then
  put stallwatch-prolog.sh 0755
  put stallwatch-key.sh 0644
  put stallwatch-log.sh 0755
  logs="$ROOT${STALLWATCH_SLURM_LOG_DIR:-/var/log/stallwatch/slurm}"
  mkdir -p "$logs"
  chown root:root "$logs"
  chmod 0755 "$logs"
  echo "slurm.conf: Prolog=$OPT/stallwatch-prolog.sh; jobs: srun $OPT/stallwatch-log.sh <command>"
fi
