"""Window arithmetic: throughput, TFLOPs, MFU, data wait, losses, and Steps=0 windows."""

from __future__ import annotations

import math

import pytest

from trainer_agent.contract import HOST_METRICS, JOB_METRICS, SCOPE_JOB
from trainer_agent.window import (
    AcceleratorReading,
    Progress,
    Scale,
    Window,
    WindowTotals,
    host_metrics,
    job_metrics,
    with_old_names,
)


def test_tflops_and_mfu_from_flops_per_step():
    # Given 10 steps of 5e12 FLOPs in 10 s on a 100-TFLOP/s device
    totals = WindowTotals(wall_s=10.0, steps=10, busy_s=10.0)
    scale = Scale(flops_per_step=5e12, peak_tflops=100.0)

    # When the window becomes metrics
    metrics = job_metrics(totals, Progress(step=10, last_step_age_s=0.1), scale)

    # Then 5 TFLOP/s per GPU, 5% MFU
    assert metrics["TFLOPsPerAccelerator"] == pytest.approx(5.0)
    assert metrics["MFU"] == pytest.approx(5.0)


def test_flops_per_token_counts_the_jobs_tokens_shared_by_all_ranks():
    # Given 8 ranks, 4-way data parallel (2-way tensor parallel), 1000 tokens per data-parallel rank in 2 s
    totals = WindowTotals(wall_s=2.0, steps=1, tokens=4 * 1000, counts_tokens=True)
    scale = Scale(world_size=8, data_parallel_size=4, flops_per_token=1e9)

    metrics = job_metrics(totals, Progress(step=1, last_step_age_s=0.0), scale)

    # Then the job consumed 4000 tokens; each GPU did an eighth of their 4e12 FLOPs
    assert metrics["TokensPerSecond"] == pytest.approx(2000.0)
    assert metrics["TFLOPsPerAccelerator"] == pytest.approx(4e12 / 8 / 2.0 / 1e12)


def test_mfu_is_absent_without_a_peak_and_tflops_absent_without_flops():
    totals = WindowTotals(wall_s=1.0, steps=3)
    assert "MFU" not in job_metrics(totals, Progress(3, 0.0), Scale(flops_per_step=1e9))
    assert "TFLOPsPerAccelerator" not in job_metrics(totals, Progress(3, 0.0), Scale(peak_tflops=100.0))


def test_a_window_without_steps_still_reports_zero_steps_and_zero_throughput():
    # Given a loop that reported tokens before, then completed nothing for a whole window
    totals = WindowTotals(wall_s=60.0, counts_tokens=True, counts_samples=True)

    metrics = job_metrics(totals, Progress(step=42, last_step_age_s=75.0), Scale(flops_per_token=1e9, peak_tflops=1))

    assert metrics["Steps"] == 0
    assert metrics["Step"] == 42
    assert metrics["LastStepAge"] == 75.0
    assert (
        metrics["TokensPerSecond"]
        == metrics["SamplesPerSecond"]
        == metrics["TFLOPsPerAccelerator"]
        == metrics["MFU"]
        == 0
    )
    assert "StepTime" not in metrics
    assert "Loss" not in metrics


def test_data_wait_is_the_share_of_wall_time_outside_steps_and_phases():
    metrics = job_metrics(WindowTotals(wall_s=10.0, steps=5, busy_s=7.5), Progress(5, 0.0), Scale())
    assert metrics["DataWaitFraction"] == pytest.approx(25.0)


def test_loss_is_the_mean_of_finite_losses_and_non_finite_ones_are_counted():
    totals = WindowTotals(wall_s=1.0, steps=4, losses=[1.0, math.nan, 3.0, math.inf])
    metrics = job_metrics(totals, Progress(4, 0.0), Scale())
    assert metrics["Loss"] == pytest.approx(2.0)
    assert metrics["NonFiniteLoss"] == 2


def test_all_losses_non_finite_reports_the_count_and_no_loss():
    metrics = job_metrics(WindowTotals(wall_s=1.0, losses=[math.nan]), Progress(0, 0.0), Scale())
    assert metrics["NonFiniteLoss"] == 1
    assert "Loss" not in metrics


def test_job_and_host_metrics_use_only_contract_names():
    totals = WindowTotals(
        wall_s=1.0, steps=2, step_seconds=1.0, timed_steps=2, losses=[1.0], counts_tokens=True, counts_samples=True
    )
    progress = Progress(2, 0.0, phase_budget_remaining_s=5.0, eta_s=10.0)
    job = job_metrics(totals, progress, Scale(flops_per_token=1.0, peak_tflops=1.0))
    gpus = host_metrics(totals, AcceleratorReading(90.0, 40.0, power_watts=300.0))
    cores = host_metrics(totals, AcceleratorReading(90.0, 40.0, power_percent=25.0))
    assert set(with_old_names(job)) == set(JOB_METRICS)
    assert set(with_old_names(gpus)) | set(cores) == set(HOST_METRICS)
    assert gpus["StepTime"] == job["StepTime"] == 0.5


def test_renamed_metrics_keep_their_old_names_beside_the_new_ones():
    # Given a GPU host's and a job's metrics under the accelerator names
    metrics = {"AcceleratorUtilization": 97.0, "AcceleratorPowerWatts": 390.0, "TFLOPsPerAccelerator": 180.0}

    # When the old names are added (a GPU's windows, for one release)
    both = with_old_names(metrics)

    # Then each value is there under both names, and nothing else changed
    assert both == metrics | {"GPUUtilization": 97.0, "GPUPowerWatts": 390.0, "TFLOPsPerGPU": 180.0}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": 4, "data_parallel_size": 8}, "data_parallel_size"),
        ({"flops_per_step": -1.0}, "flops_per_step"),
        ({"peak_tflops": math.nan}, "peak_tflops"),
        ({"flops_per_step": 1.0, "flops_per_token": 1.0}, "flops_per_step or flops_per_token"),
    ],
)
def test_scale_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Scale(**kwargs)


def test_window_rejects_an_unknown_scope():
    with pytest.raises(ValueError, match="scope"):
        Window("rack", 0.0, "j", "h", 0, 60.0, {})


def test_window_record_has_the_documented_keys():
    record = Window(SCOPE_JOB, 12.5, "j", "algo-1", 0, 60.0, {"Steps": 3.0}).as_record()
    assert record == {"t": 12.5, "job": "j", "host": "algo-1", "rank": 0, "scope": "job", "phase": None, "Steps": 3.0}
