"""`python -m synapse.model [--larger] [--bound NAME=N ...] [--max-states N]`: explore every
state within the bounds and print the count and any violation with its shortest trace.
Exit status: 0 no violation, 1 a violation."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from typing import Any

from synapse.model.bounds import Bounds
from synapse.model.checker import explore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synapse.model", description=__doc__)
    parser.add_argument("--larger", action="store_true", help="two of every fault")
    parser.add_argument(
        "--bound",
        action="append",
        default=[],
        metavar="NAME=N",
        help=f"one bound ({', '.join(f.name for f in fields(Bounds))})",
    )
    parser.add_argument("--max-states", type=int, default=None, help="stop after N states")
    args = parser.parse_args(argv)
    bounds = Bounds.larger() if args.larger else Bounds.from_environment()
    for item in args.bound:
        name, _, value = item.partition("=")
        change: dict[str, Any] = {name: float(value) if "." in value else int(value)}
        bounds = replace(bounds, **change)
    result = explore(bounds, max_states=args.max_states)
    print(result.summary())
    for violation in result.violations.values():
        print(violation)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
