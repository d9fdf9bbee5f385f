"""The fault-mix simulator and benchmark on a few small jobs: every kind of fault is stopped (or, a slow node, named)
in time, and a job that goes through every healthy pause is never stopped nor warned."""

from __future__ import annotations

import pytest

from bench import faultmix
from corpus import real_lines
from corpus.faults import Episode, Fault, Job, draw_jobs, simulate
from stallwatch.core.signals import Platform
from stallwatch.core.trace import LogEvent

HOUR = 3600.0


def job(name: str, fault: Fault | None = None, episodes: tuple[Episode, ...] = (), **shape: object) -> Job:
    fields: dict = {
        "name": name,
        "platform": Platform.SAGEMAKER,
        "instance_type": "p4d.24xlarge",
        "hosts": 4,
        "agent": True,
        "duration_s": 6 * HOUR,
        "seed": 5,
        "startup_s": 300.0,
        "step_s": 2.0,
        "log_every_s": 60.0,
        "rank0_only_logs": False,
        "ec2_power": False,
        "episodes": episodes,
        "fault": fault,
    }
    return Job(**(fields | shape))


FAULTS = [
    job("crash-agent", Fault("crash", "faulty GPU", 2 * HOUR, host=2)),
    job(
        "crash-noagent-rank0-logs", Fault("crash", "software bug", 2 * HOUR, host=3), agent=False, rank0_only_logs=True
    ),
    job("hang-agent-ec2", Fault("hang", "network switch or cable", 2 * HOUR), platform=Platform.EC2),
    job("hang-noagent", Fault("hang", "NIC", 2 * HOUR), agent=False),
    job("lost-rank0-agent", Fault("lost", "host maintenance", 2 * HOUR, host=0)),
    job("lost-noagent-ec2", Fault("lost", "power supply", 2 * HOUR, host=1), agent=False, platform=Platform.EC2),
    # NCCL timeouts raised to hours: the hang spins silently, no watchdog line
    job(
        "silent-hang-power-ec2",
        Fault("hang", "NIC", 2 * HOUR),
        agent=False,
        platform=Platform.EC2,
        ec2_power=True,
        nccl_timeout_s=7200.0,
    ),
    job("silent-hang-agent", Fault("hang", "network switch or cable", 2 * HOUR), nccl_timeout_s=3600.0),
]
# Without the agent or GPU power nothing tells a silent hang from an evaluation but time: within 45 minutes
SILENT_HANGS = [
    job("silent-hang-noagent", Fault("hang", "NIC", 2 * HOUR), agent=False, nccl_timeout_s=7200.0),
    job(
        "silent-hang-noagent-after-evals",
        Fault("hang", "network switch or cable", 4 * HOUR),
        episodes=(Episode("eval", 1 * HOUR + 30, 1200.0), Episode("eval", 2.5 * HOUR + 30, 1300.0)),
        agent=False,
        eval_results=False,
        nccl_timeout_s=7200.0,
    ),
    job(
        "silent-hang-noagent-ec2-rank0-logs",
        Fault("hang", "NIC", 2 * HOUR + 50),
        agent=False,
        platform=Platform.EC2,
        rank0_only_logs=True,
        nccl_timeout_s=3600.0,
    ),
]


@pytest.mark.parametrize("stalled", FAULTS, ids=[j.name for j in FAULTS])
def test_every_kind_of_fault_is_stopped_soon_after_its_onset(stalled: Job) -> None:
    # Given a job whose fault leaves it running / When replayed
    outcome = faultmix.run_job(stalled)
    # Then it is stopped after the onset, within the goals' p95 (15 min with the agent, 25 without)
    assert outcome.stop_s is not None
    assert not outcome.false_stop
    minutes = (outcome.stop_s - stalled.fault.onset_s) / 60
    assert minutes <= (15 if stalled.agent else 25)


@pytest.mark.parametrize("stalled", SILENT_HANGS, ids=[j.name for j in SILENT_HANGS])
def test_a_silent_hang_without_the_agent_or_power_is_stopped_within_45_minutes(stalled: Job) -> None:
    # Given a hang whose watchdog lines come an hour or more later, no agent and no GPU power / When replayed
    outcome = faultmix.run_job(stalled)
    # Then it is stopped as a hang within 45 minutes of its onset, and the reason says power would have been sooner
    assert outcome.stop_s is not None
    assert not outcome.false_stop
    assert (outcome.stop_s - stalled.fault.onset_s) / 60 <= 45
    assert outcome.stop_diagnosis == "hang"


