"""Replay: the rendered alarms and the engine on a simulated clock, the verdict, and the `stallwatch replay` CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stallwatch.core.decision import Action
from stallwatch.core.policy import Mode, Policy
from stallwatch.core.trace import Expectation, StatusEvent, Trace
from stallwatch.offline.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from stallwatch.offline.replay import RECHECK, SWEEPER, Verdict, replay, replay_file
from stallwatch.offline.trace_file import load_trace, write_trace

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "traces"
HANG = CORPUS / "ec2-hang-agent.jsonl"  # hang at t = 2430 s
HANG_ONSET = 2_430.0


def relabel(trace: Trace, **expect: object) -> Trace:
    return dataclasses.replace(trace, header=trace.header.model_copy(update={"expect": Expectation(**expect)}))


def test_a_hang_is_warned_then_stopped_after_the_grace_period() -> None:
    # Given a trace that hangs at 2430 s
    trace = load_trace(HANG)

    # When it is replayed under the default replay policy (enforce)
    result = replay(trace)

    # Then a warning comes first, the stop follows at least the grace later (a collective spinning on every host is
    # conclusive: `confirmed_grace_minutes`), within 30 min of the onset
    actions = [d.decision.action for d in result.decisions]
    assert actions[0] is Action.WARN
    assert actions[-1] is Action.STOP
    grace_s = Policy().thresholds.confirmed_grace_minutes * 60
    assert result.first_stop_s - result.first_warn_s >= grace_s
    assert HANG_ONSET < result.first_stop_s <= HANG_ONSET + 1_800
    assert result.first_alert_s == result.first_warn_s
    assert result.verdict is Verdict.PASS
    assert "hang" in result.diagnoses


def test_the_stop_ends_the_replay() -> None:
    result = replay(load_trace(HANG))
    assert result.decisions[-1].decision.action is Action.STOP
    assert all(d.t <= result.first_stop_s for d in result.decisions)


def test_a_label_the_replay_misses_fails_with_the_reason() -> None:
    # Given the hang trace labeled "no stop"
    trace = relabel(load_trace(HANG), action="none")

    # When replayed
    result = replay(trace)

    # Then the verdict is fail and says when it stopped
    assert result.verdict is Verdict.FAIL
    assert result.verdict_reason.startswith(f"expected no stop, stopped at {result.first_stop_s:g}s")


def test_a_stop_outside_the_window_fails() -> None:
    result = replay(relabel(load_trace(HANG), action="stop", window_s=(0.0, 600.0)))
    assert result.verdict is Verdict.FAIL
    assert "expected a stop in [0, 600]s" in result.verdict_reason


def test_an_unlabeled_trace_has_no_verdict() -> None:
    trace = load_trace(HANG)
    trace = dataclasses.replace(trace, header=trace.header.model_copy(update={"expect": None}))
    assert replay(trace).verdict is None


def test_observe_mode_from_the_tags_audits_what_enforce_would_do() -> None:
    # Given the hang trace with the job tagged stallwatch:mode=observe
    trace = load_trace(HANG)
    job = trace.job.model_copy(update={"tags": {"stallwatch:mode": "observe"}})
    trace = dataclasses.replace(trace, header=trace.header.model_copy(update={"job": job}))

    # When replayed
    result = replay(trace)

    # Then nothing is stopped or sent, and the audit records that enforce would warn, then stop
    assert result.mode is Mode.OBSERVE
    assert result.first_stop_s is None
    assert result.first_alert_s is None
    assert {d.decision.action for d in result.decisions} <= {Action.AUDIT, Action.NONE}
    audits = [d.decision.would for d in result.decisions if d.decision.action is Action.AUDIT]
    assert audits == [Action.WARN, Action.STOP]


def test_a_policy_that_requires_the_opt_in_tag_alerts_instead_of_stopping() -> None:
    # Given a policy that stops only jobs tagged for it, and an untagged job
    policy = Policy(mode=Mode.ENFORCE, stop_requires_tag=True)

    # When replayed
    result = replay(load_trace(HANG), policy=policy)

    # Then it alerts, never warns or stops
    assert result.first_stop_s is None
    assert result.first_warn_s is None
    assert result.decisions[0].decision.action is Action.ALERT


def test_a_job_that_completes_is_no_longer_judged() -> None:
    # Given the hang trace where the job completes before the hang could be confirmed
    trace = load_trace(HANG)
    events = tuple(e for e in trace.events if e.t < HANG_ONSET + 120)
    completed = StatusEvent(t=HANG_ONSET + 120, status="Completed", secondary="Completed")
    trace = dataclasses.replace(trace, events=(*events, completed))

    # When replayed
    result = replay(trace)

    # Then nothing happens after the job ended
    assert result.first_stop_s is None
    assert result.decisions == ()


def test_the_recheck_the_warning_asked_for_stops_at_the_end_of_its_grace() -> None:
    # Given the hang trace / When replayed
    result = replay(load_trace(HANG))
    warn, stop = result.decisions[0], result.decisions[-1]
    # Then the progress alarm warns, and the recheck the warning named (its grace's end) stops, or a sweep that
    # came first: never a sweep later than it
    assert warn.trigger.endswith(".progress")
    assert stop.trigger in (RECHECK, SWEEPER)
    grace_s = Policy().thresholds.confirmed_grace_minutes * 60
    assert warn.decision.recheck_at == pytest.approx(warn.decision.at + grace_s)
    assert stop.t - warn.t <= grace_s + 90  # the grace, rounded up to Scheduler's minute, and half of its precision


def test_cli_replay_json_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    # When two corpus traces are replayed with --json
    code = main(["replay", "--json", str(HANG), str(CORPUS / "ec2-healthy-noagent.jsonl")])

    # Then each line is one object with the documented fields, and both pass
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == EXIT_OK
    assert [o["trace"] for o in objects] == [str(HANG), str(CORPUS / "ec2-healthy-noagent.jsonl")]
    for field in ("trace", "job", "first_alert_s", "first_warn_s", "first_stop_s", "decisions", "verdict"):
        assert all(field in o for o in objects)
    assert [o["verdict"] for o in objects] == ["pass", "pass"]
    assert objects[0]["decisions"][-1]["action"] == "stop"


def test_cli_timeline_shows_what_observe_mode_would_have_done(capsys: pytest.CaptureFixture[str]) -> None:
    # When an observe-mode trace is replayed with the default (timeline) output
    code = main(["replay", str(CORPUS / "sm-hang-observe-1host.jsonl")])

    # Then the timeline renders the audited decisions with what enforce would have done, and passes
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "audit" in out
    assert "stop" in out
    assert "PASS" in out


def test_cli_exits_non_zero_when_a_labeled_trace_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Given the hang trace labeled "no stop"
    trace = relabel(load_trace(HANG), action="none")
    path = tmp_path / "mislabeled.jsonl"
    write_trace(trace.header, trace.events, path)

    # When replayed with the timeline output
    code = main(["replay", str(path)])

    # Then the exit code says a trace failed, and the timeline shows the stop and the verdict
    out = capsys.readouterr().out
    assert code == EXIT_FAILED
    assert "stop" in out
    assert "FAIL" in out


def test_cli_reports_a_broken_trace_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(HANG.read_text().splitlines()[0] + "\n{\n")
    assert main(["replay", str(path)]) == EXIT_USAGE
    assert f"{path}:2: not JSON" in capsys.readouterr().err


def test_cli_policy_file_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Given a deployment config whose policy only notifies
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"policy": {"mode": "notify"}, "sweeper_minutes": 5}))

    # When the hang trace is replayed with it
    code = main(["replay", "--json", "--policy", str(config), str(HANG)])

    # Then nothing is stopped, and the label (a stop) fails
    result = json.loads(capsys.readouterr().out)
    assert code == EXIT_FAILED
    assert result["first_stop_s"] is None
    assert result["decisions"][0]["would"] == "warn"


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_a_trace_read_one_event_at_a_time_replays_as_the_whole_trace(path: Path) -> None:
    # Given a corpus trace, replayed from memory and from its file (no event kept)
    whole = replay(load_trace(path))
    streamed = replay_file(path)

    # Then both replays decide the same, at the same moments
    assert streamed.to_json() == whole.to_json()


def test_json_counts_alerts_and_warnings_and_a_label_bounds_them(capsys: pytest.CaptureFixture[str]) -> None:
    # Given the hang trace (one warning, then the stop), relabeled to allow no warning
    result = replay(relabel(load_trace(HANG), action="stop", window_s=(HANG_ONSET, HANG_ONSET + 1_800), warnings=0))

    # Then the counts are reported, and one warning more than the label allows fails it
    assert (result.alerts, result.warnings) == (0, 1)
    assert result.to_json()["warnings"] == 1
    assert result.verdict is Verdict.FAIL
    assert result.verdict_reason == "expected at most 0 warnings, sent 1"


def test_a_healthy_label_allows_no_alert_unless_it_says_so() -> None:
    # Given a trace whose job is alerted once (data starvation), labeled "none" with and without an allowance
    trace = load_trace(CORPUS / "ec2-dataloader-starvation-agent.jsonl")

    # Then the default allows none; the label's allowance lets the one alert through
    assert replay(relabel(trace, action="none")).verdict_reason == "expected at most 0 alerts, sent 1"
    assert replay(relabel(trace, action="none", alerts=1)).verdict is Verdict.PASS


def unlabeled(path: Path, directory: Path) -> Path:
    """`path` without its label, as a user exports it from a job of their own; the name has [brackets] too."""
    trace = load_trace(path)
    out = directory / f"[exported] {path.name}"
    write_trace(trace.header.model_copy(update={"expect": None}), trace.events, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("labeled", [True, False], ids=["labeled", "unlabeled"])
def test_cli_timeline_renders_every_corpus_trace(
    labeled: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given every corpus trace, as labeled in the corpus or unlabeled (what users export from their own jobs),
    # and a terminal wide enough that no summary wraps
    monkeypatch.setenv("COLUMNS", "400")
    paths = sorted(CORPUS.glob("*.jsonl"))
    traces = paths if labeled else [unlabeled(p, tmp_path) for p in paths]

    # When they are replayed with the human timeline
    code = main(["replay", *map(str, traces)])

    # Then it renders all of them as plain text: paths, verdicts and reasons as written, no markup error
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert out.count("job ") >= len(traces)
    if labeled:
        assert out.count("PASS") == len(traces)
    else:
        assert out.count("unlabeled (unlabeled)") == len(traces)
        assert "[exported]" in out
    assert "straggler algo-6" in out


def test_a_lone_signal_is_rechecked_at_its_full_threshold() -> None:
    # Given the hang trace without its GPU power (no step is then a lone signal: nothing agrees with it)
    trace = load_trace(HANG)
    no_power = tuple(e for e in trace.events if getattr(e, "metric", None) is None or e.metric.name != "GPUPowerWatts")
    lone = replay(dataclasses.replace(trace, events=no_power))
    agreed = replay(trace)

    # Then the early progress alarm finds it too young; the recheck it asked for decides again once the full 15
    # minutes have passed (no alarm fires again), warns, and stops within 30 minutes; with power agreeing, sooner
    assert lone.decisions[0].trigger == RECHECK
    assert lone.first_warn_s - HANG_ONSET >= 15 * 60
    assert HANG_ONSET < lone.first_stop_s <= HANG_ONSET + 1_800
    assert agreed.first_stop_s < lone.first_stop_s


def test_a_trace_whose_ranks_dumped_their_stacks_names_the_odd_rank_in_the_warning_and_the_stop(capsys) -> None:
    # Given the corpus's loader stall: 32 ranks' dumps a minute into the hang, rank 13 stuck in its DataLoader
    trace = CORPUS / "sm-hang-loader-stacks-4host-agent.jsonl"

    # When it is replayed, as a table and as JSON
    result = replay_file(trace)
    assert main(["replay", str(trace), "--json"]) == EXIT_OK
    printed = json.loads(capsys.readouterr().out)

    # Then the dumps wake the engine, which alerts (never stops on them alone); the alert, the warning and the stop
    # say where rank 13 was, and the JSON keeps the grouping
    named = "31 ranks in all_reduce (train.py:212, seq 88421); rank 13 on algo-2 in train.py:298"
    assert [d.decision.action for d in result.decisions] == [Action.ALERT, Action.WARN, Action.STOP]
    assert result.decisions[0].trigger.startswith("log:")
    assert not result.decisions[0].decision.stoppable
    assert all(any(reason.startswith(named) for reason in d.decision.reasons) for d in result.decisions)
    assert [d["stacks"]["named"] for d in printed["decisions"]] == [[13], [13], [13]]
