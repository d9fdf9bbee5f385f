"""Identity: job name, host and ranks from the environment, without collectives or network."""

from __future__ import annotations

import io
import logging
import socket
import urllib.error
import urllib.request

import pytest

from trainer_agent import identity, log
from trainer_agent.identity import Identity, ec2_instance_id


def test_off_sagemaker_the_job_name_is_the_given_one_then_the_variable_then_the_hostname(monkeypatch, tmp_path):
    monkeypatch.setattr(identity, "DMI_DIR", tmp_path)  # not EC2 hardware: no instance metadata
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    assert Identity.detect().job == "test-job"  # STALLWATCH_JOB_NAME, set for every test by tests/conftest.py
    assert Identity.detect("explicit").job == "explicit"
    monkeypatch.delenv("STALLWATCH_JOB_NAME")
    assert Identity.detect().job == socket.gethostname()


def test_in_a_sagemaker_job_the_platforms_name_wins_and_a_differing_one_is_logged_once(
    monkeypatch, tmp_path, caplog
) -> None:
    # Given a SageMaker training job (TRAINING_JOB_NAME) whose image also sets STALLWATCH_JOB_NAME to another name
    monkeypatch.setattr(identity, "DMI_DIR", tmp_path)
    monkeypatch.setattr(log, "_seen", set())
    monkeypatch.setenv("TRAINING_JOB_NAME", "llama-70b-r1")
    monkeypatch.setenv("STALLWATCH_JOB_NAME", "llama-70b")

    # When the identity is read, twice, and once more with an explicit name
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        names = [Identity.detect().job, Identity.detect().job, Identity.detect("mine").job]

    # Then the metrics go to the name the control plane reads (a resumed -r1 its own), and the log says so once
    assert names == ["llama-70b-r1"] * 3
    [warning] = [r.getMessage() for r in caplog.records]
    assert "STALLWATCH_JOB_NAME='llama-70b'" in warning
    assert "TRAINING_JOB_NAME='llama-70b-r1'" in warning

    # And a variable that agrees is not worth a line
    caplog.clear()
    monkeypatch.setattr(log, "_seen", set())
    monkeypatch.setenv("STALLWATCH_JOB_NAME", "llama-70b-r1")
    assert Identity.detect().job == "llama-70b-r1"
    assert not caplog.records