@pytest.mark.parametrize("minute_offset", [10.0, 45.0])
def test_a_rank_that_crashed_mid_minute_writes_nothing_after_its_last_words(minute_offset: float) -> None:
    # Given a crash on host 2 part-way into a minute (its progress line of that minute would come after it)
    onset = 2 * HOUR + minute_offset
    crashed = job("crash-mid-minute", Fault("crash", "software bug", onset, host=2), log_every_s=60.0)
    _, events = simulate(crashed)
    stream = f"{crashed.name}/algo-3-"
    # Then its log ends with the crash's lines: no progress line of a process already dead
    after = [e for e in events if isinstance(e, LogEvent) and e.log.stream.startswith(stream) and e.t > onset + 1]
    assert after == []


def test_a_slow_node_is_named_within_30_minutes_and_nothing_is_stopped() -> None:
    slow = job("slow", Fault("slow", "GPU thermal throttling", 2 * HOUR, host=1, factor=1.3), hosts=8)
    outcome = faultmix.run_job(slow)
    assert outcome.stop_s is None
    assert any(h == "1" and 2 * HOUR <= t <= 2 * HOUR + 1800 for t, h in outcome.stragglers)
    assert all(h == "1" for _, h in outcome.stragglers)


@pytest.mark.parametrize("agent", [True, False])
def test_a_job_through_every_healthy_pause_is_never_stopped_or_warned(agent: bool) -> None:
    # Given a job with a long undeclared checkpoint (and a silent one), a declared one past its budget, an evaluation,
    # a data stall and a restart by its launcher
    pauses = (
        Episode("checkpoint", 1 * HOUR, 1500.0, start_line=True, end_line=False),
        Episode("checkpoint", 1.8 * HOUR, 900.0, declared_budget_s=720.0 if agent else None),
        Episode("eval", 2.5 * HOUR, 1500.0, start_line=False),  # 25 minutes without a line
        Episode("data_stall", 3.3 * HOUR, 900.0, start_line=False),
        Episode("restart", 4.0 * HOUR, 480.0, host=2),
        Episode("checkpoint", 4.8 * HOUR, 600.0, start_line=False, end_line=False),
    )
    outcome = faultmix.run_job(job("healthy", episodes=pauses, agent=agent, rank0_only_logs=not agent))
    assert outcome.stop_s is None
    assert outcome.warnings_healthy == 0


def test_the_fault_mix_job_that_caught_an_oom_as_its_data_stalled_is_never_stopped() -> None:
    # Given the fault mix's fm-0246 (seed 7): a healthy 32-host job without the agent, whose algo-8 prints fairseq's
    # real caught OOM and its skipped batch 16 s before the whole job waits 13 minutes for data (no line meanwhile)
    [healthy] = [j for j in draw_jobs(seed=7, job_days=300) if j.name == "fm-0246-sa-32h-noagent"]
    [stall] = [e for e in healthy.episodes if e.kind == "data_stall"]
    assert (healthy.fault, healthy.agent) == (None, False)
    printed_at, block, host = healthy.harmless[-1]
    assert (block, host) == ("fairseq-oom-skip-batch", 7)
    assert stall.start_s - printed_at == pytest.approx(16.0, abs=1.0)
    # When replayed / Then never stopped (it was, as algo-8's crash, from 3b6b557 to 6a6f636) nor warned
    outcome = faultmix.run_job(healthy)
    assert outcome.stop_s is None
    assert outcome.warnings_healthy == 0


def test_a_rare_logger_whose_evaluations_log_nothing_is_never_stopped_or_warned() -> None:
    # Given a job without the agent or power that logs every 20 minutes and evaluates 25 minutes without a line (nor
    # one of results) every 90 minutes, from right after a log line
    evals = tuple(Episode("eval", h * 1.5 * HOUR + 20 * 60 + 30, 1500.0, start_line=False) for h in range(1, 4))
    outcome = faultmix.run_job(job("rare-evals", episodes=evals, agent=False, log_every_s=1200.0, eval_results=False))
    assert outcome.stop_s is None
    assert outcome.warnings_healthy == 0


@pytest.mark.parametrize("sequence", [s.name for s in real_lines.sequences(kind="checkpoint") if s.blocking])
@pytest.mark.parametrize("agent", [True, False])
def test_with_real_lines_a_long_undeclared_checkpoint_is_never_stopped_or_warned(sequence: str, agent: bool) -> None:
    # Given a job whose undeclared checkpoints write a framework's real lines, one of them for 35 minutes
    pauses = (
        Episode("checkpoint", 1 * HOUR, 600.0),
        Episode("checkpoint", 2 * HOUR, 2100.0),
        Episode("checkpoint", 4 * HOUR, 900.0, end_line=False),
    )
    long_write = job("real-checkpoints", episodes=pauses, agent=agent, rank0_only_logs=True, checkpoint_lines=sequence)
    # When replayed with real lines / Then never stopped nor warned
    outcome = faultmix.run_job(long_write, real=True)
    assert outcome.stop_s is None
    assert outcome.warnings_healthy == 0


CRASHES = [s.name for s in real_lines.sequences(kind="crash") if "watchdog" not in s.name]


