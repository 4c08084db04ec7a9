"""Build a release: the sdist and the wheel into dist/, their metadata checked.

    python tools/release.py            # dist/synapse_agent_p2p-VERSION.tar.gz and .whl

The wheel is built from the sdist, not from the tree, so what a user installs from the
package index is what the sdist holds (tests/test_packaging.py checks both hold the same
package files). `twine check` then checks the metadata the index will show. Publishing is
one more command, left to a person with the credentials: `twine upload dist/*`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(out: Path) -> list[Path]:
    """The sdist, then the wheel built from it, in `out` (emptied first)."""
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
    )
    built = sorted(out.iterdir())
    subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, built)], check=True
    )
    return built


if __name__ == "__main__":
    for path in build(ROOT / "dist"):
        print(path.relative_to(ROOT))
