"""TrainerAgent in the loop: windows, losses without reads, phases, ranks, and never raising."""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time

import pytest
import torch

from tests.agent.conftest import MemorySink
from trainer_agent import JsonlSink, TrainerAgent

CLOSE_SLACK_S = 1.0
"""What flush() and close() may take beyond their timeouts on a loaded machine (close took 6 s for 0.5)."""


def run_steps(agent, clock, n, inside_s=0.1, outside_s=0.05, tokens=None, samples=None):
    for _ in range(n):
        clock.advance(outside_s)
        with agent.step(tokens=tokens, samples=samples):
            clock.advance(inside_s)


def test_a_window_tallies_steps_step_time_throughput_and_data_wait(make_agent, sink, clock):
    # Given an agent and three 0.1 s steps, each after 0.05 s waiting for data
    agent = make_agent(flops_per_step=2e12, peak_tflops=40.0)
    run_steps(agent, clock, 3, tokens=512, samples=4)

    # When the window is emitted
    agent.flush()

    # Then it reports the three steps and what they imply
    (window,) = sink.job
    metrics = window.metrics
    assert (metrics["Steps"], metrics["Step"]) == (3, 3)
    assert metrics["StepTime"] == pytest.approx(0.1)
    assert metrics["DataWaitFraction"] == pytest.approx(100 / 3)
    assert metrics["TokensPerSecond"] == pytest.approx(3 * 512 / 0.45)
    assert metrics["SamplesPerSecond"] == pytest.approx(3 * 4 / 0.45)
    assert metrics["TFLOPsPerAccelerator"] == pytest.approx(3 * 2 / 0.45)
    assert metrics["MFU"] == pytest.approx(100 * 3 * 2 / 0.45 / 40)
    assert (window.job, window.host, window.rank) == ("test-job", "algo-1", 0)


def test_a_window_without_steps_reports_zero_steps_and_the_age_of_the_last_step(make_agent, sink, clock):
    # Given two steps, then 30 s without any
    agent = make_agent()
    run_steps(agent, clock, 2)
    agent.flush()
    clock.advance(30.0)

    # When the next window is emitted
    agent.flush()

    # Then Steps is 0 (not missing) and LastStepAge counts from the last step
    metrics = sink.job[-1].metrics
    assert metrics["Steps"] == 0
    assert metrics["Step"] == 2
    assert metrics["LastStepAge"] == pytest.approx(30.0)
    assert metrics["DataWaitFraction"] == pytest.approx(100.0)


def test_a_loop_stuck_inside_a_step_still_gets_windows_from_the_background_thread(sink):
    # Given an agent on the real clock with a one-second window, and a step that never ends
    agent = TrainerAgent(interval_s=1.0, sinks=[sink], handle_sigterm=False)
    agent.start_step()

    # When two windows' time passes
    deadline = time.monotonic() + 20.0
    while len(sink.job) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.close(timeout_s=1.0)

    # Then the background thread emitted windows with Steps=0, and the time counts as in-step (not data wait)
    assert len(sink.job) >= 2
    stuck = sink.job[1].metrics
    assert stuck["Steps"] == 0
    assert stuck["DataWaitFraction"] < 50.0
    assert sink.host[1].metrics["Heartbeat"] == 1


