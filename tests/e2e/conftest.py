"""The real Slurm some of this room's tests run on (tests/fixtures/slurm.py)."""

from tests.fixtures.slurm import slurm, slurm_daemons  # noqa: F401
