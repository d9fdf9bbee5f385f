"""Agent test fixtures: an in-memory sink, a fake clock and a clean single-process environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainer_agent import TrainerAgent, Window
from trainer_agent.contract import SCOPE_HOST, SCOPE_JOB
from trainer_agent.identity import LOCAL_RANK_ENV, LOCAL_WORLD_SIZE_ENV, NODE_RANK_ENV, RANK_ENV, WORLD_SIZE_ENV

PROCESS_ENV = (
    *RANK_ENV,
    *WORLD_SIZE_ENV,
    *LOCAL_RANK_ENV,
    NODE_RANK_ENV,
    LOCAL_WORLD_SIZE_ENV,
    "TRAINING_JOB_NAME",
    "STALLWATCH_JOB_NAME",
    "SM_CURRENT_HOST",
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_CLUSTER_NAME",
    "SLURMD_NODENAME",
)


class MemorySink:
    """Keeps every window it receives."""

    def __init__(self) -> None:
        self.windows: list[Window] = []
        self.closed = False

    def emit(self, window: Window) -> None:
        self.windows.append(window)

    def close(self, timeout_s: float) -> None:
        self.closed = True

    def of(self, scope: str) -> list[Window]:
        return [window for window in self.windows if window.scope == scope]

    @property
    def job(self) -> list[Window]:
        return self.of(SCOPE_JOB)

    @property
    def host(self) -> list[Window]:
        return self.of(SCOPE_HOST)


class FakeClock:
    """A perf_counter that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank/job/host variables leak in from the machine running the tests."""
    for name in PROCESS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STALLWATCH_JOB_NAME", "test-job")
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_agent(sink: MemorySink, clock: FakeClock) -> Iterator:
    """Build agents that emit only on flush() (a one-hour interval) into `sink`, on the fake clock; closed after."""
    agents: list[TrainerAgent] = []

    def make(**kwargs: object) -> TrainerAgent:
        options = {"interval_s": 3600.0, "sinks": [sink], "handle_sigterm": False, "clock": clock} | kwargs
        agent = TrainerAgent(**options)  # type: ignore[arg-type]
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.close(timeout_s=1.0)
