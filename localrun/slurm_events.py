"""Slurm's job events on this machine: deploy/slurm/stallwatch-events.sh as PrologSlurmctld and EpilogSlurmctld,
posting through an `aws` stand-in that keeps each PutEvents request in a spool folder, delivered as EventBridge would.

deploy/slurm's scripts are the ones a cluster installs, copied together beside their settings file
(stallwatch-slurm.env), as in /opt/stallwatch/slurm; only `aws events put-events` is played here: the stand-in writes
the request's entries to the spool and answers as PutEvents does (or fails, `failing=True`, as an unreachable AWS
would).

    spool = EventSpool(tmp / "events", ssm_target="i-0abc...")
    script = spool.install(slurm_conf)          # PrologSlurmctld=script, EpilogSlurmctld=script
    spool.folder / "stallwatch-prolog.sh"       # each node's Prolog; stallwatch-log.sh wraps a job's tasks
    for event in spool.take(): ...              # "Slurm Job State Change" events, oldest first, each once
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY_SLURM = REPO_ROOT / "deploy" / "slurm"
EVENTS_SCRIPT = DEPLOY_SLURM / "stallwatch-events.sh"
NODE_SCRIPTS = ("stallwatch-prolog.sh", "stallwatch-key.sh", "stallwatch-log.sh")
EVENT_BUS = "stallwatch-slurm"  # the stack's Slurm bus (its output SlurmEventBusName)
SETTINGS_FILE = "stallwatch-slurm.env"
ACCOUNT = "123456789012"
REGION = "us-east-1"

# `aws events put-events --entries file://F`: F's entries kept in the spool; anything else refused.
AWS_STAND_IN = """#!/bin/sh
[ "$1 $2" = "events put-events" ] || { echo "stand-in aws: only events put-events" >&2; exit 2; }
[ -z "${STALLWATCH_AWS_FAILS:-}" ] || { echo "Could not connect to the endpoint URL" >&2; exit 255; }
shift 2
while [ $# -gt 0 ]; do
  case "$1" in
    --entries) entries=${2#file://}; shift 2 ;;
    *) shift ;;
  esac
done
name=$(date +%s%N)-$$
cp "$entries" "SPOOL/$name.tmp" && mv "SPOOL/$name.tmp" "SPOOL/$name.json"
printf '{\\n    "FailedEntryCount": 0,\\n    "Entries": [{"EventId": "%s"}]\\n}\\n' "$name"
"""


class EventSpool:
    """The events the script posted, kept in `folder` until taken."""

    def __init__(
        self, folder: Path, ssm_target: str, platform: str = "slurm", failing: bool = False, log_dir: Path | None = None
    ):
        self.folder = folder
        self.log_dir = log_dir or folder / "logs"  # the nodes' log files (/var/log/stallwatch/slurm on a cluster)
        self.settings = {
            "STALLWATCH_PLATFORM": platform,
            "STALLWATCH_SSM_TARGET": ssm_target,
            "STALLWATCH_EVENT_BUS": EVENT_BUS,
            "STALLWATCH_SLURM_LOG_DIR": str(self.log_dir),
            "AWS_REGION": REGION,
        } | ({"STALLWATCH_AWS_FAILS": "1"} if failing else {})
        self._taken: set[str] = set()

    def install(self, slurm_conf: Path, defaults: str = "") -> Path:
        """deploy/slurm's scripts and their settings (this cluster's SLURM_CONF, the stand-in first on PATH) in the
        spool's folder; the events script's path, for PrologSlurmctld and EpilogSlurmctld."""
        bin_dir = self.folder / "bin"
        (self.folder / "spool").mkdir(parents=True, exist_ok=True)
        bin_dir.mkdir(exist_ok=True)
        stand_in = bin_dir / "aws"
        stand_in.write_text(AWS_STAND_IN.replace("SPOOL", str(self.folder / "spool")))
        stand_in.chmod(0o755)
        script = self.folder / EVENTS_SCRIPT.name
        for name in (EVENTS_SCRIPT.name, *NODE_SCRIPTS):
            shutil.copyfile(DEPLOY_SLURM / name, self.folder / name)
            (self.folder / name).chmod(0o755)
        settings = self.settings | {
            "SLURM_CONF": str(slurm_conf),
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "STALLWATCH_DEFAULTS": defaults,
        }
        (self.folder / SETTINGS_FILE).write_text("".join(f"{k}='{v}'\nexport {k}\n" for k, v in settings.items()))
        return script

    @property
    def node_prolog(self) -> Path:
        """Each node's Prolog, installed beside the events script."""
        return self.folder / "stallwatch-prolog.sh"

    @property
    def log_wrapper(self) -> Path:
        return self.folder / "stallwatch-log.sh"

    def take(self) -> list[dict[str, Any]]:
        """The events posted since the last call, as EventBridge delivers them to a rule's target."""
        events = []
        for path in sorted((self.folder / "spool").glob("*.json")):
            if path.name in self._taken:
                continue
            self._taken.add(path.name)
            for entry in json.loads(path.read_text()):
                events.append(delivered(entry, path.stat().st_mtime))
        return events

    def wait(self, count: int, timeout_s: float, keep: Callable[[dict[str, Any]], bool] = bool) -> list[dict[str, Any]]:
        """At least `count` new events that `keep` wants (others are taken and dropped: an earlier job's), waiting
        up to `timeout_s` (fewer if they do not come)."""
        deadline = time.monotonic() + timeout_s
        events = [e for e in self.take() if keep(e)]
        while len(events) < count and time.monotonic() < deadline:
            time.sleep(0.1)
            events += [e for e in self.take() if keep(e)]
        return events


def delivered(entry: dict[str, Any], t: float) -> dict[str, Any]:
    """A PutEvents entry as EventBridge hands it to a target: its Detail parsed, the envelope's fields around it."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": entry["DetailType"],
        "source": entry["Source"],
        "account": ACCOUNT,
        "time": datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": entry.get("Resources", []),
        "detail": json.loads(entry["Detail"]),
    }
