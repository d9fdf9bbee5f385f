"""This room's tests run on moto, through the fixtures in tests/fixtures/moto_runtime.py."""

from tests.fixtures.moto_runtime import aws_env, context, counted, rechecks, rt, slack, world  # noqa: F401
