"""Two CloudWatch dashboards per deployment: the fleet (every job, the fleet's goodput by category, platform, team
and instance type, and the control plane's health), and one job
chosen by a dashboard variable (`JobName`) showing progress, throughput, efficiency, loss, phases, goodput, GPU
utilization and power.

Metric names come from `stallwatch.core.contract`, the mirror of the agent's contract.
"""

from __future__ import annotations

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.constants import DASHBOARD_PERIOD
from stallwatch.core.contract import (
    CONTROL_PLANE_NAMESPACE,
    DIM_CATEGORY,
    DIM_HOST,
    DIM_INSTANCE_TYPE,
    DIM_JOB,
    DIM_PLATFORM,
    DIM_TEAM,
    LOG_IDLE_SECONDS,
    NAMESPACE,
    RUN_GPU_HOURS,
    SAGEMAKER_NAMESPACE,
)

# Replaced across the job dashboard by the job picked in the `JobName` variable (a pattern variable, so it
# reaches into SEARCH expressions too). Underscores never occur in SageMaker job names.
JOB_PLACEHOLDER = "SELECT_A_JOB"
WIDGET_WIDTH = 12
WIDGET_HEIGHT = 6
_FLEET_PERIOD = Duration.minutes(5)
_RUN_PERIOD = Duration.days(1)  # a run's goodput is one datapoint at its end; the widgets sum the range
FLEET_GOODPUT_BY = {DIM_PLATFORM: "by platform", DIM_TEAM: "by team", DIM_INSTANCE_TYPE: "by instance type"}


def job_dashboard_name(deployment: str) -> str:
    """The per-job dashboard's name (dashboard names are account-wide: the region is in it). A plain string, not the
    dashboard's Ref, so that the functions the dashboard graphs can carry it too."""
    return f"{deployment}-job-{Aws.REGION}"


def _search(
    namespace: str, dimensions: list[str], metric: str | None, statistic: str, period: Duration, *, term: str
) -> str:
    """A CloudWatch SEARCH expression: one line per matching metric (host, job); every metric if `metric` is None."""
    schema = ",".join([f'"{namespace}"', *dimensions])
    name = f'MetricName="{metric}"' if metric else ""
    query = " ".join(part for part in (f"{{{schema}}}", name, term) if part)
    return f"SEARCH('{query}', '{statistic}', {int(period.to_seconds())})"


