"""The decision engine: each diagnosis from its signals, each mode's action, and the state between decisions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.core.decision import Action, Decision, Diagnosis, JobState
from stallwatch.core.diagnosis import UNCONFIRMED
from stallwatch.core.engine import decide, next_state
from stallwatch.core.policy import EffectivePolicy, Mode, Policy, Thresholds
from stallwatch.core.signals import Platform
from tests.core.signals_builder import SignalsBuilder

MIN = 60.0
HOUR = 3600.0
ONSET = HOUR  # the stall begins one hour into training
PLATFORMS = [Platform.SAGEMAKER, Platform.EC2]


def policy(mode: Mode = Mode.ENFORCE, tagged: bool = True, **thresholds: object) -> EffectivePolicy:
    tags = {"stallwatch:mode": mode.value} if tagged else {}
    return Policy(mode=mode, thresholds=Thresholds(**thresholds)).for_job(tags)


ENFORCE = policy()
FRESH = JobState()


def hung(platform: Platform = Platform.SAGEMAKER, hosts: int = 2, end: float = 3 * HOUR) -> SignalsBuilder:
    """The agent's steps stop at ONSET; GPUs stay at 99% but power drops; another thread keeps logging."""
    return (
        SignalsBuilder(hosts=hosts, platform=platform)
        .progress(0, ONSET)
        .no_progress(ONSET, end)
        .gpu(0, end, 99.0)
        .power(0, ONSET, 350.0)
        .power(ONSET, end, 110.0)
        .logs(0, end, 30)
    )


def stuck(platform: Platform = Platform.SAGEMAKER, hosts: int = 2, end: float = 3 * HOUR) -> SignalsBuilder:
    """The agent's steps stop at ONSET; GPU utilization falls to 40% and power drops: two signals agree (no step, GPU
    activity fallen on every host), but not the spinning collective of `hung` (GPUs busy)."""
    return (
        SignalsBuilder(hosts=hosts, platform=platform)
        .progress(0, ONSET)
        .no_progress(ONSET, end)
        .gpu(0, ONSET, 99.0)
        .gpu(ONSET, end, 40.0)
        .power(0, ONSET, 350.0)
        .power(ONSET, end, 110.0)
        .logs(0, end, 30)
    )


def idle_without_agent(platform: Platform = Platform.SAGEMAKER, hosts: int = 2, end: float = 3 * HOUR):
    """No agent: GPUs busy and logs flowing until ONSET, then GPUs idle and logs silent."""
    return SignalsBuilder(hosts=hosts, platform=platform).gpu(0, ONSET, 97.0).gpu(ONSET, end, 0.5).logs(0, ONSET, 30)


def diagnose(
    builder: SignalsBuilder, now: float, effective: EffectivePolicy = ENFORCE, state: JobState = FRESH
) -> Decision:
    return decide(builder.build(now), effective, state, now)


def run(builder: SignalsBuilder, times: list[float], effective: EffectivePolicy = ENFORCE, state: JobState = FRESH):
    """Decide at each time, carrying the state like the watchdog and the replay do."""
    decisions = []
    for now in times:
        decision = decide(builder.build(now), effective, state, now)
        state = next_state(state, decision)
        decisions.append(decision)
    return decisions, state


# --- hang at 100% GPU utilization (agent) -------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_hang_with_busy_gpus_and_dropped_power_is_a_hang(platform: Platform) -> None:
    # Given steps stopped at ONSET while GPUs stay at 99% and power fell from 350 W to 110 W
    builder = hung(platform)
    # When 16 minutes have passed (threshold 15)
    decision = diagnose(builder, ONSET + 16 * MIN)
    # Then it is a hang, warned in enforce, with the evidence
    assert decision.diagnosis is Diagnosis.HANG
    assert decision.action is Action.WARN
    assert decision.stalled
    assert decision.stoppable
    hosts = decision.evidence["hosts"]
    assert set(hosts) == set(builder.host_names)
    assert all(h["power_dropped"] and h["gpu_util_now"] == 99.0 for h in hosts.values())
    assert decision.evidence["agent"]["last_step_t"] == ONSET
    assert decision.evidence["agent"]["step"] == ONSET  # one step a second
    text = " ".join(decision.reasons)
    assert "no completed step for 16.0 min" in text
    assert "power dropped on 2/2 hosts" in text
    assert "logs are still active, but the agent reports no steps" in text


def test_no_step_and_power_fallen_on_every_host_agree_after_two_thirds_of_the_threshold() -> None:
    # Given steps stopped at ONSET and power fell on both hosts: two independent signals agree
    # When 9 minutes have passed / Then not yet, and the decision names the time they agree
    early = diagnose(stuck(), ONSET + 9 * MIN)
    assert early.diagnosis is Diagnosis.HEALTHY
    assert early.recheck_at == pytest.approx(ONSET + 10 * MIN)
    # When 11 (past 2/3 of 15) / Then a hang, with the normal grace
    decision = diagnose(stuck(), ONSET + 11 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.HANG, Action.WARN)
    assert "10.0 min as GPU activity fell on every host too" in decision.reasons[0]
    assert decision.recheck_at == pytest.approx(ONSET + 16 * MIN)  # the stop, 5 minutes after the warning


def test_a_collective_spinning_on_every_host_decides_after_crash_confirm_with_the_short_grace() -> None:
    # Given steps stopped at ONSET, GPUs still busy at 99% and power fell on both hosts: three signals agree
    # When 2 minutes have passed / Then not yet, and the decision names the time it will be decisive
    early = diagnose(hung(), ONSET + 2 * MIN)
    assert early.diagnosis is Diagnosis.HEALTHY
    assert early.recheck_at == pytest.approx(ONSET + 3 * MIN)
    # When 3 minutes (crash_confirm_minutes) / Then a hang, warned with the 2-minute grace of conclusive evidence
    decisions, state = run(hung(), [ONSET + 3 * MIN, ONSET + 4.9 * MIN, ONSET + 5 * MIN])
    assert [(d.diagnosis, d.action) for d in decisions] == [
        (Diagnosis.HANG, Action.WARN),
        (Diagnosis.HANG, Action.NONE),
        (Diagnosis.HANG, Action.STOP),
    ]
    assert "a collective spins on every host" in decisions[0].reasons[0]
    assert decisions[0].recheck_at == pytest.approx(ONSET + 5 * MIN)
    assert state.stopped_at == ONSET + 5 * MIN


