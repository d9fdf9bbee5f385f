"""What Slurm jobs and their nodes' streams are named (pure): a job's JobName, unique for its cluster and id, as the
agent names it; its log key; a node's output stream as the CloudWatch agent names it.

    slurm_job_name("pc1", "42", "llm")        # "pc1-42-llm"
    stream_name(instance, log_key("pc1", "42"), "node2")  # i-..._var_log_stallwatch_slurm_pc1-42.node2.log
    parse_stream(stream)                      # StreamOf(instance, key, node), or None
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from stallwatch.core.names import HASH_CHARS

NAME_MAX = 63  # mirrors trainer_agent.contract.SLURM_NAME_MAX (tests/test_contract.py)
PLAIN_CLUSTER = re.compile(r"^[A-Za-z0-9_]+\Z")  # a cluster name that `slurm_job_name` can show as it is
HASHED_HEAD_MAX = 30  # of a hashed name, the cluster's first characters kept before its hash
# The CloudWatch agent's stream of a node's output file (deploy/slurm/cloudwatch-agent.json: log_stream_name
# "{instance_id}" with publish_multi_logs): the instance id, '_', the file's path with '/' as '_'. The file is
# /var/log/stallwatch/slurm/<log key>.<node>.log, which the nodes' Prolog creates (deploy/slurm/stallwatch-prolog.sh).
LOG_DIR_PART = "_var_log_stallwatch_slurm_"
STREAM = re.compile(
    r"^(?P<instance>i-[0-9a-f]{8,17})_"
    + LOG_DIR_PART
    + r"(?P<key>[A-Za-z0-9_-]{1,63})\.(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,63})\.log\Z"
)


def slurm_job_name(cluster: str, job_id: str, name: str) -> str:
    """A Slurm job's JobName, unique by construction for its cluster and id: ``<cluster>-<id>-<name>`` (every byte
    but letters, digits, '-' and '_' made '-'), where the cluster has no '-' and the whole fits 63; else
    ``<cluster start>--<hash>-<id>-<name>`` cut to 63, the hash (`core.names.HASH_CHARS` of the sha256 of cluster, id
    and name) kept whole. A plain name reads back to one cluster and id (the cluster ends at its first '-', the id is
    digits); a hashed one never reads as a plain one ('--' right after its first part); so ``('a-1', '2', 'x')`` and
    ``('a', '1', '2-x')`` stay two names, as do jobs 123 and 124 of a 60-character cluster. The agent's
    `trainer_agent.contract.slurm_job_name` and deploy/slurm/stallwatch-key.sh compute the same."""
    cluster = cluster or "slurm"
    plain = _cleaned("-".join(part for part in (cluster, job_id, name) if part))
    if PLAIN_CLUSTER.match(cluster) and len(plain) <= NAME_MAX:
        return plain
    digest = hashlib.sha256("\0".join((cluster, job_id, name)).encode()).hexdigest()[:HASH_CHARS]
    head, _, rest = plain.partition("-")
    head = head[:HASHED_HEAD_MAX]
    return f"{head}--{digest}-{rest}"[:NAME_MAX].rstrip("-")


def plain_parts(name: str) -> tuple[str, str] | None:
    """The cluster and id a plain `slurm_job_name` reads back to (``pc1-42-llm`` -> ("pc1", "42")); None for a hashed
    name, which reads back to none."""
    found = re.match(r"^([A-Za-z0-9_]+)-([0-9]+)(?:-|\Z)", name)
    return (found[1], found[2]) if found else None


def _cleaned(text: str) -> str:
    return "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-_") else "-" for b in text.encode())


def log_key(cluster: str, job_id: str) -> str:
    """What a job's log files and streams are named by (`slurm_job_name` without the job's name, which the nodes'
    `Prolog` is not told): unique for the cluster and id."""
    return slurm_job_name(cluster, job_id, "")


def stream_name(instance: str, key: str, node: str) -> str:
    """The CloudWatch agent's stream of `node`'s output file of the job of `key` (`log_key`), on EC2 instance
    `instance`."""
    return f"{instance}_{LOG_DIR_PART}{key}.{node}.log"


@dataclass(frozen=True)
class StreamOf:
    """What a Slurm stream's name says: the instance that wrote it, the job's log key, the node."""

    instance: str
    key: str
    node: str


def parse_stream(stream: str) -> StreamOf | None:
    """What `stream`'s name says (`stream_name`); None for a stream no Slurm node's agent writes."""
    found = STREAM.match(stream)
    return None if found is None else StreamOf(found["instance"], found["key"], found["node"])