class FakeImds:
    """Instance metadata (IMDSv2) with optional instance tags; every request is recorded."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags
        self.paths: list[str] = []

    def __call__(self, request: urllib.request.Request, timeout: float) -> io.BytesIO:
        path = request.full_url.removeprefix(identity.IMDS_URL + "/")
        self.paths.append(path)
        if path == "api/token":
            assert request.get_method() == "PUT"
            return io.BytesIO(b"token")
        assert request.get_header("X-aws-ec2-metadata-token") == "token"
        key = path.removeprefix("meta-data/tags/instance/")
        if key in self.tags:
            return io.BytesIO(self.tags[key].encode())
        raise urllib.error.HTTPError(request.full_url, 404, "Not Found", {}, None)  # type: ignore[arg-type]


@pytest.fixture
def nitro(tmp_path, monkeypatch):
    """A Nitro EC2 instance: its id in the DMI board asset tag, no job variable set."""
    (tmp_path / "board_asset_tag").write_text("i-0123456789abcdef0\n")
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    monkeypatch.setattr(identity, "DMI_DIR", tmp_path)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)  # set for every test by tests/conftest.py
    for name in ("STALLWATCH_JOB_NAME", "TRAINING_JOB_NAME", "SM_CURRENT_HOST"):
        monkeypatch.delenv(name, raising=False)


def test_on_ec2_the_job_is_the_instances_stallwatch_job_tag_and_the_host_its_id(nitro, monkeypatch):
    # Given instance metadata with tags enabled and stallwatch:job=llm-70b
    imds = FakeImds({"stallwatch:job": "llm-70b"})
    monkeypatch.setattr("urllib.request.urlopen", imds)

    # When the identity is detected with no variable set
    ident = Identity.detect()

    # Then the job is the tag (as the control plane groups the instances) and the host the instance id
    assert (ident.job, ident.host) == ("llm-70b", "i-0123456789abcdef0")
    assert "meta-data/tags/instance/stallwatch:job" in imds.paths


def test_a_single_instance_without_a_job_tag_is_named_by_its_id_with_no_variable_set(nitro, monkeypatch):
    # Given an instance without the tag (or with tags in metadata disabled: 404 alike)
    monkeypatch.setattr("urllib.request.urlopen", FakeImds({}))

    # Then job and host are the instance id: the one-instance job the control plane watches
    ident = Identity.detect()
    assert (ident.job, ident.host) == ("i-0123456789abcdef0", "i-0123456789abcdef0")


def test_the_variable_wins_over_the_instance_tag(nitro, monkeypatch):
    monkeypatch.setattr("urllib.request.urlopen", FakeImds({"stallwatch:job": "from-tag"}))
    monkeypatch.setenv("STALLWATCH_JOB_NAME", "from-env")
    assert Identity.detect().job == "from-env"


def test_in_a_slurm_job_srun_task_0_of_the_job_reports_it_under_its_cluster_id_and_name(monkeypatch, tmp_path):
    # Given srun's task 1 of 2 (no torchrun) of job 4242 "llm 7b.v2" on node queue1-st-p5-2 of cluster pc1
    monkeypatch.setattr(identity, "DMI_DIR", tmp_path)
    monkeypatch.delenv("STALLWATCH_JOB_NAME")
    monkeypatch.delenv("SM_CURRENT_HOST")
    srun = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llm 7b.v2", "SLURM_CLUSTER_NAME": "pc1"}
    srun |= {"SLURMD_NODENAME": "queue1-st-p5-2", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    for name, value in srun.items():
        monkeypatch.setenv(name, value)
    # When the agent finds its identity
    ident = Identity.detect()
    # Then the job is named as the control plane names it, the host is the node, and only task 0 reports the job
    assert (ident.job, ident.host) == ("pc1-4242-llm-7b-v2", "queue1-st-p5-2")
    assert (ident.rank, ident.world_size, ident.reports_job, ident.reports_host) == (1, 2, False, True)
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert Identity.detect().reports_job
    # and an explicit name still wins
    monkeypatch.setenv("STALLWATCH_JOB_NAME", "mine")
    assert Identity.detect().job == "mine"


def test_host_is_sagemakers_current_host(monkeypatch):
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-3")
    assert Identity.detect().host == "algo-3"


def test_ranks_come_from_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ident = Identity.detect()
    assert (ident.rank, ident.world_size, ident.local_rank) == (9, 16, 1)
    assert not ident.reports_job
    assert not ident.reports_host


def test_ranks_come_from_open_mpi_when_torchrun_is_absent(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    ident = Identity.detect()
    assert (ident.rank, ident.world_size, ident.local_rank) == (5, 8, 0)
    assert ident.reports_host


@pytest.mark.parametrize(
    ("launcher", "env"),
    [
        # DeepSpeed's launcher (deepspeed.launcher.launch) sets torchrun's variables, plus its own LOCAL_SIZE
        ("deepspeed", {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_SIZE": "8", "CROSS_RANK": "1"}),
        ("mvapich", {"MV2_COMM_WORLD_RANK": "9", "MV2_COMM_WORLD_SIZE": "16", "MV2_COMM_WORLD_LOCAL_RANK": "1"}),
        ("mpich/intel mpi", {"PMI_RANK": "9", "PMI_SIZE": "16", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "8"}),
        ("srun", {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}),
        # torchrun started by srun, one task per node: torchrun's variables are the process's, Slurm's its agent's
        ("torchrun under srun", {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "SLURM_PROCID": "1"}),
        # mpirun inside a Slurm allocation: Open MPI's are the process's
        ("mpirun under sbatch", {"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "16",
                                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}),
    ],
)  # fmt: skip
def test_ranks_come_from_whichever_launcher_started_the_process(monkeypatch, launcher, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ident = Identity.detect()
    assert (ident.rank, ident.world_size, ident.local_rank) == (9, 16, 1), launcher


def test_lightnings_own_launcher_sets_no_global_rank_and_node_zero_still_reads_exactly(monkeypatch):
    # Given Lightning's subprocess launcher's child: NODE_RANK, LOCAL_RANK and WORLD_SIZE, no RANK
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert (Identity.detect().rank, Identity.detect().world_size) == (3, 16)

    # When it runs on the second node: not rank 0 (it reports no job metrics); exact with LOCAL_WORLD_SIZE
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not Identity.detect().reports_job
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert Identity.detect().rank == 8


def test_a_non_integer_rank_variable_is_named(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero'"):
        Identity.detect()


def test_single_process_reports_job_and_host():
    ident = Identity.detect()
    assert (ident.rank, ident.world_size, ident.local_rank) == (0, 1, 0)
    assert ident.reports_job
    assert ident.reports_host


def test_a_rank_outside_the_world_is_rejected(monkeypatch):
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="rank 4"):
        Identity.detect()


def test_ec2_instance_id_is_read_from_the_board_asset_tag(tmp_path):
    (tmp_path / "board_asset_tag").write_text("i-0123456789abcdef0\n")
    assert ec2_instance_id(tmp_path) == "i-0123456789abcdef0"


def test_off_ec2_there_is_no_instance_id_and_no_network_call(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("IMDS must not be called off EC2")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    (tmp_path / "sys_vendor").write_text("QEMU\n")
    assert ec2_instance_id(tmp_path) is None


def test_on_ec2_with_metadata_disabled_there_is_no_network_call(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("IMDS must not be called when AWS_EC2_METADATA_DISABLED=true")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    assert ec2_instance_id(tmp_path) is None