def test_no_step_alone_waits_the_full_threshold_and_asks_to_be_decided_again() -> None:
    # Given steps stopped at ONSET, GPUs busy and no power reported: a lone signal
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).no_progress(ONSET, 3 * HOUR).gpu(0, 3 * HOUR, 99.0)
    # When the early alarm fires at 11 minutes
    early = diagnose(builder, ONSET + 11 * MIN)
    # Then nothing happens yet, but the engine asks to be decided again at the full 15 minutes
    assert (early.diagnosis, early.action) == (Diagnosis.HEALTHY, Action.NONE)
    assert early.recheck_at == pytest.approx(ONSET + 15 * MIN)
    assert next_state(FRESH, early).recheck_at == early.recheck_at
    # And at 16 minutes it is a hang
    assert diagnose(builder, ONSET + 16 * MIN).diagnosis is Diagnosis.HANG


def test_fresh_logs_do_not_prove_progress_when_the_agent_reports_no_steps() -> None:
    # Given a chatty job (a line every 5 s on every host) whose steps stopped
    builder = hung().logs(ONSET, 3 * HOUR, 5)
    # Then the agent's silence on steps wins
    assert diagnose(builder, ONSET + 20 * MIN).diagnosis is Diagnosis.HANG


def test_steps_slowing_to_25_minutes_at_full_power_are_slow_never_a_stall() -> None:
    # Given 1-second steps, then 25-minute steps (throttled storage) while the GPUs keep drawing full power
    builder = SignalsBuilder(hosts=1).progress(0, ONSET).progress(ONSET, 4 * HOUR, step_time=25 * MIN)
    builder.gpu(0, 4 * HOUR, 97).power(0, 4 * HOUR, 380).logs(0, 4 * HOUR, 60)
    # When sweeps run through the first slow step and beyond
    decisions, state = run(builder, [ONSET + k * 5 * MIN for k in range(1, 24)])
    # Then the 20th minute without a step is slow, as power holds; never warned or stopped
    assert decisions[3].diagnosis is Diagnosis.SLOW
    assert "GPU power holds" in decisions[3].reasons[1]
    assert {d.action for d in decisions} == {Action.NONE, Action.ALERT}
    assert state.warned_at is None
    # And once two slow steps are in, the new pace is slow by its step times, alerted once more, no flapping
    slow_by_pace = [d for d in decisions if "steps take" in d.reasons[0]]
    assert slow_by_pace[0].at == ONSET + 50 * MIN
    assert all(d.diagnosis is Diagnosis.SLOW for d in decisions if d.at >= ONSET + 50 * MIN)
    assert [d.action for d in decisions].count(Action.ALERT) == 2


def test_no_progress_with_all_gpus_idle_is_idle_with_the_agent() -> None:
    builder = (
        SignalsBuilder(hosts=2)
        .progress(0, ONSET)
        .no_progress(ONSET, 2 * HOUR)
        .gpu(0, ONSET, 95)
        .gpu(ONSET, 2 * HOUR, 0.0)
    )
    assert diagnose(builder, ONSET + 16 * MIN).diagnosis is Diagnosis.IDLE


def test_nccl_watchdog_timeouts_alone_confirm_a_hang_before_the_stall_threshold() -> None:
    # Given a hang whose collectives time out after 5 minutes on every rank
    builder = hung()
    for host in builder.host_names:
        builder.log(
            ONSET + 5 * MIN,
            "[E ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)",
            host,
        )
    # When the timeouts are 5 minutes old (crash_confirm_minutes)
    decision = diagnose(builder, ONSET + 10 * MIN)
    # Then it is a hang (the ranks wait on each other), not a crashed rank
    assert decision.diagnosis is Diagnosis.HANG
    assert "nccl_timeout" in decision.reasons[0]


def test_agent_gpu_utilization_stands_in_for_missing_platform_metrics() -> None:
    # Given an EC2 host without the CloudWatch agent: only the trainer agent's own NVML utilization
    builder = SignalsBuilder(hosts=1, platform=Platform.EC2).progress(0, ONSET).no_progress(ONSET, 2 * HOUR)
    builder.host_metric("GPUUtilization", 0, ONSET, 96).host_metric("GPUUtilization", ONSET, 2 * HOUR, 0)
    decision = diagnose(builder, ONSET + 16 * MIN)
    assert decision.diagnosis is Diagnosis.IDLE
    assert decision.evidence["hosts"][builder.host_names[0]]["gpu_util_before"] == 96.0


# --- one rank crashed -----------------------------------------------------------------------------------------------


def unconfirmed(decision: Decision) -> bool:
    """A fatal line alone: alerted with its words, never stoppable (it waits for a second witness)."""
    return (
        decision.diagnosis is Diagnosis.CRASHED_RANK
        and decision.action is Action.ALERT
        and not decision.stoppable
        and UNCONFIRMED in decision.reasons
    )


@pytest.mark.parametrize(("others_gpu", "platform"), [(99.0, Platform.SAGEMAKER), (0.0, Platform.EC2)])
def test_fatal_error_on_one_host_while_the_others_spin_is_a_crashed_rank(others_gpu: float, platform) -> None:
    # Given 4 hosts; steps stop at ONSET; host 3 logs a CUDA illegal memory access; the others spin (busy or idle)
    builder = SignalsBuilder(hosts=4, platform=platform).progress(0, ONSET).no_progress(ONSET, 2 * HOUR)
    builder.gpu(0, ONSET, 98).gpu(ONSET, 2 * HOUR, others_gpu).logs(0, 2 * HOUR, 30, hosts=builder.host_names[:1])
    crashed = builder.host_names[2]
    builder.log(ONSET + 10, "Traceback (most recent call last):", crashed)
    builder.log(ONSET + 10, "RuntimeError: CUDA error: an illegal memory access was encountered", crashed)
    # When the error is 2 minutes old / Then alerted with its words, not yet stoppable (3 minutes without a step)
    assert unconfirmed(diagnose(builder, ONSET + 10 + 2 * MIN))
    # When it is 3 minutes old / Then a crashed rank, with that host's error lines as evidence
    decision = diagnose(builder, ONSET + 10 + 3 * MIN)
    assert decision.diagnosis is Diagnosis.CRASHED_RANK
    assert decision.action is Action.WARN
    assert f"{crashed}: illegal_memory_access, traceback" in decision.reasons[0]
    errors = decision.evidence["hosts"][crashed]["errors"]
    assert [e["pattern"] for e in errors] == ["traceback", "illegal_memory_access"]
    assert all(not h["errors"] for name, h in decision.evidence["hosts"].items() if name != crashed)


