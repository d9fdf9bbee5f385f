"""Evidence the corpus never showed: a host's death (its last words, its GPUs, its vanishing) decides at once,
whatever the other hosts' logging habits or the cadence the job learned; a live job's pauses are told apart; and
every decision names when it turns decisive next."""

from __future__ import annotations

import json

import pytest

from corpus import real_lines
from stallwatch.core.decision import Action, Diagnosis, JobState
from stallwatch.core.engine import decide, next_state
from stallwatch.core.policy import Mode, Policy
from stallwatch.core.signals import Platform
from tests.core.signals_builder import SignalsBuilder

MIN = 60.0
HOUR = 3600.0
ONSET = HOUR
ENFORCE = Policy(mode=Mode.ENFORCE).for_job({"stallwatch:mode": "enforce"})
OOM = "[rank24]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB."
ABORT = "[rank24]:[E ProcessGroupNCCL.cpp:1182] [PG 0 Rank 24] NCCL communicator was aborted on rank 24."
XID = "NVRM: Xid (PCI:0000:10:1c): 79, pid=4242, name=python, GPU has fallen off the bus."


FRESH = JobState()


def at(builder: SignalsBuilder, now: float, state: JobState = FRESH):
    return decide(builder.build(now), ENFORCE, state, now)


# --- a declared phase that hangs -------------------------------------------------------------------------------------


def test_a_phase_within_its_allowance_asks_to_be_decided_when_the_allowance_runs_out() -> None:
    # Given a declared eval phase of 15 minutes from ONSET that never ends (no step since)
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).phase(ONSET, 15 * MIN, 3 * HOUR).gpu(0, 3 * HOUR, 99)
    deadline = ONSET + 15 * MIN
    # When an alarm decides 9.9 minutes past the budget (within the 10-minute allowance)
    early = at(builder, deadline + 9.9 * MIN)
    # Then not yet a stall, but the decision names the moment the allowance runs out
    assert early.diagnosis is Diagnosis.PHASE
    assert early.recheck_at == pytest.approx(deadline + 10 * MIN)
    # And that recheck warns, and the one its warning names stops it 5 minutes later: 15 minutes past the budget
    state = next_state(JobState(), early)
    warn = at(builder, early.recheck_at + 1, state)
    assert (warn.diagnosis, warn.action) == (Diagnosis.PHASE_OVERRUN, Action.WARN)
    stop = at(builder, warn.recheck_at, next_state(state, warn))
    assert stop.action is Action.STOP
    assert warn.recheck_at - deadline == pytest.approx(15 * MIN, abs=2)


# --- a crashed rank, without the agent -------------------------------------------------------------------------------


def crash_where_rank_zero_alone_logs() -> SignalsBuilder:
    """4 EC2 nodes; only the first prints progress; node 3 dies at ONSET of a CUDA OOM and an NCCL abort: its GPUs fall
    to 0 % and let go of their memory, while the other three spin at 100 %."""
    builder = SignalsBuilder(hosts=4, platform=Platform.EC2)
    nodes = builder.host_names
    builder.logs(0, 2 * MIN, 10).logs(2 * MIN, ONSET, 60, hosts=nodes[:1])  # start-up lines, then rank 0 alone
    builder.gpu(0, 3 * HOUR, 100.0, hosts=[n for n in nodes if n != nodes[2]])
    builder.gpu(0, ONSET, 97.0, hosts=[nodes[2]]).gpu(ONSET, 3 * HOUR, 0.0, hosts=[nodes[2]])
    builder.gpu_memory(0, 3 * HOUR, 80.0, hosts=[n for n in nodes if n != nodes[2]])
    builder.gpu_memory(0, ONSET, 80.0, hosts=[nodes[2]]).gpu_memory(ONSET, 3 * HOUR, 0.0, hosts=[nodes[2]])
    builder.log(ONSET + 1, "[rank24]: Traceback (most recent call last):", nodes[2])
    builder.log(ONSET + 1.1, OOM, nodes[2]).log(ONSET + 1.2, ABORT, nodes[2])
    return builder