@pytest.mark.parametrize("sequence", CRASHES)
def test_with_real_lines_every_crash_is_stopped_soon_after_its_onset(sequence: str) -> None:
    # Given a crash whose last words, and its peers' watchdog lines, are real ones
    crashed = job("real-crash", Fault("crash", "faulty GPU", 2 * HOUR, host=1), agent=False, crash_lines=sequence)
    _, events = simulate(crashed, real=True)
    stream = f"{crashed.name}/algo-2-"
    words = [e.log.message for e in events if isinstance(e, LogEvent) and e.log.stream.startswith(stream)]
    assert words[-1] in {line.text for s in real_lines.sequences(kind="crash") for line in s.lines}
    # When replayed / Then stopped within the goal without the agent
    outcome = faultmix.run_job(crashed, real=True)
    assert outcome.stop_s is not None
    assert 0 <= (outcome.stop_s - crashed.fault.onset_s) / 60 <= 25


CRASH_LOOPS = [
    job("loop-agent", Fault("crash", "software bug", 2 * HOUR, host=1), crash_restarts=1000, loop_cycle_s=200.0),
    job("loop-noagent", Fault("crash", "software bug", 2 * HOUR, host=1), agent=False, crash_restarts=1000,
        loop_cycle_s=200.0),
    job("loop-3-restarts-ec2", Fault("crash", "faulty GPU", 2 * HOUR, host=2), agent=False, platform=Platform.EC2,
        crash_restarts=3, loop_cycle_s=170.0),
]  # fmt: skip


@pytest.mark.parametrize("looping", CRASH_LOOPS, ids=[j.name for j in CRASH_LOOPS])
def test_a_crash_loop_is_stopped_soon_after_its_third_death(looping: Job) -> None:
    # Given a rank that dies the same way every time its launcher restarts it (its lines, rendezvous and loading
    # between: the logs never fall silent) / When replayed
    outcome = faultmix.run_job(looping)
    # Then it is stopped after its onset, a period or two after its third death (the 2-minute grace after it)
    third = looping.crashes()[2]
    assert outcome.stop_s is not None
    assert third < outcome.stop_s <= third + 6 * 60
    assert outcome.stop_diagnosis == "crashed_rank"


@pytest.mark.parametrize("agent", [True, False])
def test_real_harmless_lines_from_every_rank_before_pauses_are_never_stopped_or_warned(agent: bool) -> None:
    # Given a healthy job whose every rank prints real lines it trained on after (caught tracebacks, a skipped batch,
    # dynamo's fallback), some right before a silent evaluation and a checkpoint, its steps 15 minutes long with the
    # agent
    blocks = [b.name for b in real_lines.harmless_blocks()]
    pauses = (
        Episode("eval", 2 * HOUR, 1200.0, start_line=False),
        Episode("checkpoint", 3.5 * HOUR, 900.0, start_line=True, end_line=False),
    )
    at_pauses = ((2 * HOUR - 1, blocks[0], None), (3.5 * HOUR - 1, blocks[0], None))
    printed = (*((HOUR + i * 600.0 + 30, name, None) for i, name in enumerate(blocks)), *at_pauses)
    shape = {"step_s": 900.0} if agent else {}
    healthy = job("harmless", episodes=pauses, agent=agent, harmless=printed, eval_results=False, **shape)
    # When replayed / Then never stopped nor warned (an alert with the words is allowed)
    outcome = faultmix.run_job(healthy)
    assert outcome.stop_s is None
    assert outcome.warnings_healthy == 0


def test_with_the_agent_a_hang_is_alerted_within_two_minutes_by_the_stall_record() -> None:
    # Given a job with the agent whose collective hangs (no watchdog for an hour) / When replayed
    hung = job("hang-stacks", Fault("hang", "NIC", 2 * HOUR), nccl_timeout_s=3600.0)
    outcome = faultmix.run_job(hung)
    # Then the ranks' stall record (a minute in) wakes the engine, which alerts within 2 minutes of the onset
    assert outcome.alert_s is not None
    assert 0 <= outcome.alert_s - hung.fault.onset_s <= 2 * 60


def test_the_draw_is_seeded_and_follows_the_mix() -> None:
    jobs = draw_jobs(seed=3, job_days=20)
    assert [j.name for j in jobs] == [j.name for j in draw_jobs(seed=3, job_days=20)]
    assert sum(j.days for j in jobs) >= 20
    kinds = {j.fault.kind for j in jobs if j.fault}
    assert kinds <= {"crash", "hang", "lost", "slow"}
    assert "crash" in kinds
    # and some healthy jobs print real harmless lines (some on every rank), some crashes loop
    assert any(host is None for j in jobs for _, _, host in j.harmless)
    crashes = [j for j in draw_jobs(seed=7, job_days=100) if j.fault and j.fault.kind == "crash"]
    assert 0.1 <= sum(j.crash_loop for j in crashes) / len(crashes) <= 0.3