def test_rank_zero_crash_takes_the_agent_with_it_and_is_still_a_crashed_rank() -> None:
    # Given 2 hosts; rank 0 (algo-1, the agent's job metrics) dies of a CUDA error at ONSET and its metrics stop;
    # algo-2 spins in its collective and a thread of it keeps logging
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).gpu(0, 2 * HOUR, 99).logs(0, 2 * HOUR, 30, hosts=["algo-2"])
    builder.logs(0, ONSET, 30, hosts=["algo-1"])
    builder.log(ONSET + 1, "Traceback (most recent call last):", "algo-1")
    builder.log(ONSET + 1, "RuntimeError: CUDA error: an illegal memory access was encountered", "algo-1")
    # When algo-1 has been silent after its error past the crash confirmation
    decision = diagnose(builder, ONSET + 1 + 6 * MIN)
    # Then a crashed rank on algo-1, although the other host's logs are active and the agent is gone
    assert decision.diagnosis is Diagnosis.CRASHED_RANK
    assert decision.action is Action.WARN
    assert any("agent metrics stopped" in reason for reason in decision.reasons)
    assert decision.evidence["hosts"]["algo-1"]["errors"]
    assert not decision.evidence["hosts"]["algo-2"]["errors"]


def test_traceback_followed_by_more_steps_is_not_a_crash() -> None:
    # Given a caught exception logged mid-run, after which steps continue
    builder = SignalsBuilder(hosts=2).progress(0, 2 * HOUR).gpu(0, 2 * HOUR, 97).logs(0, 2 * HOUR, 30)
    builder.log(ONSET, "Traceback (most recent call last):", "algo-2")
    decision = diagnose(builder, ONSET + 30 * MIN)
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert decision.evidence["hosts"]["algo-2"]["errors"][0]["pattern"] == "traceback"


def test_crash_confirmation_waits_for_two_step_intervals_on_slow_steps() -> None:
    # Given 4-minute steps, then a CUDA OOM on one host right after the last step
    builder = SignalsBuilder(hosts=2).progress(0, ONSET, step_time=4 * MIN).no_progress(ONSET, 2 * HOUR)
    builder.gpu(0, 2 * HOUR, 97).log(ONSET + 30, "torch.OutOfMemoryError: CUDA out of memory.", "algo-2")
    # Then 6 minutes is within two step intervals (8 min): the line alone is alerted; 9 minutes is not
    assert unconfirmed(diagnose(builder, ONSET + 30 + 6 * MIN))
    assert diagnose(builder, ONSET + 30 + 9 * MIN).stoppable


def test_crashed_rank_without_the_agent_needs_the_host_silent_after_its_error() -> None:
    # Given no agent; algo-2 (a line every 30 s) dies with an Xid and says nothing more; algo-1 keeps logging
    builder = SignalsBuilder(hosts=2).gpu(0, 2 * HOUR, 99).logs(0, 2 * HOUR, 30, hosts=["algo-1"])
    builder.logs(0, ONSET, 30, hosts=["algo-2"]).log(ONSET + 1, "NVRM: Xid (PCI:0000:10:1c): 79, pid=42", "algo-2")
    # When algo-2 has been silent for less than 10 x its 30-s cadence (and crash_confirm_minutes) / Then no verdict
    assert diagnose(builder, ONSET + 4 * MIN).diagnosis is Diagnosis.HEALTHY
    # When longer / Then a crashed rank
    decision = diagnose(builder, ONSET + 6 * MIN)
    assert decision.diagnosis is Diagnosis.CRASHED_RANK
    assert "algo-2: xid" in decision.reasons[0]
    assert "algo-2: no line for 6.0 min, its habit owed one in 5.0 min" in decision.reasons


def test_fatal_last_words_whose_gpus_are_not_yet_seen_dead_ask_for_a_look_when_they_would_be_confirmed() -> None:
    # Given no agent; algo-2's rank died at ONSET (its traceback, then silence) while algo-1 spins; its GPUs' idle
    # minute is not complete yet when the line is read (a fatal line's wake-up decides seconds after it)
    builder = SignalsBuilder(hosts=2).gpu(0, 3 * HOUR, 99, hosts=["algo-1"]).logs(0, ONSET, 300)
    builder.gpu(0, ONSET, 99, hosts=["algo-2"]).gpu(ONSET, 3 * HOUR, 0, hosts=["algo-2"])
    builder.log(ONSET + 1, "RuntimeError: CUDA error: an illegal memory access was encountered", "algo-2")
    early = diagnose(builder, ONSET + 15)
    # Then no verdict yet (its words alerted), and the decision asks to be made again when its death would be
    # confirmed
    assert unconfirmed(early)
    assert early.recheck_at == pytest.approx(ONSET + 1 + 3 * MIN)
    # And then it is: its GPUs went idle with it
    assert diagnose(builder, ONSET + 1 + 3 * MIN).diagnosis is Diagnosis.CRASHED_RANK


def test_quiet_rank_whose_last_line_is_a_traceback_is_not_taken_for_crashed() -> None:
    # Given algo-2 only printed startup lines, then (an hour later) a caught exception's traceback; algo-1 logs on
    builder = SignalsBuilder(hosts=2).gpu(0, 3 * HOUR, 97).logs(0, 3 * HOUR, 30, hosts=["algo-1"])
    builder.logs(0, 2 * MIN, 5, hosts=["algo-2"]).log(ONSET, "Traceback (most recent call last):", "algo-2")
    # Then its own silences are long (its longest gap: 58 min): 30 minutes of quiet after it prove nothing
    assert diagnose(builder, ONSET + 30 * MIN).diagnosis is Diagnosis.HEALTHY


# --- a heterogeneous cluster with a CPU-only group ------------------------------------------------------------------

