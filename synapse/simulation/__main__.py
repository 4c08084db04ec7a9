"""`python -m synapse.simulation [--seeds N | --seed S] [--first F] [--trace]`: run seeds and
print each failing one with the command that replays it. Exit status: 0 every seed held, 1 a
seed broke an invariant."""

from __future__ import annotations

import argparse
import sys
import time

from synapse.simulation.run import simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synapse.simulation", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="run this seed only")
    which.add_argument("--seeds", type=int, default=300, help="run this many seeds (300, as CI)")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds (0)")
    parser.add_argument("--trace", action="store_true", help="print each run's events")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.monotonic()
    failed = 0
    virtual = 0.0
    for seed in seeds:
        outcome = simulate(seed)
        virtual += outcome.virtual_seconds
        if args.trace:
            print("\n".join(outcome.trace))
        if args.trace or not outcome.ok:
            print(outcome.scenario.describe())
            print(f"  ends: {outcome.ends}; trace digest {outcome.digest}")
        if not outcome.ok:
            failed += 1
            for line in outcome.violations:
                print(f"  {line}")
            print(f"  replay: {outcome.replay_command()}")
    count = len(seeds)
    print(
        f"{count} seeds, {failed} failed, {time.monotonic() - started:.1f} s "
        f"({virtual / 3600:.0f} virtual hours)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
