"""A real Slurm on this machine: munged, slurmctld and one slurmd per node, in a folder of their own.

Debian's slurm-wlm 22.05 and munge (`make slurm`). Every daemon runs in the foreground as a child of this process,
with its own munge socket, key, ports, state and logs under `root`, so two runs (two pytest workers, a test and the
demo) never meet; leaving the block stops them all, whatever happened inside it.

    with SlurmDaemons(tmp / "slurm", nodes=3) as slurm:
        job = slurm.sbatch(["--nodes=2", "--wrap", "srun hostname"])
        slurm.job(job)["JobState"]                     # "RUNNING"
        slurm.scontrol("update", "nodename=node2", "state=drain", "reason=why")

`prolog` and `epilog` become PrologSlurmctld and EpilogSlurmctld (deploy/slurm/stallwatch-events.sh in the demo),
`node_prolog` each node's Prolog (deploy/slurm/stallwatch-prolog.sh).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "scancel", "squeue", "sinfo")
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
COMMAND_TIMEOUT_S = 30.0
POLL_S = 0.2
# A requeued job waits for its old credential to expire before it may start again (120 s by default).
CRED_EXPIRE_S = 5
# `scontrol -o show job`'s fields: CamelCase keys; a comment's lowercase `stallwatch:x=y` words are not keys.
FIELD = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")
IDLE_STATES = frozenset({"IDLE"})
OUT_OF_SERVICE = ("DRAIN", "FAIL", "DOWN")  # words of a node state that `state=resume` returns to service
# Each node its own address, as on a cluster (127.0.0.0/8 is all this machine's): node1 is 127.0.0.11.
NODE_ADDRESS_PREFIX = "127.0.0."
FIRST_NODE_ADDRESS = 11


class SlurmNotInstalledError(RuntimeError):
    """munged, slurmctld or slurmd is missing: `make slurm` installs them (root, apt)."""


class SlurmError(RuntimeError):
    """A daemon did not start, or a Slurm command failed; the message holds its output and the daemons' log tails."""


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks (empty: `SlurmDaemons` can run)."""
    return [name for name in (*DAEMONS, *CLIENTS, "munge") if shutil.which(name) is None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def parse_fields(line: str) -> dict[str, str]:
    """One `scontrol -o show job|node` record as {key: value}; values may hold spaces (a comment, a reason)."""
    keys = list(FIELD.finditer(line))
    fields = {}
    for match, following in zip(keys, [*keys[1:], None], strict=True):
        end = following.start() if following is not None else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


class SlurmDaemons:
    """munged, slurmctld and `nodes` slurmds (node1..nodeN, one CPU each) in one partition, under `root`."""

    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        cluster: str = "local",
        prolog: Path | None = None,
        epilog: Path | None = None,
        partition: str = "train",
        node_prolog: Path | None = None,
    ) -> None:
        self.root = root
        self.cluster = cluster
        self.partition = partition
        self.nodes = tuple(f"node{i}" for i in range(1, nodes + 1))
        self.prolog, self.epilog = prolog, epilog
        self.node_prolog = node_prolog  # each node's Prolog (slurmd runs it as root)
        self.conf = root / "slurm.conf"
        # Unix sockets (munged's, each job step's in the spool) need paths under 108 bytes: a short folder of their own.
        self.sockets = Path(tempfile.mkdtemp(prefix="swslurm-"))
        self.socket = self.sockets / "munge.socket"
        self.logs = root / "log"
        self._processes: list[tuple[str, subprocess.Popen[bytes]]] = []

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def __enter__(self) -> SlurmDaemons:
        missing = missing_programs()
        if missing:
            shutil.rmtree(self.sockets, ignore_errors=True)
            raise SlurmNotInstalledError(f"{', '.join(missing)} not found: run `make slurm` (root: apt-get install)")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self) -> None:
        for sub in ("munge", "state", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.sockets / node).mkdir()
        (self.root / "munge").chmod(0o700)  # munged refuses a key or socket others may write
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                f"--log-file={self.logs / 'munged.log'}",
            ],
        )
        self._wait(lambda: self.socket.exists(), "munged's socket")
        self.conf.write_text(self._config())
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._wait(lambda: self._ping(), "slurmctld to answer")
        for node in self.nodes:
            self._spawn(f"slurmd {node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait(lambda: all(self.node_state(n) in IDLE_STATES for n in self.nodes), "every node idle")

    def _config(self) -> str:
        ports = {node: free_port() for node in self.nodes}
        lines = [
            f"ClusterName={self.cluster}",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.sockets / '%n'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "ReturnToService=2",
            "SelectType=select/cons_tres",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            # The scheduler looks every second, so a requeued job starts as soon as it may.
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "KillWait=5",
            # A busy two-core machine answers slowly: the defaults (10 s) fail launches there, never on a quiet one.
            "MessageTimeout=60",
            "BatchStartTimeout=120",
        ]
        if self.prolog is not None:
            lines.append(f"PrologSlurmctld={self.prolog}")
        if self.epilog is not None:
            lines.append(f"EpilogSlurmctld={self.epilog}")
        if self.node_prolog is not None:
            lines.append(f"Prolog={self.node_prolog}")
        lines += [
            f"NodeName={node} NodeHostname=localhost NodeAddr={self.address(node)} Port={port} CPUs=1 State=UNKNOWN"
            for node, port in ports.items()
        ]
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP"
        )
        return "\n".join(lines) + "\n"

    def address(self, node: str) -> str:
        """The node's own loopback address (its NodeAddr: the events carry it, and the demo's instances have it)."""
        return f"{NODE_ADDRESS_PREFIX}{FIRST_NODE_ADDRESS + self.nodes.index(node)}"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.logs / f"{name.replace(' ', '-')}.out").open("ab")
        process = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._processes.append((name, process))

    def _wait(self, ready: object, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [name for name, process in self._processes if process.poll() is not None]
            if dead:
                raise SlurmError(f"{', '.join(dead)} exited while waiting for {what}\n{self.log_tails()}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(POLL_S)
        raise SlurmError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.log_tails()}")

    def stop(self) -> None:
        """Cancel what still runs, stop every daemon this instance started (SIGTERM, then SIGKILL after
        `STOP_GRACE_S`), newest first, and kill whatever its jobs left: slurmstepd and the tasks outlive slurmd."""
        if self._processes:
            self._cancel_all()
        for _, process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for _, process in reversed(self._processes):
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        self._kill_leftovers()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def reset(self, timeout_s: float) -> None:
        """Every job cancelled and gone, every node back in service and idle (waiting up to `timeout_s`): where a
        test starts, whatever the one before it left (a job pending or running, a node drained, nodes completing)."""
        jobs = self.command("squeue", "-h", "-o", "%i").split()
        if jobs:
            self.command("scancel", *jobs, check=False)
        for node in self.nodes:
            if any(word in self.node_state(node) for word in OUT_OF_SERVICE):
                self.command("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        self._wait(self._at_rest, "no job and every node idle", timeout_s)

    def wait_for_tasks(self, command: str, count: int, timeout_s: float) -> None:
        """Until `count` processes of this cluster run `command` (its program by name: srun runs it by its path):
        a job's tasks started on its nodes."""

        def started() -> bool:
            lines = [line.partition(" ") for line in self.processes(command).values()]
            return sum(f"{Path(program).name} {args}".strip() == command for program, _, args in lines) >= count

        self._wait(started, f"{count} tasks running {command!r}", timeout_s)

    def _at_rest(self) -> bool:
        try:
            queued = self.command("squeue", "-h", "-o", "%i", check=False).strip()
        except subprocess.TimeoutExpired:
            return False
        return not queued and all(self.node_state(n) in IDLE_STATES for n in self.nodes)

    def _cancel_all(self) -> None:
        """scancel every job, and wait (up to `STOP_GRACE_S`) until Slurm has ended them."""
        deadline = time.monotonic() + STOP_GRACE_S
        try:
            jobs = self.command("squeue", "-h", "-o", "%i", check=False).split()
            if jobs:
                self.command("scancel", *jobs, check=False)
            while jobs and time.monotonic() < deadline and self.command("squeue", "-h", "-o", "%i", check=False):
                time.sleep(POLL_S)
        except subprocess.TimeoutExpired:
            return

    def _kill_leftovers(self) -> None:
        """SIGKILL every process that runs with this cluster's SLURM_CONF: its slurmstepds and their tasks."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def processes(self, command: str = "") -> dict[int, str]:
        """The processes that run with this cluster's SLURM_CONF (its daemons, slurmstepds, jobs' tasks) whose
        command line holds `command`: pid -> command line."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if command in cmdline:
                found[int(entry.name)] = cmdline
        return found

    # ---- commands ---------------------------------------------------------------------------------------------

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with SLURM_CONF naming this cluster's configuration."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def command(self, *argv: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        """Run a Slurm client command against this cluster, in its folder (where a job's default output goes); its
        stdout (SlurmError if it fails and `check`)."""
        done = subprocess.run(
            list(argv),
            env=self.env(env),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def scontrol(self, *args: str) -> str:
        return self.command("scontrol", *args)

    def sbatch(self, args: list[str], env: dict[str, str] | None = None) -> str:
        """Submit a batch job (`sbatch --parsable ARGS`); its id."""
        return self.command("sbatch", "--parsable", *args, env=env).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as fields (JobState, NodeList, Restarts, SubmitTime...); empty once Slurm forgot it."""
        out = self.command("scontrol", "-o", "show", "job", job_id, check=False).strip()
        return parse_fields(out) if out.startswith("JobId=") else {}

    def node(self, name: str) -> dict[str, str]:
        return parse_fields(self.command("scontrol", "-o", "show", "node", name).strip())

    def node_state(self, name: str) -> str:
        """The node's state as scontrol says it (IDLE, ALLOCATED, IDLE+DRAIN, DOWN*...); empty if unreachable."""
        try:
            return self.node(name).get("State", "")
        except (SlurmError, subprocess.TimeoutExpired):
            return ""

    def hostnames(self, node_list: str) -> list[str]:
        """A node list expanded (`node[1-2]` -> node1, node2)."""
        return self.command("scontrol", "show", "hostnames", node_list).split()

    def wait_for(self, job_id: str, states: set[str], timeout_s: float) -> dict[str, str]:
        """The job's fields once its JobState is one of `states` (SlurmError after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(POLL_S)
        raise SlurmError(f"job {job_id} never reached {sorted(states)}: {fields.get('JobState')} ({fields})")

    def _ping(self) -> bool:
        try:
            return "UP" in self.command("scontrol", "ping", check=False)
        except subprocess.TimeoutExpired:
            return False

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for an error message."""
        parts = []
        for path in sorted(self.logs.glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)