GPU_HOSTS = ["algo-1", "algo-2"]
WITH_DATA_GROUP = {"algo-1": "ml.p4d.24xlarge", "algo-2": "ml.p4d.24xlarge", "algo-3": "ml.c5.18xlarge"}


def test_a_cpu_only_group_is_judged_by_its_logs_and_never_holds_back_an_idle_job_without_the_agent() -> None:
    # Given 2 GPU hosts and a CPU-only data host (no GPU metrics there): GPUs idle and every log silent after ONSET
    builder = SignalsBuilder(hosts=3, host_types=WITH_DATA_GROUP).logs(0, ONSET, 30)
    builder.gpu(0, ONSET, 97.0, hosts=GPU_HOSTS).gpu(ONSET, 3 * HOUR, 0.5, hosts=GPU_HOSTS)
    # When idle and silent 11 min / Then idle: the GPU hosts agree with the silent logs, as on an all-GPU job
    decision = diagnose(builder, ONSET + 11 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.IDLE, Action.WARN)
    assert "on all 2 hosts" in " ".join(decision.reasons)
    # But when the data host still logs, the job is not silent
    talking = builder.logs(ONSET, 3 * HOUR, 60, hosts=["algo-3"])
    assert diagnose(talking, ONSET + HOUR).diagnosis is Diagnosis.HEALTHY


def test_a_cpu_only_group_without_gpu_data_does_not_slow_the_agents_hang_decision() -> None:
    # Given the agent's steps stopped at ONSET and power fell on both GPU hosts; the data host reports no GPU
    builder = SignalsBuilder(hosts=3, host_types=WITH_DATA_GROUP).progress(0, ONSET).no_progress(ONSET, 3 * HOUR)
    builder.gpu(0, 3 * HOUR, 99.0, hosts=GPU_HOSTS).logs(0, 3 * HOUR, 30)
    builder.power(0, ONSET, 350.0, hosts=GPU_HOSTS).power(ONSET, 3 * HOUR, 110.0, hosts=GPU_HOSTS)
    # When 4 min have passed / Then the collective spins on every GPU host, as on an all-GPU job
    decision = diagnose(builder, ONSET + 4 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.HANG, Action.WARN)
    assert "a collective spins on every host" in decision.reasons[0]


def test_a_job_without_gpus_is_never_taken_for_idle_gpus() -> None:
    # Given a CPU-only job (no accelerator on any host) whose logs fell silent, without the agent
    builder = SignalsBuilder(hosts=2, gpus_per_host=0).logs(0, ONSET, 30)
    # Then its silence alone is never an idle-GPU stop
    decision = diagnose(builder, ONSET + 2 * HOUR)
    assert not decision.stoppable
    assert decision.diagnosis is not Diagnosis.IDLE


# --- all idle and silent without the agent ---------------------------------------------------------------------------


@pytest.mark.parametrize("platform", PLATFORMS)
def test_all_gpus_idle_and_logs_silent_without_agent_is_idle(platform: Platform) -> None:
    builder = idle_without_agent(platform)
    # When silent and idle 9 min (thresholds 15; the two agree after 2/3 of them) / Then healthy
    assert diagnose(builder, ONSET + 9 * MIN).diagnosis is Diagnosis.HEALTHY
    # When silent and idle past 10 min / Then idle
    decision = diagnose(builder, ONSET + 11 * MIN)
    assert decision.diagnosis is Diagnosis.IDLE
    assert decision.action is Action.WARN
    assert "agent" not in decision.evidence
    assert decision.evidence["logs"]["silence_s"] == pytest.approx(11 * MIN)


def test_idle_gpus_with_active_logs_are_not_a_stall() -> None:
    builder = idle_without_agent().logs(ONSET, 3 * HOUR, 60)
    assert diagnose(builder, ONSET + HOUR).diagnosis is Diagnosis.HEALTHY


def test_silence_with_one_host_idle_and_one_busy_is_not_a_stall_without_the_agent() -> None:
    builder = SignalsBuilder(hosts=2).gpu(0, ONSET, 97).logs(0, ONSET, 30)
    builder.gpu(ONSET, 3 * HOUR, 0.5, hosts=["algo-1"]).gpu(ONSET, 3 * HOUR, 60.0, hosts=["algo-2"])
    decision = diagnose(builder, ONSET + HOUR)
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert decision.action is Action.NONE


def test_missing_host_metrics_never_stop_by_themselves() -> None:
    # Given a 2-host job with logs silent, but utilization known for only one host
    builder = SignalsBuilder(hosts=2).gpu(0, ONSET, 97, hosts=["algo-1"]).gpu(ONSET, 3 * HOUR, 0, hosts=["algo-1"])
    builder.logs(0, ONSET, 30)
    # Then no stall: the other host's GPUs may be working
    assert diagnose(builder, ONSET + HOUR).diagnosis is Diagnosis.HEALTHY


def test_busy_gpus_with_silent_logs_without_agent_is_a_hang() -> None:
    builder = SignalsBuilder(hosts=2).gpu(0, 3 * HOUR, 100.0).logs(0, ONSET, 30)
    decision = diagnose(builder, ONSET + 21 * MIN)
    assert decision.diagnosis is Diagnosis.HANG
    assert "at or above 90%" in " ".join(decision.reasons)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_busy_gpus_without_any_log_line_are_not_a_hang(platform: Platform) -> None:
    # Given a job without the agent whose logs never reach CloudWatch (an EC2 host without log shipping)
    builder = SignalsBuilder(hosts=2, platform=platform).gpu(0, 3 * HOUR, 100.0)
    # When its GPUs have been busy for hours
    decision = diagnose(builder, ONSET + HOUR)
    # Then busy GPUs alone are training, not a hang
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert decision.action is Action.NONE


def test_log_silence_threshold_learns_the_logging_cadence() -> None:
    # Given a job without the agent that logs once every 5 minutes: 10 x 5 min = 50 min of silence is normal
    builder = SignalsBuilder(hosts=1).gpu(0, ONSET, 97).gpu(ONSET, 4 * HOUR, 0).logs(0, ONSET, 5 * MIN)
    # (idle GPUs agree with the silence, so 2/3 of it decides)
    assert diagnose(builder, ONSET + 32 * MIN).diagnosis is Diagnosis.HEALTHY
    decision = diagnose(builder, ONSET + 35 * MIN)
    assert decision.diagnosis is Diagnosis.IDLE
    assert decision.evidence["logs"]["threshold_s"] == pytest.approx(50 * MIN)


