"""`python -m synapse.simulation [--seeds N | --seed S] [--first F] [--trace]`: run seeds and
print each failing one with the command that replays it. With `--replicas URL`, the seeds
are those of one agent run by replicas on a PostgreSQL server (`synapse.simulation.replicas`:
each seed gets a fresh database there, dropped after). With `--router`, they are those of a
client's tasks routed by a hub over two spokes (`synapse.simulation.routing`). Exit status:
0 every seed held, 1 a seed broke an invariant."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial

from synapse.simulation.run import RunOutcome, simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synapse.simulation", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    kind = parser.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="run this seed only")
    which.add_argument("--seeds", type=int, default=300, help="run this many seeds (300, as CI)")
    parser.add_argument("--first", type=int, default=0, help="the first seed of --seeds (0)")
    parser.add_argument("--trace", action="store_true", help="print each run's events")
    kind.add_argument(
        "--router",
        action="store_true",
        help="run the router seeds: a client's tasks through a hub over two spokes",
    )
    kind.add_argument(
        "--replicas",
        metavar="URL",
        help="run the replica seeds on the PostgreSQL server at URL (a database it may "
        "create databases from, e.g. postgresql://postgres@127.0.0.1:5432/postgres)",
    )
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.monotonic()
    failed = 0
    virtual = 0.0
    run: Callable[[int], RunOutcome] = simulate
    if args.replicas:
        from synapse.simulation.replicas import simulate_replicas
        from synapse.simulation.shared import Databases

        databases = Databases(args.replicas)
        run = partial(simulate_replicas, databases=databases)
    elif args.router:
        from synapse.simulation.routing import simulate_router

        run = simulate_router
    for seed in seeds:
        outcome = run(seed)
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
            replay = outcome.replay_command()
            if args.replicas:
                replay += f" --replicas {args.replicas}"
            elif args.router:
                replay += " --router"
            print(f"  replay: {replay}")
    if args.replicas:
        databases.close()
    count = len(seeds)
    print(
        f"{count} seeds, {failed} failed, {time.monotonic() - started:.1f} s "
        f"({virtual / 3600:.0f} virtual hours)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
