"""Disk faults for store tests: a small tmpfs that can be filled, immutable files, a held lock.

Mounting needs root (CI runs as root). Outside CI a machine that does not permit it skips the
test with the reason; under `CI=true` it fails instead, so the fault is never silently untested.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (required under CI=true)")
    pytest.skip(reason)


@contextlib.contextmanager
def small_tmpfs(where: Path, size_kib: int = 4096) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted at `where` (unmounted afterwards)."""
    where.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        _unavailable("mounting a tmpfs needs root and mount(8) (util-linux)")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        _unavailable(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    """Take every free block of `directory`'s file system; delete the returned file to free."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def set_immutable(paths: list[Path], on: bool) -> None:
    """`chattr ±i`: even root cannot open such a file for writing."""
    chattr = shutil.which("chattr")
    if chattr is None or os.geteuid() != 0:
        _unavailable("immutable files need root and chattr(1) (e2fsprogs)")
    done = subprocess.run(
        [chattr, "+i" if on else "-i", *map(str, paths)], capture_output=True, text=True
    )
    if done.returncode != 0:
        _unavailable(f"chattr not supported here: {done.stderr.strip()}")


@contextlib.contextmanager
def write_lock(db: Path) -> Iterator[sqlite3.Connection]:
    """Hold `db`'s write lock from another connection (as another process would)."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()