def test_vanished_agent_with_idle_gpus_and_silent_logs_is_idle() -> None:
    # Given the agent's metrics stop at ONSET, GPUs go idle and the logs fall silent
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).gpu(0, ONSET, 97).gpu(ONSET, 3 * HOUR, 0).logs(0, ONSET, 30)
    decision = diagnose(builder, ONSET + 21 * MIN)
    assert decision.diagnosis is Diagnosis.IDLE
    assert decision.reasons[0].startswith("agent metrics stopped 21.0 min ago")


def test_agent_emitting_less_often_than_the_alarm_period_is_not_taken_for_vanished() -> None:
    # Given 10-second alarm periods (the demo) and an agent that emits every 2 minutes, now 4 minutes since its last
    effective = policy(alarm_period_seconds=10)
    builder = SignalsBuilder(hosts=1).progress(0, ONSET, every=120).no_progress(ONSET, ONSET + 20 * MIN, every=120)
    builder.gpu(0, 2 * HOUR, 99).logs(0, 2 * HOUR, 30)
    decision = diagnose(builder, ONSET + 24 * MIN, effective)
    # Then the agent still counts (5 of its windows) and decides: a hang, though the logs flow
    assert decision.evidence["agent"]["fresh"] is True
    assert decision.diagnosis is Diagnosis.HANG


def test_vanished_agent_alone_never_stops() -> None:
    # Given the agent's metrics stop but GPUs stay busy and the logs keep coming
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).gpu(0, 3 * HOUR, 97).logs(0, 3 * HOUR, 30)
    decision = diagnose(builder, ONSET + 2 * HOUR)
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert decision.action is Action.NONE


# --- startup -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("secondary", ["Starting", "Downloading", "DownloadingTrainingImage"])
def test_startup_statuses_are_never_a_stall(secondary: str) -> None:
    builder = SignalsBuilder(hosts=2, secondary_status=secondary).gpu(0, 3 * HOUR, 0)
    within = diagnose(builder, 30 * MIN)
    assert (within.diagnosis, within.action) == (Diagnosis.STARTING, Action.NONE)
    # Beyond the 60-minute grace it is worth an alert, never a warning or a stop
    decisions, _ = run(builder, [90 * MIN, 95 * MIN, 3 * HOUR])
    assert [d.diagnosis for d in decisions] == [Diagnosis.STARTING] * 3
    assert [d.action for d in decisions] == [Action.ALERT, Action.NONE, Action.NONE]


def test_no_step_yet_within_grace_is_starting_and_beyond_it_a_stall() -> None:
    # Given Training for 40 minutes with the agent emitting Steps=0 (compiling, loading a checkpoint)
    builder = SignalsBuilder(hosts=1).no_progress(0, 3 * HOUR).gpu(0, 3 * HOUR, 30)
    assert diagnose(builder, 40 * MIN).diagnosis is Diagnosis.STARTING
    decision = diagnose(builder, 61 * MIN)
    assert decision.diagnosis is Diagnosis.HANG
    assert "no step at all in 61.0 min of training" in decision.reasons[0]


def test_agent_that_never_reports_a_step_on_a_working_job_is_alerted_not_stopped() -> None:
    # Given Steps=0 for 3 hours while GPUs stay busy at steady power and the logs flow (agent.step() never called)
    builder = SignalsBuilder(hosts=2).no_progress(0, 4 * HOUR).gpu(0, 4 * HOUR, 95).power(0, 4 * HOUR, 360)
    decisions, state = run(builder.logs(0, 4 * HOUR, 30), [2 * HOUR, 3 * HOUR])
    assert [(d.diagnosis, d.action) for d in decisions] == [
        (Diagnosis.STARTING, Action.ALERT),
        (Diagnosis.STARTING, Action.NONE),
    ]
    assert "is agent.step() called?" in decisions[0].reasons[1]
    assert state.warned_at is None


def test_startup_grace_counts_from_the_training_transition() -> None:
    # Given Training began 50 minutes after the job started (a long download)
    builder = SignalsBuilder(hosts=1, training_at=50 * MIN).no_progress(50 * MIN, 3 * HOUR).gpu(0, 3 * HOUR, 0)
    assert diagnose(builder, 100 * MIN).diagnosis is Diagnosis.STARTING


def test_gpus_never_active_within_grace_is_starting_without_the_agent() -> None:
    builder = SignalsBuilder(hosts=2).gpu(0, 3 * HOUR, 0).logs(0, 5 * MIN, 10)
    assert diagnose(builder, 45 * MIN).diagnosis is Diagnosis.STARTING
    assert diagnose(builder, 61 * MIN).diagnosis is Diagnosis.IDLE


def test_uploading_after_training_is_healthy() -> None:
    builder = SignalsBuilder(hosts=1, secondary_status="Uploading").gpu(0, 3 * HOUR, 0)
    assert diagnose(builder, 3 * HOUR).diagnosis is Diagnosis.HEALTHY


# --- declared phases -------------------------------------------------------------------------------------------------


def phased(budget_s: float) -> SignalsBuilder:
    """Steps until ONSET, then a declared checkpoint phase with `budget_s`; GPUs quiet meanwhile."""
    return SignalsBuilder(hosts=2).progress(0, ONSET).phase(ONSET, budget_s, 4 * HOUR).gpu(0, 4 * HOUR, 3)


def test_phase_within_budget_is_not_a_stall() -> None:
    # Given a 45-minute budget / When 30 minutes in (twice the stall threshold) / Then a phase
    decision = diagnose(phased(45 * MIN), ONSET + 30 * MIN)
    assert decision.diagnosis is Diagnosis.PHASE
    assert decision.action is Action.NONE


def test_phase_overrun_is_allowed_its_margin_then_is_a_stall() -> None:
    builder = phased(45 * MIN)
    within_margin = diagnose(builder, ONSET + 54 * MIN)
    assert within_margin.diagnosis is Diagnosis.PHASE
    overrun = diagnose(builder, ONSET + 56 * MIN)
    assert overrun.diagnosis is Diagnosis.PHASE_OVERRUN
    assert overrun.action is Action.WARN
    assert overrun.evidence["phase"]["overrun_s"] == pytest.approx(11 * MIN)


