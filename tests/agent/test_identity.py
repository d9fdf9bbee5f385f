"""Identity: job name, host and ranks from the environment, without collectives or network."""

from __future__ import annotations

import socket

import pytest

from trainer_agent.identity import Identity, ec2_instance_id


def test_job_name_prefers_sagemaker_then_stallwatch_then_hostname(monkeypatch):
    monkeypatch.setenv("TRAINING_JOB_NAME", "sm-job")
    assert Identity.detect().job == "sm-job"
    monkeypatch.delenv("TRAINING_JOB_NAME")
    assert Identity.detect().job == "test-job"
    monkeypatch.delenv("STALLWATCH_JOB_NAME")
    assert Identity.detect().job == socket.gethostname()
    assert Identity.detect("explicit").job == "explicit"


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
