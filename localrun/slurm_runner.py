"""deploy/slurm/stallwatch-runner on this machine's Slurm controller, against the local AWS (moto's server): the
runner a cluster installs, run as a child process with the cluster's SLURM_CONF and the AWS CLI pointed at moto.

    with RunnerProcess(daemons, aws.env, table) as runner:    # polls every POLL_S seconds until the block ends
        ...
    RunnerProcess(daemons, aws.env, table).once()             # answers what waits, then returns (its output)
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from localrun.slurm_daemons import SlurmDaemons

RUNNER = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "stallwatch-runner"
# Each poll is an AWS CLI call, whose start alone costs about half a CPU-second (aws-cli's imports): the deployed
# runner's 5 s, so the local runs do not spend a core on polling.
POLL_S = 5.0
ONCE_TIMEOUT_S = 300.0
STOP_GRACE_S = 10.0


@functools.cache
def aws_cli() -> Path:
    """The AWS CLI the runner calls: PATH's, or, where PATH finds pyenv's shim (a shell script that looks up the
    version at every start, a tenth of a CPU-second), the executable it stands for."""
    found = shutil.which("aws")
    if found is None:
        raise FileNotFoundError("the AWS CLI (aws) is not on PATH: the runner calls it")
    pyenv = shutil.which("pyenv")
    if Path(found).parent.name == "shims" and pyenv is not None:
        done = subprocess.run([pyenv, "which", "aws"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and Path(done.stdout.strip()).is_file():
            return Path(done.stdout.strip())
    return Path(found)


class RunnerProcess:
    """The runner of `daemons`' cluster, answering through `table` of the AWS `aws_env` points at."""

    def __init__(self, daemons: SlurmDaemons, aws_env: dict[str, str], table: str, log: Path | None = None) -> None:
        self.daemons = daemons
        self.aws_env = aws_env
        self.table = table
        self.log = log or daemons.root / "log" / "runner.out"
        self._process: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        aws = shutil.which("aws")
        if aws is None:
            raise FileNotFoundError("the AWS CLI (aws) is not on PATH: the runner calls it")
        path = os.pathsep.join([str(Path(aws).parent), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        keep = {k: v for k, v in os.environ.items() if k.startswith(("PYENV", "HOME", "LANG"))}
        return (
            keep
            | self.aws_env
            | {
                "PATH": path,
                "SLURM_CONF": str(self.daemons.conf),
                "STALLWATCH_TABLE": self.table,
                "STALLWATCH_RUNNER_POLL_S": str(POLL_S),
            }
        )

    def once(self) -> str:
        """One poll: every command waiting answered; the runner's output."""
        done = subprocess.run(
            [str(RUNNER), "--once"], env=self.env(), capture_output=True, text=True, timeout=ONCE_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"stallwatch-runner --once exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return done.stderr

    def __enter__(self) -> RunnerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                [str(RUNNER)], env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """The runner stopped (SIGTERM, then SIGKILL after `STOP_GRACE_S`)."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