def test_steps_after_a_phase_end_it() -> None:
    # Given a phase that ended and then a hang: the hang is judged from the last step after the phase
    builder = SignalsBuilder(hosts=1).progress(0, ONSET).phase(ONSET, 10 * MIN, ONSET + 5 * MIN)
    builder.progress(ONSET + 5 * MIN, 2 * HOUR).no_progress(2 * HOUR, 3 * HOUR).gpu(0, 3 * HOUR, 99)
    decision = diagnose(builder, 2 * HOUR + 16 * MIN)
    assert decision.diagnosis is Diagnosis.HANG
    assert "phase" not in decision.evidence


def test_a_phase_that_ended_within_its_budget_leaves_a_long_steps_gap_to_the_step_rules() -> None:
    # Given 15-minute steps and a 2-minute checkpoint declared with 5 minutes: the agent's 0 came before the budget ran
    # out, so the phase is over, and the next step is due within the step threshold, not the phase's allowance.
    end = ONSET + 2 * MIN
    builder = SignalsBuilder(hosts=1).progress(0, ONSET, step_time=15 * MIN).phase(ONSET, 5 * MIN, end)
    builder.no_progress(end, 3 * HOUR).agent("PhaseBudgetRemaining", end, 3 * HOUR, 0.0).gpu(0, 3 * HOUR, 97)
    decision = diagnose(builder, ONSET + 25 * MIN)  # 20 minutes past the budget
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert "phase" not in decision.evidence


def test_a_phase_past_its_budget_waits_a_long_steps_gap_before_it_overran() -> None:
    # Given 15-minute steps and a 5-minute budget the agent's windows outlast: the phase may have ended at its budget,
    # and a step is then due within the learned gap (5 x 15 minutes), which widens the 10-minute allowance.
    builder = SignalsBuilder(hosts=1).progress(0, ONSET, step_time=15 * MIN).phase(ONSET, 5 * MIN, 4 * HOUR)
    builder.gpu(0, 4 * HOUR, 3)
    assert diagnose(builder, ONSET + 79 * MIN).diagnosis is Diagnosis.PHASE
    assert diagnose(builder, ONSET + 81 * MIN).diagnosis is Diagnosis.PHASE_OVERRUN


# --- slow but progressing ---------------------------------------------------------------------------------------------


def test_job_with_25_minute_steps_is_not_stalled_after_20_minutes() -> None:
    builder = SignalsBuilder(hosts=1).progress(0, 5 * HOUR, step_time=25 * MIN).gpu(0, 5 * HOUR, 97)
    decision = diagnose(builder, 4 * HOUR + 20 * MIN)  # last step at 4 h 10 min
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert decision.evidence["agent"]["stall_threshold_s"] == pytest.approx(5 * 25 * MIN)


def test_adaptive_threshold_learns_from_step_deltas_without_step_time() -> None:
    # Given 25-minute steps but no StepTime metric: the interval comes from the Step counter
    builder = SignalsBuilder(hosts=1).progress(0, 5 * HOUR, step_time=25 * MIN).gpu(0, 5 * HOUR, 97)
    signals = builder.build(4 * HOUR + 20 * MIN)
    signals = replace(signals, agent={k: v for k, v in signals.agent.items() if k != "StepTime"})
    decision = decide(signals, ENFORCE, JobState(), signals.now)
    assert decision.diagnosis is Diagnosis.HEALTHY
    assert decision.evidence["agent"]["step_interval_s"] == pytest.approx(25 * MIN)


def test_slow_steps_are_slow_never_a_stall() -> None:
    # Given 1-second steps that become 6-second steps (a straggler) / Then slow, alerted once, never warned
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).progress(ONSET, 3 * HOUR, step_time=6).gpu(0, 3 * HOUR, 95)
    decisions, state = run(builder, [ONSET + 4 * MIN, ONSET + 9 * MIN])
    assert decisions[0].diagnosis is Diagnosis.SLOW
    assert [d.action for d in decisions] == [Action.ALERT, Action.NONE]
    assert (state.stall_since, state.warned_at) == (None, None)


# --- data starvation and non-finite loss -------------------------------------------------------------------------


def test_data_starvation_is_alerted_never_stopped() -> None:
    builder = (
        SignalsBuilder(hosts=1)
        .progress(0, 4 * HOUR)
        .agent("DataWaitFraction", ONSET, 4 * HOUR, 70)
        .gpu(0, 4 * HOUR, 30)
    )
    decisions, _ = run(builder, [ONSET + k * 5 * MIN for k in range(1, 12)])
    assert {d.diagnosis for d in decisions} == {Diagnosis.DATA_STARVATION}
    assert [d.action for d in decisions] == [Action.ALERT] + [Action.NONE] * 10
    assert decisions[0].evidence["data_wait_percent"] == 70.0


def test_observe_mode_audits_a_problem_that_is_never_stopped() -> None:
    builder = SignalsBuilder(hosts=1).progress(0, 2 * HOUR).agent("DataWaitFraction", ONSET, 2 * HOUR, 90)
    decision = diagnose(builder.gpu(0, 2 * HOUR, 20), ONSET + 10 * MIN, policy(Mode.OBSERVE))
    assert (decision.diagnosis, decision.action, decision.would) == (
        Diagnosis.DATA_STARVATION,
        Action.AUDIT,
        Action.ALERT,
    )


def test_non_finite_loss_is_alerted_and_not_stopped_by_default() -> None:
    builder = (
        SignalsBuilder(hosts=1).progress(0, 3 * HOUR).agent("NonFiniteLoss", ONSET, 3 * HOUR, 3).gpu(0, 3 * HOUR, 97)
    )
    decisions, _ = run(builder, [ONSET + 5 * MIN, ONSET + 15 * MIN])
    assert [(d.diagnosis, d.action) for d in decisions] == [
        (Diagnosis.NONFINITE_LOSS, Action.ALERT),
        (Diagnosis.NONFINITE_LOSS, Action.NONE),
    ]


