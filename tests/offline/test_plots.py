"""The CLI's charts on a corpus trace: each file is a PNG of a sensible size, and the series drawn (the chart's data and
the figure's artists) are what the replay and the report say."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import sys
import time
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import moto  # imported before any boto3 client is created
import pytest

from localrun import moto_sagemaker, trace_run
from localrun.resources import create_table
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.goodput import run_spans
from stallwatch.aws.store import Store
from stallwatch.core import contract
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.decision import Action
from stallwatch.core.evaluator import AlarmState
from stallwatch.core.goodput import Category, measure_goodput
from stallwatch.core.trace import MetricEvent
from stallwatch.offline import cli
from stallwatch.offline.formats import hms, money
from stallwatch.offline.plots import goodput_chart, replay_chart
from stallwatch.offline.replay import AlarmChange, replay_file
from stallwatch.offline.trace_file import load_trace
from stallwatch.offline.trace_source import TRACE_EPOCH
from tests.core.test_goodput import known_run

ROOT = Path(__file__).resolve().parents[2]
HANG = ROOT / "corpus" / "traces" / "sm-hang-8host-agent.jsonl"  # 8 x ml.p4d.24xlarge with the agent; stopped
EC2_HEALTHY = ROOT / "corpus" / "traces" / "ec2-healthy-noagent.jsonl"  # without the trainer agent; never stopped
PREFIX = StallwatchConfig().alarm_prefix
TABLE = "stallwatch-plots"
PERIOD = 60

moto_sagemaker.install()


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height, from its IHDR chunk (after checking the signature)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_sensible_png(path: Path, min_height: int) -> None:
    width, height = png_size(path)
    assert 1000 <= width <= 2000
    assert min_height <= height <= 2000
    assert 10_000 < path.stat().st_size < 1_500_000


def per_period(
    trace_path: Path, name: str, dims: dict[str, str], divisor: float, mean: bool, epoch: float = TRACE_EPOCH
) -> list[tuple]:
    """The trace's datapoints of one metric, in CloudWatch's periods (whole minutes of the epoch the trace is put at),
    as trace seconds: what a reader of the raw trace finds, independently of the trace source."""
    buckets: dict[float, list[float]] = defaultdict(list)
    for event in load_trace(trace_path).events:
        if isinstance(event, MetricEvent) and event.metric.name == name and event.metric.dimensions == dims:
            start = math.floor((epoch + event.t) / PERIOD) * PERIOD - epoch
            buckets[start].append(event.metric.value / divisor)
    return [(t, sum(vs) / len(vs) if mean else sum(vs)) for t, vs in sorted(buckets.items())]


def drawn(ax, gid: str) -> list[tuple]:
    """The (x, y) points of the line `gid` in `ax`."""
    (line,) = [line for line in ax.lines if line.get_gid() == gid]
    return list(zip(line.get_xdata(), line.get_ydata(), strict=True))


# ---- the replay chart ---------------------------------------------------------------------------------------------


def test_the_replay_chart_of_a_corpus_hang_is_a_png_of_the_replays_signals_alarms_and_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the corpus's 8-host NCCL hang, When `stallwatch replay --plot` draws it
    out = tmp_path / "replay.png"
    assert cli.main(["replay", str(HANG), "--plot", str(out)]) == cli.EXIT_OK
    assert f"wrote {out}" in capsys.readouterr().err

    # Then the file is a PNG of a sensible size
    assert_sensible_png(out, min_height=900)

    # And the chart's series are the trace's, as CloudWatch's periods hold them: steps per minute, GPU utilization per
    # GPU (SageMaker's per-host figure over the host's 8 GPUs)
    result = replay_file(HANG)
    chart = replay_chart(result, HANG, PREFIX)
    job = result.job
    assert list(chart.steps.points) == per_period(HANG, "Steps", {contract.DIM_JOB: job}, 1, mean=False)
    assert len(chart.gpu_util) == 8
    for host, series in chart.gpu_util.items():
        raw = per_period(HANG, "GPUUtilization", {"Host": f"{job}/{host}"}, 8, mean=True)
        assert [t for t, _ in series.points] == [t for t, _ in raw]
        assert series.values() == pytest.approx([v for _, v in raw])

    # And its decisions and alarms are the replay's: a warning then the stop, the progress alarm in ALARM at the warning
    assert [d.decision.action for d in chart.result.decisions] == [Action.WARN, Action.STOP]
    alarmed = {c.t for c in result.alarm_changes if c.state is AlarmState.ALARM}
    assert alarmed
    assert {start for spans in chart.alarms.values() for start, _ in spans} == alarmed
    warned = result.decisions[0].t
    assert any(start <= warned <= end for start, end in chart.alarms["progress"])

    # And the figure draws exactly that data
    panels = {ax.get_label(): ax for ax in chart.figure().axes}
    assert drawn(panels["steps"], "steps") == list(chart.steps.points)
    for host, series in chart.gpu_util.items():
        assert drawn(panels["gpu_util"], host) == list(series.points)
    for host, series in chart.gpu_power.items():
        assert drawn(panels["gpu_power"], host) == list(series.points)
    for name in ("gpu_util", "gpu_power", "steps", "log_silence", "alarms"):
        lines = [line for line in panels[name].lines if (line.get_gid() or "").startswith("decision:")]
        assert [(line.get_xdata()[0], line.get_gid()) for line in lines] == [
            (d.t, f"decision:{d.decision.action.value}") for d in result.decisions
        ]
    patches = [(p.get_gid(), p.get_x(), p.get_x() + p.get_width()) for p in panels["alarms"].patches]
    bars = sorted(bar for bar in patches if bar[0] in chart.alarms)
    assert bars == sorted((name, s, e) for name, spans in chart.alarms.items() for s, e in spans)
    # And what the trace holds after the stop, which the stop saved, is shaded
    assert [bar for bar in patches if bar[0] == "after-stop"] == [("after-stop", result.first_stop_s, chart.end)]


def test_a_replay_charts_shares_start_at_zero_and_its_times_are_in_the_axis_units() -> None:
    # Given the corpus hang's chart (a labeled trace: a stop expected in a window, given in seconds)
    result = replay_file(HANG)
    chart = replay_chart(result, HANG, PREFIX)
    panels = {ax.get_label(): ax for ax in chart.figure().axes}

    # Then utilization, a share, is drawn from 0 to (just above) 100 %, and power and silence from 0
    assert panels["gpu_util"].get_ylim() == (0, 105)
    assert panels["gpu_power"].get_ylim()[0] == 0
    assert panels["log_silence"].get_ylim()[0] == 0
    # And the title gives the expected window and the stop as h:mm:ss, as the time axis counts
    lo, hi = result.expect["window_s"]
    assert chart.verdict_text() == (f"PASS: a stop expected {hms(lo)}-{hms(hi)}, stopped at {hms(result.first_stop_s)}")
    # And the window is drawn where it is, and both shaded regions are named in the legend
    [band] = [p for p in panels["alarms"].patches if p.get_gid() == "expected-stop"]
    assert (band.get_x(), band.get_x() + band.get_width()) == pytest.approx((lo, min(hi, chart.end)))
    legend = [t.get_text() for t in chart.figure().legends[0].get_texts()]
    assert f"after the stop ({hms(result.first_stop_s)}): the time it saved" in legend
    assert f"expected stop window {hms(lo)}-{hms(min(hi, chart.end))}" in legend


def test_without_the_agent_the_chart_draws_the_cloudwatch_agents_power_and_explains_the_progress_alarm(
    tmp_path: Path,
) -> None:
    # Given a healthy EC2 job without the trainer agent whose CloudWatch agent publishes power_draw (per instance)
    trace = tmp_path / "ec2-healthy-power.jsonl"
    with open(EC2_HEALTHY, encoding="utf-8") as source, open(trace, "w", encoding="utf-8") as out:
        for line in source:
            out.write(line)
            event = json.loads(line)
            metric = event.get("metric", {})
            if metric.get("name") == contract.CWAGENT_GPU_UTILIZATION:
                power = {**metric, "name": contract.CWAGENT_GPU_POWER, "value": 600.0 if metric["value"] > 50 else 90.0}
                out.write(json.dumps({"t": event["t"], "metric": power}) + "\n")

    # When its replay is charted
    result = replay_file(trace)
    chart = replay_chart(result, trace, PREFIX)

    # Then the power panel is the CloudWatch agent's power_draw, per host, and says whose it is
    assert chart.power_source == "CloudWatch agent (power_draw)"
    assert chart.gpu_power
    assert all(series.points for series in chart.gpu_power.values())
    assert {v for series in chart.gpu_power.values() for v in series.values()} <= {600.0, 90.0}
    panels = {ax.get_label(): ax for ax in chart.figure().axes}
    assert "CloudWatch agent" in panels["gpu_power"].get_ylabel()
    # And the progress alarm, in ALARM all along for want of the agent's steps, is drawn and labeled as such
    assert chart.without_data == {"progress"}
    labels = [label.get_text() for label in panels["alarms"].get_yticklabels()]
    assert "progress (no data)" in labels
    notes = " ".join(text.get_text() for text in panels["alarms"].texts)
    assert "no trainer agent" in notes
    assert result.first_stop_s is None


def test_a_big_clusters_alarms_are_drawn_one_row_per_kind_over_the_time_any_host_was_in_alarm() -> None:
    # Given a replay in which 20 hosts' gpu-idle alarms went to ALARM at staggered times, and the job's progress alarm
    result = replay_file(HANG)
    changes = [
        change
        for host in range(1, 21)
        for change in (
            AlarmChange(100.0 * host, f"{PREFIX}sagemaker.{result.job}.gpu-idle.algo-{host}", AlarmState.ALARM),
            AlarmChange(100.0 * host + 150, f"{PREFIX}sagemaker.{result.job}.gpu-idle.algo-{host}", AlarmState.OK),
        )
    ]
    stop = result.first_stop_s
    changes.append(AlarmChange(stop - 300, f"{PREFIX}sagemaker.{result.job}.progress", AlarmState.ALARM))
    busy = dataclasses.replace(result, alarm_changes=tuple(sorted(changes, key=lambda c: c.t)))

    # When it is charted, Then the 21 alarms are 2 rows: each kind, while any of its alarms was in ALARM (the last
    # until the stop ends the replay)
    chart = replay_chart(busy, HANG, PREFIX)
    assert chart.alarms == {"gpu-idle (any of 20 hosts)": ((100.0, 2150.0),), "progress": ((stop - 300, stop),)}

    # And a few alarms keep a row each, hosts in number order
    few = dataclasses.replace(
        result, alarm_changes=tuple(c for c in busy.alarm_changes if c.alarm[-3:] in ("o-2", "-10"))
    )
    assert list(replay_chart(few, HANG, PREFIX).alarms) == ["gpu-idle algo-2", "gpu-idle algo-10"]


def test_several_traces_are_drawn_one_chart_each_in_the_folder(tmp_path: Path) -> None:
    traces = [ROOT / "corpus" / "traces" / name for name in ("sm-idle-silent-1host.jsonl", "ec2-hang-agent.jsonl")]
    folder = tmp_path / "charts"
    assert cli.main(["replay", *map(str, traces), "--plot", str(folder), "--json"]) == cli.EXIT_OK
    for trace in traces:
        assert_sensible_png(folder / f"{trace.stem}.png", min_height=900)


def test_without_matplotlib_plot_is_a_clear_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a CLI installed without the plot extra
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "replay.png"

    # When a chart is asked for, Then it exits 2 naming the extra, before replaying anything
    assert cli.main(["replay", str(HANG), "--plot", str(out)]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert "pip install './lambdas[plot]'" in captured.err
    assert (captured.out, out.exists()) == ("", False)


def test_the_plot_extra_is_matplotlib_pinned_for_development_and_kept_out_of_the_lambda_asset() -> None:
    extras = tomllib.loads((ROOT / "lambdas" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["plot"] == ["matplotlib>=3.8"]
    assert "matplotlib==" in (ROOT / "requirements-dev.txt").read_text()
    for asset in ("requirements.txt", "requirements.lock"):
        assert "matplotlib" not in (ROOT / "lambdas" / asset).read_text()


# ---- the goodput chart --------------------------------------------------------------------------------------------


@pytest.fixture
def clients() -> Iterator[AwsClients]:
    with moto.mock_aws():
        yield AwsClients(region="us-east-1")


def test_the_goodput_chart_of_a_corpus_hang_is_a_png_of_what_the_report_says(
    clients: AwsClients, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the corpus hang played onto AWS (moto) as the run it was, stopped where the replay stops it
    create_table(clients.dynamodb, TABLE)
    store = Store(clients.dynamodb, TABLE, 30)
    job = trace_run.play_trace(clients, store, load_trace(HANG))

    # When `stallwatch report --json --plot` reads it back
    out = tmp_path / "goodput.png"
    assert cli.main(["report", job, "--table", TABLE, "--json", "--plot", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)

    # Then the file is a PNG of a sensible size
    assert_sensible_png(out, min_height=300)

    # And the report is the replay's story: the run ends at the replay's stop, and its stall runs from the end of the
    # last metric period with steps (the report is exact to one period) to that stop
    replayed = replay_file(HANG)
    periods = per_period(HANG, "Steps", {contract.DIM_JOB: job}, 1, mean=False, epoch=trace_run.PLAY_EPOCH)
    stepping = [t for t, steps in periods if steps > 0]
    assert report["wall_s"] == pytest.approx(replayed.first_stop_s)
    assert report["categories"]["stalls"]["seconds"] == pytest.approx(replayed.first_stop_s - (stepping[-1] + PERIOD))

    # And the chart's timeline and split are the report's figures, category by category
    run, spans = run_spans(clients, store, job, now=time.time(), period=PERIOD)
    chart = goodput_chart(measure_goodput(run, spans), spans)
    seconds = {c.value: total["seconds"] for c, total in ((Category(k), v) for k, v in report["categories"].items())}
    assert {c.value: s for c, s in chart.category_seconds().items()} == pytest.approx(seconds)
    figure = chart.figure()
    panels = {ax.get_label(): ax for ax in figure.axes}
    timeline: dict[str, float] = defaultdict(float)
    for patch in panels["timeline"].patches:
        timeline[patch.get_gid()] += patch.get_width()
    assert dict(timeline) == pytest.approx({c: s for c, s in seconds.items() if s > 0})
    # And the whole-run bar is drawn as shares of the wall time, on an axis of its own from 0 to 100 %
    split = {p.get_gid(): p.get_width() for p in panels["split"].patches}
    assert split == pytest.approx({c: 100 * s / report["wall_s"] for c, s in seconds.items() if s > 0})
    assert sum(split.values()) == pytest.approx(100)
    assert panels["split"].get_xlim() == (0, 100)
    assert "%" in panels["split"].get_xlabel()
    legend = " ".join(text.get_text() for text in figure.legends[0].get_texts())
    for category, total in report["categories"].items():
        if total["seconds"] > 0:
            assert money(total["dollars"]) in legend, category
    assert f"{report['goodput']:.1%}" in figure.get_suptitle()


def test_a_resumed_run_is_drawn_one_row_per_attempt_with_the_gap_between_them_unheld() -> None:
    # Given the known run of two attempts (a hang, Stallwatch's stop, a restart from the checkpoint)
    jobs = known_run()
    goodput = measure_goodput("llama", jobs)

    # When it is charted
    chart = goodput_chart(goodput, jobs)

    # Then each attempt has its row, the 300 s between them are held by no instance, and the totals are the report's
    assert chart.rows == ("llama", "llama-r1")
    assert [(b.row, b.left, b.width) for b in chart.bars if not b.held] == [(0, 4000.0, 300.0)]
    assert chart.category_seconds() == pytest.approx({c: t.seconds for c, t in goodput.totals.items()})
    assert {b.row for b in chart.bars if b.left >= 4300} == {1}
