"""`synapse ...` as the command line runs it, with the speed settings of `synapse serve`
switched off one by one, for A/B runs of `benchmarks.e2e`:

    python -m benchmarks._serve [--no-uvloop] [--no-gc-tuning] serve --agent-id ... (etc.)

`--no-uvloop` hides uvloop from the process (as if the `speed` extra were not installed);
`--no-gc-tuning` keeps the interpreter's default collector thresholds.
"""

from __future__ import annotations

import sys


def main() -> int:
    argv = sys.argv[1:]
    if "--no-uvloop" in argv:
        argv.remove("--no-uvloop")
        sys.modules["uvloop"] = None  # type: ignore[assignment]  # import uvloop → ImportError
    if "--no-gc-tuning" in argv:
        argv.remove("--no-gc-tuning")
        from synapse.cli import speed

        speed.GC_THRESHOLDS = None
    from synapse.cli.main import main as synapse_main

    return synapse_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
