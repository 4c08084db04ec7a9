"""`python -m synapse.model [--larger] [--bound NAME=N ...] [--max-states N] [--leases]`:
explore every state within the CI's bounds (or the larger one, or those changed by
`--bound`) and print each bound's count and any violation with its shortest trace; with
`--leases`, the replicas' lease protocol instead (`synapse.model.leases`).
Exit status: 0 no violation, 1 a violation."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields

from synapse.model.bounds import CI, LARGER, Bounds, from_environment
from synapse.model.checker import explore
from synapse.model.leases import explore_leases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synapse.model", description=__doc__)
    parser.add_argument(
        "--larger", action="store_true", help="two faults in one history (SYNAPSE_MODEL=larger)"
    )
    parser.add_argument(
        "--bound",
        action="append",
        default=[],
        metavar="NAME=N",
        help=f"change one bound of each explored ({', '.join(f.name for f in fields(Bounds))})",
    )
    parser.add_argument("--only", metavar="NAME", help=f"one of the CI's bounds: {', '.join(CI)}")
    parser.add_argument("--max-states", type=int, default=None, help="stop after N states")
    parser.add_argument(
        "--leases", action="store_true", help="the replicas' lease protocol (N=2, a kill, a pause)"
    )
    args = parser.parse_args(argv)
    if args.leases:
        leases = explore_leases()
        print(f"lease protocol: {leases.summary()}")
        for invariant, trace in leases.violations.items():
            print(
                f"{invariant}:\n" + "\n".join(f"  {n:2}. {step}" for n, step in enumerate(trace, 1))
            )
        return 1 if leases.violations else 0
    chosen = dict(LARGER) if args.larger else from_environment()
    if args.only is not None:
        if args.only not in CI:
            parser.error(f"--only: no bound {args.only!r} (one of: {', '.join(CI)})")
        chosen = {args.only: CI[args.only]}
    spec = ",".join(args.bound)
    started = time.monotonic()
    violated = False
    states = 0
    for name, bounds in chosen.items():
        result = explore(bounds.with_(spec) if spec else bounds, max_states=args.max_states)
        states += result.states
        print(f"{name}: {result.summary()}", flush=True)
        for violation in result.violations.values():
            violated = True
            print(violation)
    print(f"{states:,} states in {time.monotonic() - started:.0f} s")
    return 1 if violated else 0


if __name__ == "__main__":
    sys.exit(main())