class CountingTensor(torch.Tensor):
    """A tensor that counts every read of its value into Python."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.numpy):
            cls.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_recording_tensor_losses_never_reads_them_in_the_loop(make_agent, sink, clock):
    # Given losses as tensors that count reads of their value
    agent = make_agent()
    CountingTensor.reads = 0
    losses = [torch.tensor(float(value)).as_subclass(CountingTensor) for value in (1.0, 2.0, 6.0)]

    # When the loop records them every step
    for loss in losses:
        with agent.step():
            pass
        agent.record(loss=loss)

    # Then no value was read in the loop, and the window still has their mean
    assert CountingTensor.reads == 0
    agent.flush()
    assert sink.job[0].metrics["Loss"] == pytest.approx(3.0)


def test_tensor_float_and_non_finite_losses_mix_in_one_window(make_agent, sink):
    agent = make_agent()
    for loss in (torch.tensor(2.0), 4.0, torch.tensor(float("nan")), torch.tensor([1.0, 3.0])):
        agent.record(loss=loss)
    agent.flush()
    metrics = sink.job[0].metrics
    assert metrics["Loss"] == pytest.approx((2.0 + 4.0 + 2.0) / 3)
    assert metrics["NonFiniteLoss"] == 1


def test_many_tensor_losses_in_one_window_are_all_counted(make_agent, sink):
    agent = make_agent()
    for value in range(3000):
        agent.record(loss=torch.tensor(float(value)))
    agent.flush()
    assert sink.job[0].metrics["Loss"] == pytest.approx(sum(range(3000)) / 3000)


def test_a_phase_reports_its_remaining_budget_then_zero(make_agent, sink, clock):
    # Given a checkpoint phase with a 100 s budget, 40 s in
    agent = make_agent()
    with agent.phase("checkpoint", budget_s=100.0):
        clock.advance(40.0)
        agent.flush()
        # When it overruns its budget
        clock.advance(70.0)
        agent.flush()
    agent.flush()

    # Then the window shows the remaining budget while within it, 0 once over, and 0 after
    remaining = [window.metrics["PhaseBudgetRemaining"] for window in sink.job]
    assert remaining == [pytest.approx(60.0), 0.0, 0.0]
    assert [window.phase for window in sink.job] == ["checkpoint", "checkpoint", None]
    # And phase time is not data wait
    assert sink.job[0].metrics["DataWaitFraction"] == pytest.approx(0.0)


def test_eta_follows_the_latest_step_rate(make_agent, sink, clock):
    agent = make_agent(total_steps=100)
    run_steps(agent, clock, 10, inside_s=0.5, outside_s=0.5)
    agent.flush()
    assert sink.job[0].metrics["ETA"] == pytest.approx(90 * 1.0)


def test_explicit_step_numbers_set_the_global_step(make_agent, sink):
    agent = make_agent()
    with agent.step(step=5000):
        pass
    agent.flush()
    assert sink.job[0].metrics["Step"] == 5000


def test_a_step_whose_body_raises_propagates_and_is_not_counted(make_agent, sink):
    agent = make_agent()
    with pytest.raises(KeyError), agent.step():
        raise KeyError("batch")
    agent.flush()
    assert sink.job[0].metrics["Steps"] == 0


class RaisingSink(MemorySink):
    def emit(self, window):
        raise OSError("No space left on device")


def test_a_failing_sink_is_logged_once_and_the_others_still_receive_windows(make_agent, sink, clock, caplog):
    # Given a sink that always raises, before a working one
    agent = make_agent(sinks=[RaisingSink(), sink])

    # When several windows are emitted
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        for _ in range(3):
            run_steps(agent, clock, 1)
            agent.flush()

    # Then training was never interrupted, the working sink got every window, and one warning was logged
    assert len(sink.job) == 3
    assert len([record for record in caplog.records if "No space left" in record.getMessage()]) == 1


class BlockingSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def emit(self, window):
        self.entered.set()
        self.release.wait()


def test_a_blocking_sink_neither_blocks_the_loop_nor_the_other_sinks_and_close_keeps_its_timeout(sink):
    # Given a sink that blocks forever once called
    blocking = BlockingSink()
    agent = TrainerAgent(interval_s=1.0, sinks=[blocking, sink], handle_sigterm=False)
    assert blocking.entered.wait(20.0)

    # When the loop keeps stepping, flushes with a 0.2 s timeout, and then closes with a 0.5 s timeout
    for _ in range(100):
        with agent.step():
            pass
    started = time.monotonic()
    agent.flush(timeout_s=0.2)
    flushing_s = time.monotonic() - started
    started = time.monotonic()
    agent.close(timeout_s=0.5)
    closing_s = time.monotonic() - started

    # Then each returned in about its timeout, and the other sink had every window, the last with all steps
    assert flushing_s < 0.2 + CLOSE_SLACK_S
    assert closing_s < 0.5 + CLOSE_SLACK_S
    assert sink.job[-1].metrics["Step"] == 100
    assert sink.closed
    blocking.release.set()


class HungGpu:
    """An NVML sampler stuck in its read, as on a GPU that fell off the bus."""

    gpus = True

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def sample(self) -> None:
        self.entered.set()
        self.release.wait(30.0)

    def take(self) -> None:
        return None

    def close(self) -> None:
        pass


def test_close_keeps_time_for_the_final_window_when_the_background_thread_is_stuck(sink):
    # Given the agent's thread stuck sampling a failed GPU, and a step done
    agent = TrainerAgent(interval_s=1.0, sinks=[sink], handle_sigterm=False)
    gpu = agent._accelerators = HungGpu()
    assert gpu.entered.wait(20.0)
    with agent.step():
        pass

    # When the agent closes with SIGTERM's 2 s
    agent.close(timeout_s=2.0)

    # Then the sink still had the final window, with the step
    assert sink.job[-1].metrics["Step"] == 1
    assert sink.closed
    gpu.release.set()


def test_an_unreadable_loss_is_dropped_with_one_log_line_and_the_window_still_goes_out(make_agent, sink, caplog):
    # Given losses that cannot be read: meta tensors, empty ones, and one whose read fails at emission
    class Unreadable(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.cat:
                raise RuntimeError("cannot read this loss")
            return super().__torch_function__(func, types, args, kwargs or {})

    agent = make_agent()
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        for loss in (torch.tensor(1.0, device="meta"), torch.tensor(1.0, device="meta"), torch.empty(0)):
            with agent.step():
                pass
            agent.record(loss=loss)
        agent.flush()
        with agent.step():
            pass
        agent.record(loss=torch.tensor(2.0).as_subclass(Unreadable))
        agent.flush()

    # Then both windows carry their steps and no loss (an empty loss is not a non-finite one), both hosts
    # windows their heartbeat, and each cause was logged once
    assert [(w.metrics["Steps"], "Loss" in w.metrics, "NonFiniteLoss" in w.metrics) for w in sink.job] == [
        (3, False, False),
        (1, False, False),
    ]
    assert [w.metrics["Heartbeat"] for w in sink.host] == [1, 1]
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3
    assert "meta" in messages[0]
    assert "0 elements" in messages[1]
    assert "cannot read this loss" in messages[2]


def test_distributed_tensor_losses_are_read_only_when_replicated(make_agent, sink):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    # Given a one-rank gloo group, and a replicated and a partial (to be reduced) DTensor loss
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        agent = make_agent()
        with agent.step():
            pass
        agent.record(loss=DTensor.from_local(torch.tensor(2.0), mesh, [Replicate()]))
        agent.record(loss=DTensor.from_local(torch.tensor(5.0), mesh, [Partial()]))
        agent.flush()
    finally:
        dist.destroy_process_group()

    # Then the replicated one is this rank's copy, and the partial one (a collective to read) is dropped
    assert sink.job[0].metrics["Loss"] == 2.0


def test_a_full_disk_is_logged_once_and_training_goes_on(make_agent, sink, clock, caplog):
    # Given a JSONL sink on a device that is always full
    agent = make_agent(sinks=[JsonlSink("/dev/full"), sink])

    # When windows are emitted
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        for _ in range(2):
            run_steps(agent, clock, 1)
            agent.flush()

    # Then the other sink received both windows and the failure was logged once
    assert [window.metrics["Step"] for window in sink.job] == [1, 2]
    assert len([r for r in caplog.records if "No space left on device" in r.getMessage()]) == 1


def test_auto_sinks_without_boto3_print_the_stdout_line(monkeypatch, capsys):
    # Given boto3 cannot be imported
    monkeypatch.setitem(sys.modules, "boto3", None)

    # When an agent with the default sinks runs a step and closes
    agent = TrainerAgent(interval_s=3600.0, handle_sigterm=False)
    with agent.step():
        pass
    agent.close()

    # Then the windows were printed as EMF lines on stdout
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["Scope"], line.get("Steps")) for line in lines] == [("job", 1.0), ("host", None)]


def test_agent_methods_never_raise_on_bad_input(make_agent, sink):
    agent = make_agent()
    agent.record(loss="not a number")
    ran = False
    with agent.phase("eval", budget_s=-1):
        ran = True
    agent.end_step()
    agent.flush()
    assert ran
    assert sink.job[0].metrics["PhaseBudgetRemaining"] == 0


def test_close_emits_a_final_window_closes_the_sinks_and_later_calls_do_nothing(make_agent, sink, clock):
    agent = make_agent()
    run_steps(agent, clock, 1)
    agent.close()
    agent.close()
    with agent.step():
        pass
    agent.flush()
    assert sink.closed
    assert [window.metrics["Steps"] for window in sink.job] == [1]


def test_ranks_other_than_zero_and_local_zero_report_nothing_and_log_nothing(monkeypatch, make_agent, sink, caplog):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with caplog.at_level(logging.DEBUG, logger="trainer_agent"):
        agent = make_agent(flops_per_token=1e9)  # no peak for the CPU: rank 0 would log that
        with agent.step(tokens=10):
            pass
        agent.record(loss=torch.empty(0))
        agent.close()
    assert not agent.active
    assert sink.windows == []
    assert caplog.records == []


def test_job_tokens_are_taken_as_the_jobs_and_rank_tokens_count_once_per_data_parallel_rank(
    monkeypatch, make_agent, sink, clock
):
    # Given rank 0 of 4 ranks, 2-way data parallel (2-way tensor parallel)
    monkeypatch.setenv("WORLD_SIZE", "4")
    agent = make_agent(data_parallel_size=2, flops_per_token=1e12)

    # When one 1 s step reports this rank's 100 tokens and 3 samples, and another 1 s step the job's 500 tokens
    # (already summed over ranks, as Hugging Face's num_input_tokens_seen is)
    with agent.step(tokens=100, samples=3):
        clock.advance(1.0)
    with agent.step(job_tokens=500):
        clock.advance(1.0)
    agent.flush()

    # Then the job consumed 2 x 100 + 500 tokens and 2 x 3 samples, and each of the 4 devices a quarter of the FLOPs
    metrics = sink.job[0].metrics
    assert metrics["TokensPerSecond"] == pytest.approx(700 / 2.0)
    assert metrics["SamplesPerSecond"] == pytest.approx(6 / 2.0)
    assert metrics["TFLOPsPerAccelerator"] == pytest.approx(700 / 4 / 2.0)


def test_local_rank_zero_on_another_host_reports_only_host_metrics(monkeypatch, make_agent, sink):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    agent = make_agent()
    with agent.step():
        pass
    agent.flush()
    assert sink.job == []
    assert sink.host[0].metrics["Heartbeat"] == 1
    assert sink.host[0].rank == 2


def test_unknown_device_leaves_mfu_absent_and_says_so_once(make_agent, sink, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer_agent"):
        agent = make_agent(flops_per_step=1e9)
    agent.flush()
    assert "MFU" not in sink.job[0].metrics
    assert "TFLOPsPerAccelerator" in sink.job[0].metrics
    assert "TFLOPsPerGPU" not in sink.job[0].metrics  # no GPU name where there is no GPU
    assert [record.getMessage() for record in caplog.records if "peak FLOPs" in record.getMessage()] == [
        "no peak FLOPs known for device 'cpu' at bf16; MFU is not reported (pass peak_tflops= to set it)"
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"interval_s": 0.1}, "interval_s"),
        ({"total_steps": 0}, "total_steps"),
        ({"device": "tpu"}, "device"),
        ({"precision": "int3"}, "precision"),
        ({"sinks": "cloudwatch"}, "sinks"),
        ({"flops_per_step": 0.0}, "flops_per_step"),
    ],
)
def test_bad_configuration_is_rejected_at_construction_naming_the_field(make_agent, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_agent(**kwargs)


def test_gpu_host_metrics_are_means_over_gpus_and_samples(monkeypatch, make_agent, sink):
    # Given a host with two GPUs reporting through a fake NVML
    nvml = FakeNvml([(300_000, 90, 40), (100_000, 50, 20)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    agent = make_agent()

    # When the sampler reads them twice and the window is emitted
    agent._accelerators.sample()
    agent._accelerators.sample()
    agent.flush()

    # Then the host window has the means, with NVML's milliwatts as watts, from handles opened once, under the
    # accelerator names and, for one release, the GPU names too
    assert nvml.handle_calls == 2
    metrics = sink.host[0].metrics
    assert metrics["AcceleratorPowerWatts"] == metrics["GPUPowerWatts"] == pytest.approx(200.0)
    assert metrics["AcceleratorUtilization"] == metrics["GPUUtilization"] == pytest.approx(70.0)
    assert metrics["AcceleratorMemoryUtilization"] == metrics["GPUMemoryUtilization"] == pytest.approx(30.0)
    assert "AcceleratorPowerPercent" not in metrics
    assert not math.isnan(metrics["Heartbeat"])


class FakeNvml:
    """The slice of pynvml the sampler uses."""

    def __init__(self, gpus: list[tuple[int, int, int]]) -> None:
        self.gpus = gpus
        self.handle_calls = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.handle_calls += 1
        return index

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self.gpus[handle][0]

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        return type("Rates", (), {"gpu": self.gpus[handle][1], "memory": self.gpus[handle][2]})()
