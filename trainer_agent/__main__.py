"""``python -m trainer_agent --version``: the installed agent's version (the agent has no other command)."""

from __future__ import annotations

import argparse

from trainer_agent import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_agent", description="Stallwatch's training agent.")
    parser.add_argument("--version", action="version", version=f"trainer-agent {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