def test_non_finite_loss_warns_then_stops_when_the_policy_says_so() -> None:
    builder = (
        SignalsBuilder(hosts=1).progress(0, 3 * HOUR).agent("NonFiniteLoss", ONSET, 3 * HOUR, 3).gpu(0, 3 * HOUR, 97)
    )
    effective = policy(stop_on_nonfinite_loss=True)
    decisions, state = run(builder, [ONSET + 5 * MIN, ONSET + 10 * MIN], effective)
    assert [d.action for d in decisions] == [Action.WARN, Action.STOP]
    assert state.stopped_at == ONSET + 10 * MIN


def test_old_non_finite_loss_no_longer_counts() -> None:
    builder = SignalsBuilder(hosts=1).progress(0, 3 * HOUR).agent("NonFiniteLoss", ONSET, ONSET + MIN, 1)
    assert diagnose(builder.gpu(0, 3 * HOUR, 97), ONSET + 30 * MIN).diagnosis is Diagnosis.HEALTHY


# --- finished -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["Completed", "Failed", "Stopping", "Stopped"])
def test_job_not_in_progress_is_finished(status: str) -> None:
    builder = hung()
    builder.status = status
    decision = diagnose(builder, ONSET + HOUR)
    assert (decision.diagnosis, decision.action) == (Diagnosis.FINISHED, Action.NONE)


# --- modes ----------------------------------------------------------------------------------------------------------


def test_off_mode_does_nothing_even_for_a_hang() -> None:
    decision = diagnose(stuck(), ONSET + HOUR, policy(Mode.OFF))
    assert decision.diagnosis is Diagnosis.HANG
    assert (decision.action, decision.would) == (Action.NONE, Action.NONE)


def test_observe_mode_audits_what_enforce_would_do() -> None:
    times = [ONSET + m * MIN for m in (16, 18, 21, 26)]
    decisions, state = run(stuck(), times, policy(Mode.OBSERVE))
    assert [(d.action, d.would) for d in decisions] == [
        (Action.AUDIT, Action.WARN),
        (Action.NONE, Action.WARN),
        (Action.AUDIT, Action.STOP),  # 5 minutes after the stall was first seen: enforce would stop now
        (Action.NONE, Action.STOP),
    ]
    assert (state.warned_at, state.stopped_at) == (None, None)


def test_notify_mode_alerts_once_with_what_enforce_would_do() -> None:
    decisions, _ = run(stuck(), [ONSET + 16 * MIN, ONSET + 18 * MIN], policy(Mode.NOTIFY))
    assert [(d.action, d.would) for d in decisions] == [(Action.ALERT, Action.WARN), (Action.NONE, Action.WARN)]


def test_enforce_warns_then_stops_after_the_grace_period() -> None:
    times = [ONSET + m * MIN for m in (16, 18, 20.9, 21, 26)]
    decisions, state = run(stuck(), times)
    assert [d.action for d in decisions] == [Action.WARN, Action.NONE, Action.NONE, Action.STOP, Action.NONE]
    assert state.warned_at == ONSET + 16 * MIN
    assert state.stopped_at == ONSET + 21 * MIN
    assert "stop already requested" in decisions[-1].reasons[-1]


def test_enforce_without_the_stop_tag_alerts_once_and_never_stops() -> None:
    effective = Policy(mode=Mode.ENFORCE, stop_requires_tag=True).for_job({})
    decisions, state = run(stuck(), [ONSET + m * MIN for m in (16, 30, 60)], effective)
    assert [d.action for d in decisions] == [Action.ALERT, Action.NONE, Action.NONE]
    assert "not tagged stallwatch:mode=enforce" in decisions[0].reasons[-1]
    assert (state.warned_at, state.stopped_at) == (None, None)


def test_recovery_during_grace_cancels_the_stop() -> None:
    # Given a warned hang that resumes stepping before the grace ends
    builder = stuck(end=ONSET + 18 * MIN).progress(ONSET + 18 * MIN, 3 * HOUR).logs(ONSET, 3 * HOUR, 30)
    decisions, state = run(builder, [ONSET + 16 * MIN, ONSET + 21 * MIN])
    assert [(d.diagnosis, d.action) for d in decisions] == [
        (Diagnosis.HANG, Action.WARN),
        (Diagnosis.HEALTHY, Action.NONE),
    ]
    assert (state.stall_since, state.warned_at, state.alerted, state.recheck_at) == (None, None, (), None)
    assert state.step_interval_s == pytest.approx(1.0)  # the learned cadence stays


def test_snoozed_stall_is_audited_once_and_warned_afresh_when_the_snooze_ends() -> None:
    # Given a warned hang that an operator snoozed until ONSET + 60 min
    warned = JobState(stall_since=ONSET + 16 * MIN, warned_at=ONSET + 16 * MIN, alerted=("hang",))
    state = warned.with_(snoozed_until=ONSET + 60 * MIN)
    times = [ONSET + m * MIN for m in (25, 40, 61, 63, 66)]
    decisions, state = run(stuck(), times, state=state)
    # Then nothing while snoozed (already alerted); a fresh warning when it ends; the stop only after a new grace
    assert [d.action for d in decisions] == [Action.NONE, Action.NONE, Action.WARN, Action.NONE, Action.STOP]
    assert "snoozed until" in decisions[0].reasons[-1]
    assert state.stopped_at == ONSET + 66 * MIN


def test_stall_first_seen_while_snoozed_is_audited_once_never_warned() -> None:
    state = JobState(snoozed_until=ONSET + 3 * HOUR)
    decisions, state = run(stuck(), [ONSET + m * MIN for m in (16, 21, 40)], state=state)
    assert [d.action for d in decisions] == [Action.AUDIT, Action.NONE, Action.NONE]
    assert (state.warned_at, state.stopped_at) == (None, None)


def test_snooze_in_notify_mode_mutes_alerts_to_an_audit() -> None:
    state = JobState(snoozed_until=ONSET + 2 * HOUR)
    decision = diagnose(stuck(), ONSET + 16 * MIN, policy(Mode.NOTIFY), state)
    assert (decision.action, decision.would) == (Action.AUDIT, Action.WARN)


