"""Where a run saves its checkpoint and resumes from it: a local folder, or an ``s3://`` prefix.

    store = checkpoint_store(args.checkpoint_dir or os.environ.get("STALLWATCH_CHECKPOINT_URI"))
    saved = store.load()          # every rank, at start: the newest checkpoint, or None
    store.save(state)             # global rank 0 only: written whole or not at all

SageMaker syncs CheckpointConfig's S3 URI to a local folder (/opt/ml/checkpoints, `--checkpoint-dir`); on EC2
`deploy/ec2/user-data.sh` gives the run its prefix as STALLWATCH_CHECKPOINT_URI. A save goes to a temporary name that
is this process's alone, then replaces the checkpoint in one step (a rename in the folder; in S3 an object appears
whole when its upload completes), so a stop mid-save leaves the previous checkpoint, and no other process writes there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch

CHECKPOINT_FILE = "checkpoint.pt"


class CheckpointStore(Protocol):
    """One checkpoint, `checkpoint.pt`, in a folder (`LocalCheckpoints`) or under an S3 prefix (`S3Checkpoints`)."""

    def save(self, state: dict[str, Any]) -> None: ...

    def load(self) -> dict[str, Any] | None: ...


def checkpoint_store(location: str | Path | None) -> CheckpointStore | None:
    """The store at `location` (a folder, ``file://`` or ``s3://``); None when no location is given."""
    if location is None or str(location) == "":
        return None
    text = str(location)
    if text.startswith("s3://"):
        return S3Checkpoints(text)
    return LocalCheckpoints(Path(text.removeprefix("file://")))


class LocalCheckpoints:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / CHECKPOINT_FILE

    def save(self, state: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=self.directory, prefix=f"{CHECKPOINT_FILE}.", suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as file:
                torch.save(state, file)
            os.replace(partial, self.path)  # atomic within the folder: readers see the old file or the new one
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise

    def load(self) -> dict[str, Any] | None:
        return torch.load(self.path, weights_only=True) if self.path.exists() else None


class S3Checkpoints:
    def __init__(self, uri: str) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.bucket, self.key = bucket, f"{prefix.rstrip('/')}/{CHECKPOINT_FILE}".lstrip("/")
        import boto3  # imported here: only an S3 checkpoint needs it

        self.s3 = boto3.client("s3")

    def save(self, state: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / CHECKPOINT_FILE
            torch.save(state, local)
            self.s3.upload_file(str(local), self.bucket, self.key)

    def load(self) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / CHECKPOINT_FILE
            try:
                self.s3.download_file(self.bucket, self.key, str(local))
            except ClientError as exc:
                if exc.response["Error"]["Code"] in ("404", "NoSuchKey"):
                    return None
                raise
            return torch.load(local, weights_only=True)
