"""The agent's metric names are a contract with the control plane: both sides must agree."""

from stallwatch.core import contract as control_plane
from stallwatch.core import stack_dumps as control_plane_stacks
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms import slurm, slurm_names
from stallwatch.core.signals import LogLine
from trainer_agent import contract as agent
from trainer_agent.identity import Identity
from trainer_agent.stack_dumps import STALL, capture


def test_namespace_and_dimensions_agree():
    assert (agent.NAMESPACE, agent.DIM_JOB, agent.DIM_HOST) == (
        control_plane.NAMESPACE,
        control_plane.DIM_JOB,
        control_plane.DIM_HOST,
    )


def test_job_metrics_agree_in_names_and_units():
    assert agent.JOB_METRICS == control_plane.JOB_METRICS


def test_host_metrics_agree_in_names_and_units():
    assert agent.HOST_METRICS == control_plane.HOST_METRICS


def test_control_plane_metric_is_not_an_agent_metric():
    assert control_plane.LOG_IDLE_SECONDS not in agent.JOB_METRICS | agent.HOST_METRICS


def test_the_agent_reads_the_job_tag_the_control_plane_groups_ec2_instances_by():
    assert agent.JOB_TAG == clusters.JOB_TAG


def test_a_slurm_jobs_name_is_one_the_control_plane_takes_whatever_slurm_allows():
    for name in ("", "a b/c:d", "é" * 80, "x" * 200, "-lead"):
        assert clusters.JOB_NAME.match(agent.slurm_job_name("c", "123456789", name)), name
    assert agent.slurm_job_name("", "7", "") == "slurm-7"


def test_the_agent_and_the_control_plane_name_a_slurm_job_alike():
    assert agent.SLURM_NAME_MAX == slurm_names.NAME_MAX
    for cluster, job_id, name in (("pc1", "42", "llm 7b"), ("", "7", ""), ("c", "1", "é" * 40), ("a_b", "9", "x.y")):
        assert agent.slurm_job_name(cluster, job_id, name) == slurm.slurm_job_name(cluster, job_id, name)
        assert slurm.JOB_NAME.match(slurm.slurm_job_name(cluster, job_id, name))


def test_the_stack_dumps_marker_and_read_budget_agree():
    assert (agent.STACKS_MARKER, agent.STACKS_VERSION, agent.STACKS_READ_BYTES) == (
        control_plane.STACKS_MARKER,
        control_plane.STACKS_VERSION,
        control_plane.STACKS_READ_BYTES,
    )


def test_a_stack_dump_the_agent_writes_is_the_one_the_control_plane_reads():
    # Given a dump of this process, as the agent's stdout sink writes it, behind a launcher's prefix
    dump = capture(Identity("llm", "algo-3", rank=17, world_size=64, local_rank=1), 88, STALL, 61.0)
    line = LogLine.read(1_700_000_000.0, "llm/algo-3-1700000000", "[default1]:" + dump.line())

    # When the control plane parses it
    (read,) = control_plane_stacks.latest([line])

    # Then it has the rank, host, world and every frame the line kept, innermost first
    assert (read.rank, read.host, read.world_size, read.reason) == (17, "algo-3", 64, "stall")
    assert [(f.file, f.line, f.func) for f in read.main] == [(f["file"], f["line"], f["func"]) for f in dump.main]
    assert read.user_frame is not None
    assert read.user_frame.func == "test_a_stack_dump_the_agent_writes_is_the_one_the_control_plane_reads"
    assert line.pattern is None
    assert line.marker is None