def test_a_crashed_rank_whose_peers_spin_is_found_whatever_the_others_logging_habits() -> None:
    # Given the crash where only rank 0 logs (the others' start-up lines are no evidence either way)
    builder = crash_where_rank_zero_alone_logs()
    dead = builder.host_names[2]
    # When 2 minutes have passed / Then not yet (its words alerted, never stoppable alone), and the decision names
    # when the evidence is confirmed
    early = at(builder, ONSET + 2 * MIN)
    assert (early.diagnosis, early.action, early.stoppable) == (Diagnosis.CRASHED_RANK, Action.ALERT, False)
    assert early.recheck_at == pytest.approx(ONSET + 1 + 3 * MIN)
    # When 3 minutes (crash_confirm_minutes) / Then a crashed rank on that node, conclusive: the 2-minute grace
    decision = at(builder, ONSET + 1 + 3 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.evidence["death"]["hosts"] == [dead]
    assert f"{dead}: cuda_oom, nccl_timeout, traceback" in " ".join(decision.reasons)
    assert decision.recheck_at == pytest.approx(decision.at + 2 * MIN)


def test_a_rank_that_died_with_its_gpus_is_not_held_back_by_long_steps() -> None:
    # Given the agent and 15-minute steps (the last one 5 minutes before ONSET); algo-3 dies of a CUDA error at ONSET,
    # its GPUs idle and its memory let go, while the others spin
    builder = SignalsBuilder(hosts=4).progress(0, ONSET - 5 * MIN, step_time=15 * MIN)
    builder.no_progress(ONSET - 5 * MIN, 3 * HOUR).gpu(0, 3 * HOUR, 100.0, hosts=["algo-1", "algo-2", "algo-4"])
    builder.gpu(0, ONSET, 97.0, hosts=["algo-3"]).gpu(ONSET, 3 * HOUR, 0.0, hosts=["algo-3"])
    builder.gpu_memory(0, 3 * HOUR, 80.0, hosts=["algo-1", "algo-2", "algo-4"])
    builder.gpu_memory(0, ONSET, 80.0, hosts=["algo-3"]).gpu_memory(ONSET, 3 * HOUR, 0.0, hosts=["algo-3"])
    builder.log(ONSET + 1, "[rank16]: RuntimeError: CUDA error: uncorrectable ECC error encountered", "algo-3")
    # When crash_confirm_minutes have passed (not 2 step intervals, 30 minutes) / Then conclusive: warned
    decision = at(builder, ONSET + 1 + 3 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.evidence["death"]["hosts"] == ["algo-3"]


def test_a_fatal_line_is_never_held_back_by_a_learned_cadence() -> None:
    # Given a rare logger whose learned log gap is 199 minutes; algo-2 writes an Xid 79 and its GPU falls off the bus
    builder = SignalsBuilder(hosts=4).logs(0, ONSET, 20 * MIN).gpu(0, 3 * HOUR, 100.0, hosts=["algo-1", "algo-3"])
    builder.gpu(0, 3 * HOUR, 100.0, hosts=["algo-4"]).gpu(0, ONSET, 98.0, hosts=["algo-2"])
    builder.gpu_memory(0, 3 * HOUR, 80.0, hosts=["algo-1", "algo-3", "algo-4"]).gpu_memory(0, ONSET, 80.0, ["algo-2"])
    builder.log(ONSET + 5, XID, "algo-2")
    learned = JobState(log_gap_s=199 * MIN)
    # When 4 minutes have passed (its GPU metrics vanished) / Then a crashed rank, the learned gap notwithstanding
    decision = at(builder, ONSET + 5 + 5 * MIN, learned)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.evidence["logs"]["threshold_s"] >= 199 * MIN  # the silence it would otherwise have waited for


def processes_gone(hosts: int = 2) -> SignalsBuilder:
    """`hosts` hosts log every minute; at ONSET their processes end without a word: GPUs 0 %, memory released, logs
    silent."""
    builder = SignalsBuilder(hosts=hosts).logs(0, ONSET, 60).gpu(0, ONSET, 97.0).gpu(ONSET, 3 * HOUR, 0.0)
    return builder.gpu_memory(0, ONSET, 80.0).gpu_memory(ONSET, 3 * HOUR, 0.5)


IDLE_30 = Policy(mode=Mode.ENFORCE).for_job({"stallwatch:mode": "enforce", "stallwatch:idle-minutes": "30"})


@pytest.mark.parametrize(("policy", "idle_minutes"), [(ENFORCE, 15.0), (IDLE_30, 30.0)])
def test_every_process_gone_without_a_fatal_line_is_idle_after_the_agreement_rung_of_idle_minutes(
    policy, idle_minutes: float
) -> None:
    # Given a job whose long checkpoints taught it a 2-hour log gap; at ONSET every process ends without a fatal line
    builder, learned = processes_gone(), JobState(log_gap_s=2 * HOUR)
    released = ONSET + MIN  # the first datapoint that shows the memory let go of
    rung = 2 / 3 * idle_minutes * MIN  # memory, utilization and logs agree: 2/3 of idle_minutes
    # When less than the rung has passed / Then nothing yet (a box kept between runs), and a recheck at the rung
    early = decide(builder.build(released + rung - MIN), policy, learned, released + rung - MIN)
    assert not early.stalled
    assert early.recheck_at == pytest.approx(released + rung)
    # When the rung is reached / Then idle, warned with the full grace (the processes ended by themselves), whatever
    # the learned cadence
    warn = decide(builder.build(released + rung), policy, learned, released + rung)
    assert (warn.diagnosis, warn.action) == (Diagnosis.IDLE, Action.WARN)
    assert "every process left its GPUs" in warn.reasons[0]
    assert warn.recheck_at == pytest.approx(released + rung + 5 * MIN)
    # And the stop comes 5 minutes later: 25 minutes after the end with stallwatch:idle-minutes=30, not 6
    stop_at = warn.recheck_at
    stop = decide(builder.build(stop_at), policy, next_state(learned, warn), stop_at)
    assert stop.action is Action.STOP


@pytest.mark.parametrize("policy", [ENFORCE, IDLE_30])
def test_fatal_last_words_before_every_process_went_are_a_crash_decided_at_once(policy) -> None:
    # Given every process gone at ONSET, algo-2's last words a CUDA OOM
    builder = processes_gone().log(ONSET + 1, OOM, "algo-2")
    # When crash_confirm_minutes (3) have passed / Then a crashed rank, conclusive: idle_minutes plays no part
    decision = decide(builder.build(ONSET + 1 + 3 * MIN), policy, FRESH, ONSET + 1 + 3 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.recheck_at == pytest.approx(ONSET + 1 + 5 * MIN)  # the 2-minute grace


@pytest.mark.parametrize("policy", [ENFORCE, IDLE_30])
def test_one_host_let_go_while_the_others_hold_their_gpus_is_decided_at_once(policy) -> None:
    # Given 4 hosts; at ONSET algo-3's processes let go of its GPUs without a word while the others spin, memory held
    builder = SignalsBuilder(hosts=4).logs(0, ONSET, 60).gpu(0, 3 * HOUR, 100.0, hosts=["algo-1", "algo-2", "algo-4"])
    builder.gpu(0, ONSET, 97.0, hosts=["algo-3"]).gpu(ONSET, 3 * HOUR, 0.0, hosts=["algo-3"])
    builder.gpu_memory(0, 3 * HOUR, 80.0, hosts=["algo-1", "algo-2", "algo-4"])
    builder.gpu_memory(0, ONSET, 80.0, hosts=["algo-3"]).gpu_memory(ONSET, 3 * HOUR, 0.0, hosts=["algo-3"])
    # When 4 minutes have passed / Then a crashed rank on algo-3, conclusive, whatever idle_minutes says
    decision = decide(builder.build(ONSET + 4 * MIN), policy, FRESH, ONSET + 4 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.evidence["death"]["hosts"] == ["algo-3"]


def test_a_fatal_line_a_rank_said_it_went_on_after_is_no_last_words() -> None:
    # Given every process gone at ONSET (a whole job's pause, or its end), algo-2's newest lines fairseq's real
    # skipped-batch block: a CUDA out-of-memory line read as fatal, then its warning that it skips the batch
    oom, skipped = next(b for b in real_lines.harmless_blocks() if b.name == "fairseq-oom-skip-batch").lines
    builder = processes_gone().log(ONSET + 1, oom, "algo-2").log(ONSET + 1.1, skipped, "algo-2")
    # When crash_confirm_minutes (3) have passed / Then no crashed rank: the rank's own words said it went on, so
    # its OOM line is no last words (what is left is the idleness that waits for its agreement rung)
    decision = at(builder, ONSET + 1 + 3 * MIN)
    assert decision.diagnosis is not Diagnosis.CRASHED_RANK
    assert decision.action is not Action.WARN
    # while the same line alone is (test_fatal_last_words_before_every_process_went_are_a_crash_decided_at_once)
    alone = at(processes_gone().log(ONSET + 1, oom, "algo-2"), ONSET + 1 + 3 * MIN)
    assert (alone.diagnosis, alone.action) == (Diagnosis.CRASHED_RANK, Action.WARN)


def test_a_rank_restarted_by_its_launcher_is_not_dead() -> None:
    # Given a rank that failed and was restarted by torchrun: a traceback, then restart lines from every host, GPU
    # memory let go of for a minute, then taken again while the checkpoint loads
    builder = SignalsBuilder(hosts=2).logs(0, ONSET, 60).gpu(0, ONSET, 97.0).gpu(ONSET, 3 * HOUR, 1.0)
    builder.gpu_memory(0, ONSET, 80.0).gpu_memory(ONSET, ONSET + MIN, 0.0).gpu_memory(ONSET + 2 * MIN, 3 * HOUR, 60.0)
    builder.log(ONSET, "RuntimeError: CUDA error: an illegal memory access was encountered", "algo-2")
    builder.logs(ONSET + 40, ONSET + 10 * MIN, 60, message="Rendezvous complete; loading checkpoint")
    # When 5 minutes have passed / Then no stall: the rank speaks again and the GPUs are held
    decision = at(builder, ONSET + 5 * MIN)
    assert not decision.stalled


def test_a_512_host_jobs_crashed_rank_is_read_on_its_5_minute_host_periods() -> None:
    # Given 512 hosts without the agent, their series in 5-minute periods (one GetMetricData answer holds them all);
    # algo-101 dies at ONSET saying so, its GPUs let go, while the others spin (a raised timeout: no watchdog line)
    hosts = SignalsBuilder(hosts=512).host_names
    others = [h for h in hosts if h != "algo-101"]
    builder = SignalsBuilder(hosts=512).logs(0, ONSET, 20 * MIN, hosts=["algo-1"]).log(ONSET + 5, OOM, "algo-101")
    builder.gpu(0, 3 * HOUR, 100.0, hosts=others, every=300).gpu_memory(0, 3 * HOUR, 80.0, hosts=others, every=300)
    builder.gpu(0, ONSET, 97.0, ["algo-101"], every=300).gpu(ONSET, 3 * HOUR, 0.0, ["algo-101"], every=300)
    builder.gpu_memory(0, ONSET, 80.0, ["algo-101"], every=300).gpu_memory(
        ONSET, 3 * HOUR, 0.0, ["algo-101"], every=300
    )
    # When 11 minutes have passed, the hosts' newest period ended 5 minutes ago (a 5-minute datapoint is stamped at
    # its period's start and lands after its end): older than 5 of the job's own 1-minute periods
    decision = decide(builder.build(ONSET + 6 * MIN), ENFORCE, FRESH, ONSET + 11 * MIN)
    # Then a crashed rank, conclusive: its GPUs are read on their own 5-minute periods, not taken for stale
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.evidence["death"]["hosts"] == ["algo-101"]


# --- a vanished host -------------------------------------------------------------------------------------------------


def rank_zero_host_lost() -> SignalsBuilder:
    """4 hosts with the agent; at ONSET the host of global rank 0 (algo-1) vanishes: the job metrics stop with it,
    the others' heartbeats and power go on, power fallen by three quarters; no log line anywhere."""
    builder = SignalsBuilder(hosts=4).progress(0, ONSET)
    others = builder.host_names[1:]
    builder.gpu(0, ONSET, 97.0, hosts=["algo-1"]).gpu(0, 3 * HOUR, 100.0, hosts=others)
    builder.power(0, ONSET, 600.0, hosts=["algo-1"]).power(0, ONSET, 600.0, hosts=others)
    builder.power(ONSET, 3 * HOUR, 150.0, hosts=others).host_metric("Heartbeat", 0, 3 * HOUR, 1.0, hosts=others)
    return builder


@pytest.mark.parametrize("policy", [ENFORCE, IDLE_30])
def test_losing_the_reporting_host_is_a_fault_not_an_absence_of_data(policy) -> None:
    # When 6 minutes have passed / Then the vanished host is named, a crashed rank, warned with the short grace
    # (idle_minutes plays no part)
    decision = decide(rank_zero_host_lost().build(ONSET + 6 * MIN), policy, FRESH, ONSET + 6 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    assert decision.evidence["death"]["hosts"] == ["algo-1"]
    assert "algo-1 vanished" in decision.reasons[0]


def test_a_warning_withdrawn_while_its_evidence_was_out_of_view_keeps_its_grace_when_reissued() -> None:
    # Given the lost host warned at ONSET + 6 min (conclusive: a 2-minute grace)
    builder, state = rank_zero_host_lost(), FRESH
    warn = at(builder, ONSET + 6 * MIN, state)
    assert (warn.diagnosis, warn.action) == (Diagnosis.CRASHED_RANK, Action.WARN)
    state = next_state(state, warn)
    # When a decision a minute later reads every host's metrics 5 minutes late (no host vanished in them), and
    # withdraws the warning
    late = decide(builder.build(ONSET + 2 * MIN), ENFORCE, state, ONSET + 7 * MIN)
    assert not late.stoppable
    state = next_state(state, late)
    assert state.warned_at is None
    # Then the decision that sees the same finding again, with no progress since, stops at the first warning's
    # grace: no second warning and a fresh grace
    again = at(builder, ONSET + 9 * MIN, state)
    assert (again.diagnosis, again.action) == (Diagnosis.CRASHED_RANK, Action.STOP)


def test_a_warning_withdrawn_by_progress_is_warned_afresh() -> None:
    # Given the lost host warned, then a decision that sees steps after it (the job came back), then the same finding
    builder, state = rank_zero_host_lost(), FRESH
    state = next_state(state, at(builder, ONSET + 6 * MIN, state))
    resumed = SignalsBuilder(hosts=4).progress(0, ONSET + 7 * MIN).gpu(0, ONSET + 7 * MIN, 97.0)
    state = next_state(state, at(resumed, ONSET + 7 * MIN, state))
    assert state.warning is None
    # Then a new warning with its own grace
    assert at(builder, ONSET + 9 * MIN, state).action is Action.WARN


def test_a_snooze_voids_a_withdrawn_warning_too() -> None:
    builder, state = rank_zero_host_lost(), FRESH
    state = next_state(state, at(builder, ONSET + 6 * MIN, state)).snoozed(ONSET + 6.5 * MIN)
    assert at(builder, ONSET + 9 * MIN, state).action is Action.WARN


def test_a_host_that_vanishes_while_the_others_step_on_is_no_stall() -> None:
    # Given 4 hosts; algo-4's metrics stop at ONSET, but the agent reports steps throughout
    builder = SignalsBuilder(hosts=4).progress(0, 3 * HOUR).gpu(0, 3 * HOUR, 97.0, hosts=["algo-1", "algo-2", "algo-3"])
    builder.gpu(0, ONSET, 97.0, hosts=["algo-4"])
    # Then no stall: the job progresses without it (elastic training shrinks)
    assert not at(builder, ONSET + 20 * MIN).stalled


def test_a_delay_of_every_hosts_metrics_is_no_vanished_host() -> None:
    # Given every host's GPU metrics stop at ONSET (CloudWatch late, not the hosts), logs flowing
    builder = SignalsBuilder(hosts=4).gpu(0, ONSET, 97.0).logs(0, 3 * HOUR, 60)
    # Then no host vanished
    decision = at(builder, ONSET + 20 * MIN)
    assert "death" not in decision.evidence
    assert not decision.stalled


# --- a live job's pauses ---------------------------------------------------------------------------------------------


EMF_LINE = json.dumps(
    {"_aws": {"Timestamp": 1700003600000, "CloudWatchMetrics": [{"Namespace": "Stallwatch"}]}, "Steps": 0.0}
)


def undeclared_checkpoint(agent: bool) -> SignalsBuilder:
    """2 hosts write a checkpoint they did not declare from ONSET: GPUs near 0 %, memory held, logs silent after a
    'Saving checkpoint' line on each."""
    builder = SignalsBuilder(hosts=2).gpu(0, ONSET, 97.0).gpu(ONSET, 5 * HOUR, 1.0).gpu_memory(0, 5 * HOUR, 80.0)
    if agent:
        builder.progress(0, ONSET).no_progress(ONSET, 5 * HOUR).power(0, ONSET, 380).power(ONSET, 5 * HOUR, 80)
        # the agent's thread goes on writing its EMF line each window: the agent's words, not the loop's
        builder.agent("DataWaitFraction", ONSET, 5 * HOUR, 100.0).logs(ONSET, 5 * HOUR, 60, message=EMF_LINE)
    builder.logs(0, ONSET - 1, 60)
    for host in builder.host_names:
        builder.log(ONSET, f"[{host}] Saving checkpoint to s3://ckpt/run-7/step-12000", host)
    return builder


@pytest.mark.parametrize("agent", [False, True])
def test_an_undeclared_checkpoint_is_not_idle_after_training(agent: bool) -> None:
    # When 25 minutes have passed / Then a phase (the checkpoint-start line, the memory held), never alerted
    decision = at(undeclared_checkpoint(agent), ONSET + 25 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.PHASE, Action.NONE)
    assert decision.evidence["checkpoint"]["since_t"] == pytest.approx(ONSET)
    # When it has lasted 4 x the threshold (an hour) / Then it is a stall like any other
    late = at(undeclared_checkpoint(agent), ONSET + 61 * MIN)
    assert (late.diagnosis, late.stoppable) == (Diagnosis.PHASE_OVERRUN, True)


def test_a_checkpoint_that_just_ended_is_life_until_its_first_step_is_due() -> None:
    # Given the agent's job writing an undeclared checkpoint for 36 minutes (past the 30 minutes its loop may wait
    # outside step()), its end line 20 s before a decision that the agent's next window has not answered yet
    builder = undeclared_checkpoint(agent=True)
    end = ONSET + 36 * MIN
    for host in builder.host_names:
        builder.log(end, f"[{host}] Checkpoint saved in 2160 s", host)
    # Then a phase, not idle; and with no step the full stall threshold after the end line, a stall again
    decision = at(builder, end + 20)
    assert (decision.diagnosis, decision.action) == (Diagnosis.PHASE, Action.NONE)
    assert decision.recheck_at == pytest.approx(end + 15 * MIN)
    late = at(builder, end + 16 * MIN)
    assert (late.diagnosis, late.stoppable) == (Diagnosis.IDLE, True)


def test_a_checkpoint_begun_mid_minute_is_a_checkpoint_though_another_host_logged_after_its_start_line() -> None:
    # Given 4 hosts that log once a minute at their own offsets; rank 0 starts saving at ONSET and the others' lines
    # (up to 100 s later, two of their intervals) still come before they join it
    builder = SignalsBuilder(hosts=4).gpu(0, ONSET, 97.0).gpu(ONSET, 5 * HOUR, 1.0).gpu_memory(0, 5 * HOUR, 80.0)
    for i, host in enumerate(builder.host_names):
        builder.logs(i * 15, ONSET - 1, 60, hosts=[host])
        builder.log(ONSET + i * 0.1, f"[{host}] Saving checkpoint to s3://ckpt/run-7/step-12000", host)
    builder.log(ONSET + 50, "step 12000 loss 1.93", builder.host_names[3])
    builder.log(ONSET + 100, "step 12000 loss 1.94", builder.host_names[2])  # its next interval's line too
    # When 25 minutes have passed / Then the checkpoint, not idle GPUs after training
    decision = at(builder, ONSET + 25 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.PHASE, Action.NONE)


def test_a_loop_waiting_for_input_is_data_starvation_not_a_hang() -> None:
    # Given the agent's loop blocked outside step() from ONSET (a stalled input pipeline): no step, GPUs idle, power
    # down, DataWaitFraction 100 %
    builder = SignalsBuilder(hosts=2).progress(0, ONSET).no_progress(ONSET, 3 * HOUR).gpu(0, ONSET, 97.0)
    builder.gpu(ONSET, 3 * HOUR, 2.0).power(0, ONSET, 380).power(ONSET, 3 * HOUR, 80).gpu_memory(0, 3 * HOUR, 80.0)
    builder.agent("DataWaitFraction", ONSET, 3 * HOUR, 100.0)
    # Then data starvation (alerted, not stopped) for up to twice the stall threshold, then idle (a script that idles
    # outside step() after its work looks the same)
    decision = at(builder, ONSET + 20 * MIN)
    assert (decision.diagnosis, decision.stoppable) == (Diagnosis.DATA_STARVATION, False)
    assert decision.recheck_at == pytest.approx(ONSET + 30 * MIN)
    assert (at(builder, ONSET + 31 * MIN).diagnosis, at(builder, ONSET + 31 * MIN).stoppable) == (Diagnosis.IDLE, True)


def test_a_pause_does_not_count_as_data_starvation_once_steps_resume() -> None:
    # Given an undeclared 5-minute pause (all waiting to the agent) after which steps resume at 4 % data wait
    builder = SignalsBuilder(hosts=2).gpu(0, 3 * HOUR, 97.0).progress(0, ONSET).agent("DataWaitFraction", 0, ONSET, 4)
    builder.no_progress(ONSET, ONSET + 5 * MIN).agent("DataWaitFraction", ONSET, ONSET + 5 * MIN, 100.0)
    builder.progress(ONSET + 5 * MIN, 3 * HOUR).agent("DataWaitFraction", ONSET + 5 * MIN, 3 * HOUR, 4.0)
    # When decided 2 minutes after steps resumed / Then healthy, not starving
    assert at(builder, ONSET + 7 * MIN).diagnosis is Diagnosis.HEALTHY


UNREAD = "[snapshotter] 64 shards of step 24000 on their way to /fsx/run7/24000"  # a start no pattern reads


def two_checkpoints_without_the_agent() -> SignalsBuilder:
    """One host logs every minute; at ONSET a 25-minute checkpoint it announces in a line the patterns read, at
    3 h one it announces in a line they do not: GPUs near 0 %, memory held, logs silent while each is written."""
    builder = SignalsBuilder(hosts=1).gpu_memory(0, 6 * HOUR, 80.0).sweeps(0, 6 * HOUR)
    builder.gpu(0, ONSET, 97.0).gpu(ONSET, ONSET + 25 * MIN, 1.0).gpu(ONSET + 25 * MIN, 3 * HOUR, 97.0)
    builder.gpu(3 * HOUR, 6 * HOUR, 1.0).logs(0, ONSET - 1, MIN).log(ONSET, "Saving model checkpoint to /ckpt/c-1")
    return builder.logs(ONSET + 25 * MIN, 3 * HOUR - 1, MIN).log(3 * HOUR, UNREAD)


def test_a_checkpoint_no_pattern_reads_is_no_stop_once_the_job_has_shown_one() -> None:
    # Given the two checkpoints, a decision during the first one (the job's history is learned as decisions go)
    builder, state = two_checkpoints_without_the_agent(), FRESH
    for now in (ONSET + 15 * MIN, ONSET + 45 * MIN):
        state = next_state(state, at(builder, now, state))
    assert state.idle_pause_s == pytest.approx(25 * MIN, abs=MIN)
    # When the second has lasted 30 minutes (past the idle rung of the learned log gap) / Then a pause like the
    # ones it came back from: no alert, no stop, and a recheck at 1.5 x the learned pause
    during = at(builder, 3 * HOUR + 30 * MIN, state)
    assert (during.diagnosis, during.action) == (Diagnosis.PHASE, Action.NONE)
    assert during.recheck_at == pytest.approx(3 * HOUR + 1.5 * state.idle_pause_s)
    # When it outlasts 1.5 x the learned pause / Then idle, a stall like any other
    late = at(builder, during.recheck_at, state)
    assert (late.diagnosis, late.action) == (Diagnosis.IDLE, Action.WARN)


def test_with_the_agent_a_pause_the_job_came_back_from_outlasts_the_data_wait_allowance() -> None:
    # Given a job with the agent whose loop paused 35 minutes at ONSET (an undeclared checkpoint: GPUs idle, memory
    # held, all waiting to the agent) and stepped on; at 3 h it pauses again, its lines unread
    builder = SignalsBuilder(hosts=2).gpu_memory(0, 6 * HOUR, 80.0).agent("DataWaitFraction", 0, 6 * HOUR, 100.0)
    builder.progress(0, ONSET).no_progress(ONSET, ONSET + 35 * MIN).progress(ONSET + 35 * MIN, 3 * HOUR)
    builder.no_progress(3 * HOUR, 6 * HOUR).gpu(0, ONSET, 97.0).gpu(ONSET, ONSET + 35 * MIN, 1.0)
    builder.gpu(ONSET + 35 * MIN, 3 * HOUR, 97.0).gpu(3 * HOUR, 6 * HOUR, 1.0)
    # When 45 minutes into the second (past the 30-minute data-wait allowance) / Then still not stoppable
    during = at(builder, 3 * HOUR + 45 * MIN)
    assert during.cadence.idle_pause_s == pytest.approx(35 * MIN, abs=MIN)
    assert (during.diagnosis, during.stoppable) == (Diagnosis.DATA_STARVATION, False)
    # When it outlasts 1.5 x the pause it came back from / Then idle, stoppable
    late = at(builder, 3 * HOUR + 1.5 * during.cadence.idle_pause_s + 1)
    assert (late.diagnosis, late.stoppable) == (Diagnosis.IDLE, True)


def test_an_idle_pause_the_job_came_back_from_excuses_no_silence_with_busy_gpus() -> None:
    # Given a job without power that came back from a 40-minute checkpoint (GPUs idle, memory held, logs silent),
    # its GPUs busy since, its logs silent since 3 h
    builder = SignalsBuilder(hosts=1).gpu_memory(0, 6 * HOUR, 80.0).sweeps(0, 6 * HOUR).gpu(0, ONSET, 97.0)
    builder.gpu(ONSET, ONSET + 40 * MIN, 1.0).gpu(ONSET + 40 * MIN, 6 * HOUR, 97.0)
    builder.logs(0, ONSET, MIN).logs(ONSET + 40 * MIN, 3 * HOUR, MIN)
    # When silent 30 minutes / Then a hang, warned: the checkpoint says nothing of a silence with busy GPUs (though
    # its gap raised the log threshold past an hour)
    decision = at(builder, 3 * HOUR + 30 * MIN)
    assert decision.cadence.idle_pause_s is not None
    assert decision.cadence.busy_pause_s is None
    assert decision.evidence["logs"]["threshold_s"] > HOUR
    assert (decision.diagnosis, decision.action) == (Diagnosis.HANG, Action.WARN)


# --- stragglers ------------------------------------------------------------------------------------------------------


def throttled(factor: float, host_types: dict[str, str] | None = None) -> SignalsBuilder:
    """8 hosts with the agent; from ONSET algo-6's GPU power is lower by `factor` (a throttled node)."""
    builder = SignalsBuilder(hosts=8, host_types=host_types or {}).progress(0, 3 * HOUR).gpu(0, 3 * HOUR, 97.0)
    others = [h for h in builder.host_names if h != "algo-6"]
    builder.power(0, 3 * HOUR, 380.0, hosts=others).power(0, ONSET, 380.0, ["algo-6"])
    return builder.power(ONSET, 3 * HOUR, 380.0 / factor, ["algo-6"])


def test_a_node_slowed_by_a_third_is_named_within_its_window() -> None:
    decision = at(throttled(1.3), ONSET + 11 * MIN)
    assert (decision.diagnosis, decision.action) == (Diagnosis.STRAGGLER, Action.ALERT)
    assert decision.evidence["straggler"]["host"] == "algo-6"
    # And it is named once: the next decision that finds it says nothing
    again = at(throttled(1.3), ONSET + 40 * MIN, next_state(JobState(), decision))
    assert (again.diagnosis, again.action) == (Diagnosis.STRAGGLER, Action.NONE)


def test_the_hosts_of_another_instance_type_are_no_stragglers() -> None:
    # Given a heterogeneous cluster: algo-5..8 are g5 hosts drawing 250 W against the p4d hosts' 380 W, no lag
    types = {f"algo-{i}": "ml.p4d.24xlarge" if i <= 4 else "ml.g5.12xlarge" for i in range(1, 9)}
    builder = SignalsBuilder(hosts=8, host_types=types).progress(0, 3 * HOUR).gpu(0, 3 * HOUR, 97.0)
    builder.power(0, 3 * HOUR, 380.0, hosts=list(types)[:4]).power(0, 3 * HOUR, 250.0, hosts=list(types)[4:])
    assert at(builder, ONSET).diagnosis is Diagnosis.HEALTHY
