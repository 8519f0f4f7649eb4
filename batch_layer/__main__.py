"""`python -m batch_layer runner [--once] [--no-schedule]`: the runner without the CLI (used
by tests that kill it, and handy on a cluster's driver host). Config from `LAMBDA_CONFIG`."""

from __future__ import annotations

import argparse
import logging

from batch_layer.runner import run_runner
from shared.config import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m batch_layer")
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("runner", help="execute queued runs one at a time")
    runner.add_argument("--once", action="store_true", help="execute the due runs, then exit")
    runner.add_argument("--no-schedule", action="store_true", help="do not queue scheduled runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_runner(load_settings(), once=args.once, schedule=not args.no_schedule)


if __name__ == "__main__":
    main()