def test_threshold_factor_scales_the_stall_threshold() -> None:
    # Given an operator said "not stalled" once: thresholds doubled
    state = JobState(threshold_factor=2.0)
    assert diagnose(stuck(), ONSET + 16 * MIN, state=state).diagnosis is Diagnosis.HEALTHY
    decision = diagnose(stuck(), ONSET + 31 * MIN, state=state)
    assert decision.diagnosis is Diagnosis.HANG
    assert decision.evidence["agent"]["stall_threshold_s"] == pytest.approx(30 * MIN)


def test_threshold_factor_scales_idle_and_log_silence_too() -> None:
    state = JobState(threshold_factor=2.0)
    assert diagnose(idle_without_agent(), ONSET + 19 * MIN, state=state).diagnosis is Diagnosis.HEALTHY
    assert diagnose(idle_without_agent(), ONSET + 21 * MIN, state=state).diagnosis is Diagnosis.IDLE


def test_tag_errors_are_carried_into_the_evidence() -> None:
    effective = Policy().for_job({"stallwatch:mode": "enforce", "stallwatch:stall-minutes": "soon"})
    decision = diagnose(stuck(), ONSET + 16 * MIN, effective)
    assert decision.evidence["tag_errors"] == [
        "stallwatch:stall-minutes='soon': " + effective.tag_errors[0].split(": ", 1)[1]
    ]


# --- the timing budget -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0.0, 30.0, 150.0, 299.0])
def test_default_policy_stops_a_hang_within_30_minutes_on_sweeps_alone(offset: float) -> None:
    # Given a hang whose onset falls anywhere relative to a 5-minute sweeper, and no alarm at all
    onset = ONSET + offset
    builder = (
        SignalsBuilder(hosts=2)
        .progress(0, onset)
        .no_progress(onset, 3 * HOUR)
        .gpu(0, 3 * HOUR, 99)
        .logs(0, 3 * HOUR, 30)
    )
    sweeps = [k * 5 * MIN for k in range(int(ONSET // (5 * MIN)), int(3 * HOUR // (5 * MIN)))]
    decisions, _ = run(builder, sweeps)
    stop = next(d.at for d in decisions if d.action is Action.STOP)
    # Then the stop comes within 30 minutes of the onset
    assert stop - onset <= 30 * MIN


@pytest.mark.parametrize("offset", [0.0, 1.0, 150.0, 299.0])
def test_default_policy_stops_an_idle_job_without_agent_within_30_minutes(offset: float) -> None:
    # Given the last log line and busy GPU sample at ONSET, sweeps every 5 minutes at any phase
    sweeps = [ONSET + offset + k * 5 * MIN for k in range(12)]
    decisions, _ = run(idle_without_agent(), sweeps)
    stop = next(d.at for d in decisions if d.action is Action.STOP)
    assert stop - ONSET <= 30 * MIN


# --- next_state and purity ---------------------------------------------------------------------------------------


def test_next_state_records_the_incident_and_keeps_its_start() -> None:
    decisions, state = run(stuck(), [ONSET + 16 * MIN, ONSET + 18 * MIN])
    assert state.stall_since == ONSET + 16 * MIN
    assert state.warned_at == ONSET + 16 * MIN
    assert state.alerted == ("hang",)
    assert decisions[1].action is Action.NONE


def test_next_state_clears_the_incident_when_healthy_but_keeps_snooze_and_factor() -> None:
    state = JobState(
        stall_since=10.0, warned_at=20.0, alerted=("hang",), snoozed_until=99.0, threshold_factor=2.0, stopped_at=None
    )
    healthy = Decision(job="j", at=500.0, diagnosis=Diagnosis.HEALTHY, action=Action.NONE, mode=Mode.ENFORCE)
    assert next_state(state, healthy) == JobState(snoozed_until=99.0, threshold_factor=2.0)


def test_next_state_keeps_the_state_of_a_finished_job() -> None:
    state = JobState(stall_since=10.0, warned_at=20.0, stopped_at=320.0, alerted=("hang",))
    finished = Decision(job="j", at=500.0, diagnosis=Diagnosis.FINISHED, action=Action.NONE, mode=Mode.ENFORCE)
    assert next_state(state, finished) == state


def test_next_state_records_a_non_stoppable_alert_without_a_stall() -> None:
    state = JobState(stall_since=10.0, warned_at=20.0, alerted=("hang",))
    alert = Decision(
        job="j",
        at=500.0,
        diagnosis=Diagnosis.DATA_STARVATION,
        action=Action.ALERT,
        mode=Mode.NOTIFY,
        would=Action.ALERT,
    )
    assert next_state(state, alert) == JobState(alerted=("hang", "data_starvation"))


def test_decide_is_deterministic() -> None:
    signals = hung().build(ONSET + 16 * MIN)
    state = JobState(threshold_factor=1.5)
    assert decide(signals, ENFORCE, state, ONSET + 16 * MIN) == decide(signals, ENFORCE, state, ONSET + 16 * MIN)


def test_log_cadence_follows_the_chattiest_host_not_quiet_ranks_startup_lines() -> None:
    # Given 4 hosts without the agent: only algo-1 logs (every 30 s); the others printed startup lines long ago
    builder = SignalsBuilder(hosts=4).gpu(0, ONSET, 97).gpu(ONSET, 3 * HOUR, 0).logs(0, ONSET, 30, hosts=["algo-1"])
    builder.logs(0, 2 * MIN, 5, hosts=["algo-2", "algo-3", "algo-4"])
    # Then the silence threshold is the floor (15 min), and the idle job is caught by 21 minutes
    decision = diagnose(builder, ONSET + 21 * MIN)
    assert decision.diagnosis is Diagnosis.IDLE
    assert decision.evidence["logs"]["threshold_s"] == pytest.approx(15 * MIN)


def test_a_single_burst_of_lines_does_not_teach_a_cadence() -> None:
    # Given algo-1 logs every 5 minutes and algo-2 printed one traceback-like burst of lines
    builder = (
        SignalsBuilder(hosts=2).gpu(0, ONSET, 97).gpu(ONSET, 4 * HOUR, 0).logs(0, ONSET, 5 * MIN, hosts=["algo-1"])
    )
    for k in range(5):
        builder.log(10 * MIN + k * 0.01, f"  File 'train.py', line {k}", "algo-2")
    # Then algo-1's cadence sets the threshold (10 x 5 min)
    assert diagnose(builder, ONSET + 45 * MIN).evidence["logs"]["threshold_s"] == pytest.approx(50 * MIN)