class Dashboards(Construct):
    """The fleet dashboard and the per-job dashboard, exposed as `fleet` and `job`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        deployment: str,
        functions: list[lambda_.Function],
        dead_letter_queue: sqs.IQueue,
        health_alarms: list[cloudwatch.IAlarm],
    ) -> None:
        """Named `<deployment>-fleet-<region>` and `<deployment>-job-<region>`: dashboard names are account-wide."""
        super().__init__(scope, construct_id)
        self.deployment = deployment
        self.fleet = self._build_fleet(functions, dead_letter_queue, health_alarms)
        self.job = self._build_job()

    def _build_fleet(
        self, functions: list[lambda_.Function], queue: sqs.IQueue, health_alarms: list[cloudwatch.IAlarm]
    ) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(
            self, "Fleet", dashboard_name=f"{self.deployment}-fleet-{Aws.REGION}", default_interval=Duration.hours(6)
        )
        dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown=f"# Stallwatch fleet ({self.deployment})\n"
                f"Every job reporting to `{NAMESPACE}`, and this deployment's control plane.",
                width=24,
                height=2,
            ),
            self._search_graph(
                "Seconds since the last step, per job", "LastStepAge", [DIM_JOB], "Maximum", _FLEET_PERIOD
            ),
            self._search_graph("Tokens/s per job", "TokensPerSecond", [DIM_JOB], "Average", _FLEET_PERIOD),
            self._search_graph("MFU per job (%)", "MFU", [DIM_JOB], "Average", _FLEET_PERIOD),
            self._search_graph(
                "Accelerator utilization per host (agent: GPUs, NeuronCores)",
                "AcceleratorUtilization",
                [DIM_JOB, DIM_HOST],
                "Average",
                _FLEET_PERIOD,
            ),
            self._search_graph(
                "GPU utilization per host (SageMaker)",
                "GPUUtilization",
                [DIM_HOST],
                "Average",
                _FLEET_PERIOD,
                namespace=SAGEMAKER_NAMESPACE,
            ),
            self._search_graph(
                "Seconds since the last log line, per host",
                LOG_IDLE_SECONDS,
                [DIM_JOB, DIM_HOST],
                "Maximum",
                _FLEET_PERIOD,
            ),
            cloudwatch.AlarmStatusWidget(title="Control-plane health", alarms=health_alarms, width=24, height=4),
            self._search_graph(
                "Control plane: decisions, stops, operator actions",
                None,
                ["service"],
                "Sum",
                _FLEET_PERIOD,
                namespace=CONTROL_PLANE_NAMESPACE,
                term=f'service="{self.deployment}"',
            ),
            self._graph("Invocations", [function.metric_invocations(period=_FLEET_PERIOD) for function in functions]),
            self._graph(
                "Errors and throttles",
                [
                    metric
                    for function in functions
                    for metric in (
                        function.metric_errors(period=_FLEET_PERIOD),
                        function.metric_throttles(period=_FLEET_PERIOD),
                    )
                ],
            ),
            self._graph("Duration (p99)", [function.metric_duration(statistic="p99") for function in functions]),
            self._graph("Dead letters", [queue.metric_approximate_number_of_messages_visible(period=_FLEET_PERIOD)]),
            *self._fleet_goodput_widgets(),
        )
        return dashboard

    def _fleet_goodput_widgets(self) -> list[cloudwatch.IWidget]:
        """The runs that ended in the dashboard's range (`runtime.run_goodput`'s metrics): their GPU-hours by goodput
        category, and by category with platform, team and instance type; `stallwatch report --fleet` is the same
        with the runs that cost most."""
        markdown = (
            "## Fleet goodput: GPU-hours by category of the runs that ended in this range\n"
            "Productive steps are the goodput; the rest is badput by cause. "
            "`stallwatch report --fleet --since 30d` gives the same, and the runs that cost most."
        )
        widgets: list[cloudwatch.IWidget] = [cloudwatch.TextWidget(markdown=markdown, width=24, height=2)]
        for dimension, title in {None: "all runs", **FLEET_GOODPUT_BY}.items():
            dimensions = [DIM_CATEGORY, *([dimension] if dimension else []), "service"]
            expression = _search(
                CONTROL_PLANE_NAMESPACE,
                dimensions,
                RUN_GPU_HOURS,
                "Sum",
                _RUN_PERIOD,
                term=f'service="{self.deployment}"',
            )
            widgets.append(
                cloudwatch.GraphWidget(
                    title=f"Run GPU-hours by category: {title}",
                    left=[cloudwatch.MathExpression(expression=expression, label="", period=_RUN_PERIOD)],
                    view=cloudwatch.GraphWidgetView.BAR,
                    set_period_to_time_range=True,
                    width=WIDGET_WIDTH // 2 if dimension else WIDGET_WIDTH,
                    height=WIDGET_HEIGHT,
                )
            )
        return widgets

    def _build_job(self) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(
            self,
            "Job",
            dashboard_name=job_dashboard_name(self.deployment),
            default_interval=Duration.hours(3),
            variables=[
                cloudwatch.DashboardVariable(
                    id=DIM_JOB,
                    label="Job",
                    type=cloudwatch.VariableType.PATTERN,
                    input_type=cloudwatch.VariableInputType.SELECT,
                    value=JOB_PLACEHOLDER,
                    values=cloudwatch.Values.from_search_components(
                        namespace=NAMESPACE, dimensions=[DIM_JOB], metric_name="Step", populate_from=DIM_JOB
                    ),
                    default_value=cloudwatch.DefaultValue.FIRST,
                )
            ],
        )
        dashboard.add_widgets(
            self._job_graph("Step", [("Step", "Maximum")]),
            self._job_graph("Seconds since the last step", [("LastStepAge", "Maximum"), ("StepTime", "Average")]),
            self._job_graph("Throughput", [("TokensPerSecond", "Average"), ("SamplesPerSecond", "Average")]),
            self._job_graph(
                "TFLOPs per accelerator and MFU (%)", [("TFLOPsPerAccelerator", "Average"), ("MFU", "Average")]
            ),
            self._job_graph("Loss", [("Loss", "Average"), ("NonFiniteLoss", "Sum")]),
            self._job_graph("Phases: budget left, ETA (s)", [("PhaseBudgetRemaining", "Minimum"), ("ETA", "Minimum")]),
            self._job_graph("Data wait (%)", [("DataWaitFraction", "Average")]),
            self._goodput_graph(),
            self._search_graph(
                "Accelerator utilization per host (%)",
                "AcceleratorUtilization",
                [DIM_JOB, DIM_HOST],
                "Average",
                DASHBOARD_PERIOD,
                term=f'{DIM_JOB}="{JOB_PLACEHOLDER}"',
            ),
            self._search_graph(
                "GPU power per host (W)",
                "AcceleratorPowerWatts",
                [DIM_JOB, DIM_HOST],
                "Average",
                DASHBOARD_PERIOD,
                term=f'{DIM_JOB}="{JOB_PLACEHOLDER}"',
            ),
            self._search_graph(
                "NeuronCore power per host (% of the device's maximum)",
                "AcceleratorPowerPercent",
                [DIM_JOB, DIM_HOST],
                "Average",
                DASHBOARD_PERIOD,
                term=f'{DIM_JOB}="{JOB_PLACEHOLDER}"',
            ),
            self._search_graph(
                "GPU utilization per host, SageMaker (%)",
                "GPUUtilization",
                [DIM_HOST],
                "Average",
                DASHBOARD_PERIOD,
                namespace=SAGEMAKER_NAMESPACE,
                term=f'"{JOB_PLACEHOLDER}"',
            ),
            self._search_graph(
                "Heartbeats per host",
                "Heartbeat",
                [DIM_JOB, DIM_HOST],
                "Sum",
                DASHBOARD_PERIOD,
                term=f'{DIM_JOB}="{JOB_PLACEHOLDER}"',
            ),
            self._search_graph(
                "Seconds since the last log line, per host",
                LOG_IDLE_SECONDS,
                [DIM_JOB, DIM_HOST],
                "Maximum",
                DASHBOARD_PERIOD,
                term=f'{DIM_JOB}="{JOB_PLACEHOLDER}"',
            ),
        )
        return dashboard

    def _goodput_graph(self) -> cloudwatch.GraphWidget:
        """Goodput at a glance: per period, stepping, in a declared phase, or neither (startup, stall, idle).
        The run's full split, restarts included, is `stallwatch report JOB` (docs/goodput.md)."""

        def job_metric(name: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace=NAMESPACE,
                metric_name=name,
                dimensions_map={DIM_JOB: JOB_PLACEHOLDER},
                statistic="Maximum",
                period=DASHBOARD_PERIOD,
            )

        inputs = {"steps": job_metric("Steps"), "phase": job_metric("PhaseBudgetRemaining")}
        series = {
            "Stepping (goodput)": "100 * IF(steps > 0, 1, 0)",
            "Declared phase": "100 * IF(steps <= 0 AND phase > 0, 1, 0)",
            "No step (startup, stall, idle)": "100 * IF(steps <= 0 AND phase <= 0, 1, 0)",
        }
        return cloudwatch.GraphWidget(
            title="Goodput: share of time stepping (%)",
            left=[
                cloudwatch.MathExpression(expression=expression, using_metrics=inputs, label=label)
                for label, expression in series.items()
            ],
            stacked=True,
            left_y_axis=cloudwatch.YAxisProps(min=0, max=100, show_units=False),
            width=WIDGET_WIDTH,
            height=WIDGET_HEIGHT,
        )

    @staticmethod
    def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
        return cloudwatch.GraphWidget(title=title, left=metrics, width=WIDGET_WIDTH, height=WIDGET_HEIGHT)

    def _job_graph(self, title: str, metrics: list[tuple[str, str]]) -> cloudwatch.GraphWidget:
        return self._graph(
            title,
            [
                cloudwatch.Metric(
                    namespace=NAMESPACE,
                    metric_name=name,
                    dimensions_map={DIM_JOB: JOB_PLACEHOLDER},
                    statistic=statistic,
                    period=DASHBOARD_PERIOD,
                )
                for name, statistic in metrics
            ],
        )

    def _search_graph(
        self,
        title: str,
        metric: str | None,
        dimensions: list[str],
        statistic: str,
        period: Duration,
        *,
        namespace: str = NAMESPACE,
        term: str = "",
    ) -> cloudwatch.GraphWidget:
        expression = _search(namespace, dimensions, metric, statistic, period, term=term)
        return self._graph(title, [cloudwatch.MathExpression(expression=expression, label="", period=period)])
