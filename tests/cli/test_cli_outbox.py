"""`synapse outbox` as a subprocess, on a store a real requester `Peer` left behind.

The store is made once per module, in-process: a requester whose executor is down submits
`task-dead`, whose `task_request` becomes a dead letter (`dead_letter_after` 0.2 s), then
`task-pending`, and stops while that one is still pending. Each test works on a copy.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clikit import SECRET, error_lines, free_port, no_traceback, run, run_here, url

from synapse.demo.handler import DemoHandler
from synapse.p2p.config import P2PConfig
from synapse.p2p.engine import TaskKey
from synapse.store import SqliteStore
from synapse.store.sqlite import SCHEMA_VERSION
from synapse.transport.partners import Partner
from synapse.transport.peer import Peer

REQ, EXEC = "req", "exec"
FAST = P2PConfig(
    max_retries=0,
    retry_base_delay=0.02,
    retry_max_delay=0.05,
    heartbeat_interval=0.1,
    request_timeout=2.0,
    dead_letter_after=0.2,
    fail_undelivered_requests=False,  # the requests wait, then die: the store the tests need
)


class Made:
    """The prepared store: its file, the ports of both sides, the two message ids."""

    def __init__(self, path: Path, req_port: int, exec_port: int) -> None:
        self.path = path
        self.req_port = req_port
        self.exec_port = exec_port
        self.dead = ""
        self.pending = ""


def requester(made: Made, path: Path) -> Peer:
    partner = Partner(EXEC, url(made.exec_port), (SECRET,))
    return Peer(REQ, partners=[partner], port=made.req_port, config=FAST, store=SqliteStore(path))


async def _prepare(made: Made) -> None:
    peer = requester(made, made.path)
    await peer.start()
    try:
        await peer.submit(EXEC, "echo", {"text": "given up on"}, task_id="task-dead")
        deadline = time.monotonic() + 10
        while peer.protocol.pending_deliveries:  # until it is a dead letter
            assert time.monotonic() < deadline, "task-dead never became a dead letter"
            await asyncio.sleep(0.02)
        await peer.submit(EXEC, "echo", {"text": "still queued"}, task_id="task-pending")
        assert peer.protocol.pending_deliveries == 1  # queued, and durable once submit returns
    finally:
        await peer.close(drain_timeout=0)
    store = SqliteStore(made.path)
    snapshot = store.load()
    await store.close()
    [dead] = snapshot.dead_letters
    [pending] = snapshot.outbox
    made.dead, made.pending = dead.item.message_id, pending.message_id


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Made:
    made = Made(tmp_path_factory.mktemp("outbox") / "req.sqlite", free_port(), free_port())
    asyncio.run(_prepare(made))
    return made


@pytest.fixture
def store(prepared: Made, tmp_path: Path) -> Iterator[Path]:
    """A copy of the prepared store (SQLite's backup API: the WAL included)."""
    path = tmp_path / "copy.sqlite"
    src, dst = sqlite3.connect(prepared.path), sqlite3.connect(path)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    yield path


def outbox(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = run("outbox", *args, env=env)
    no_traceback(result)
    return result.returncode, result.stdout, result.stderr


def listed(path: Path) -> list[dict[str, object]]:
    status, out, err = outbox("--store", str(path), "--json")
    assert status == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_list_is_a_table_of_pending_messages_and_dead_letters(prepared: Made, store: Path) -> None:
    status, out, err = outbox("--store", str(store))
    assert (status, err) == (0, "")
    header, first, second, summary = out.splitlines()
    assert header.split() == [
        "STATUS", "SEQ", "MESSAGE", "ID", "TYPE", "PARTNER", "TASK", "AGE", "DEAD", "REASON",
    ]  # fmt: skip
    assert first.split()[:6] == ["dead", "1", prepared.dead, "task_request", EXEC, "task-dead"]
    assert "undeliverable: no delivery to exec" in first
    assert second.split()[:6] == [
        "pending", "2", prepared.pending, "task_request", EXEC, "task-pending",
    ]  # fmt: skip
    assert second.split()[6].endswith("s")  # its age, e.g. 1s
    assert summary == f"{store}: 1 pending, 1 dead letter"


def test_a_file_of_an_older_schema_version_is_listed_and_brought_up_to_date(
    prepared: Made, store: Path
) -> None:
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.execute("DROP INDEX tasks_finished")  # version 1's, with an IN list
    conn.execute(
        "CREATE INDEX tasks_finished ON tasks (updated_at) "
        "WHERE state IN ('completed', 'failed', 'cancelled', 'rejected')"
    )
    conn.close()
    assert [row["message_id"] for row in listed(store)] == [prepared.dead, prepared.pending]
    conn = sqlite3.connect(store)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    index = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks_finished'").fetchone()
    conn.close()
    assert version == (str(SCHEMA_VERSION),) and " IN " not in index[0]
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    conn.close()
    status, out, err = outbox("--store", str(store))
    assert (status, out) == (2, "")
    assert f"store has schema {SCHEMA_VERSION + 1}; this version reads {SCHEMA_VERSION}" in err


def test_list_json_is_one_object_a_line(prepared: Made, store: Path) -> None:
    dead, pending = listed(store)
    assert dead["status"] == "dead" and pending["status"] == "pending"
    assert [dead["message_id"], pending["message_id"]] == [prepared.dead, prepared.pending]
    assert [dead["seq"], pending["seq"]] == [1, 2]
    assert dead["type"] == pending["type"] == "p2p:task_request"
    assert (dead["partner"], dead["requester"], dead["task_id"]) == (EXEC, REQ, "task-dead")
    assert str(dead["dead_reason"]).startswith("undeliverable: ")
    assert isinstance(dead["dead_at"], float) and isinstance(dead["age_s"], float)
    assert pending["dead_reason"] is None and pending["dead_at"] is None


def test_retry_makes_a_dead_letter_pending_again(prepared: Made, store: Path) -> None:
    status, out, err = outbox("--store", str(store), "retry", prepared.dead)
    assert (status, err) == (0, "")
    assert out == (
        f"retried {prepared.dead}: pending again for {EXEC}, delivered at the peer's next start\n"
    )
    assert [(r["message_id"], r["status"]) for r in listed(store)] == [
        (prepared.dead, "pending"),
        (prepared.pending, "pending"),
    ]


def test_drop_deletes_a_dead_letter_and_a_pending_message(prepared: Made, store: Path) -> None:
    status, out, _ = outbox("--store", str(store), "drop", prepared.dead)
    assert status == 0
    assert out == f"dropped dead {prepared.dead} (p2p:task_request for {EXEC})\n"
    status, out, _ = outbox("--store", str(store), "drop", prepared.pending, "--json")
    assert status == 0
    assert json.loads(out)["action"] == "dropped"
    assert listed(store) == []
    status, out, _ = outbox("--store", str(store))
    assert (status, out) == (0, f"{store}: 0 pending, 0 dead letters\n")


@pytest.mark.parametrize(
    ("action", "which", "message"),
    [
        ("retry", "unknown", "no message 'msg-unknown' in the outbox of {store}"),
        ("drop", "unknown", "no message 'msg-unknown' in the outbox of {store}"),
        ("retry", "pending", "message {id!r} is pending, not a dead letter: nothing to retry"),
    ],
)
def test_an_id_it_cannot_act_on_exits_2(
    prepared: Made, store: Path, action: str, which: str, message: str
) -> None:
    message_id = prepared.pending if which == "pending" else "msg-unknown"
    status, out, err = outbox("--store", str(store), action, message_id)
    assert (status, out) == (2, "")
    assert error_lines(err) == ["synapse: " + message.format(store=store, id=message_id)]
    assert len(listed(store)) == 2  # nothing changed


def test_a_retried_dead_letter_is_delivered_at_the_next_start(prepared: Made, store: Path) -> None:
    assert outbox("--store", str(store), "retry", prepared.dead)[0] == 0

    async def restart() -> str:
        executor = Peer(
            EXEC,
            partners=[Partner(REQ, url(prepared.req_port), (SECRET,))],
            handler=DemoHandler(),
            port=prepared.exec_port,
            config=FAST,
        )
        await executor.start()
        peer = requester(prepared, store)
        await peer.start()
        try:
            handle = peer.protocol.handle(TaskKey(REQ, "task-dead"))
            assert handle is not None
            outcome = await handle.result(10)
            assert outcome.ok and outcome.result is not None
            return str(outcome.result.output)
        finally:
            await peer.close(drain_timeout=0)
            await executor.close(drain_timeout=0)

    assert asyncio.run(restart()) == "given up on"


def test_the_store_may_come_from_the_environment_or_a_config_file(
    store: Path, tmp_path: Path
) -> None:
    assert len(listed(store)) == 2
    status, out, _ = outbox("--json", env={"SYNAPSE_STORE": str(store)})
    assert status == 0 and len(out.splitlines()) == 2
    config = tmp_path / "synapse.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            store = "memory"

            [outbox]
            store = "{store}"
            """
        )
    )
    status, out, _ = outbox("--config", str(config), "--json")
    assert status == 0 and len(out.splitlines()) == 2


def _other_sqlite(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text TEXT)")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: "memory", "--store memory: nothing to inspect"),
        (lambda d: str(d / "missing.sqlite"), "no store at {d}/missing.sqlite"),
        (lambda d: str(d), "{d} is not a synapse store: not a file"),
        (lambda d: _text(d / "notes.txt"), "{d}/notes.txt is not a synapse store: file is not a"),
        (lambda d: str(_other_sqlite(d / "other.db")), "{d}/other.db is not a synapse store"),
    ],
    ids=["memory", "missing", "directory", "text-file", "other-sqlite"],
)
def test_no_store_there_is_one_line_exit_2(
    tmp_path: Path, make: Callable[[Path], str], message: str
) -> None:
    spec = make(tmp_path)
    status, out, err = run_here("outbox", "--store", spec)
    assert (status, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("synapse: " + message.format(d=tmp_path)), line
    assert not (tmp_path / "missing.sqlite").exists()  # nothing was created
    if spec.endswith("other.db"):  # nor was anything added to another database
        conn = sqlite3.connect(spec)
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
        conn.close()
        assert tables == ["notes"]


def _text(path: Path) -> str:
    path.write_text("not a database, just some text that is long enough\n" * 20)
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry"], "`retry` needs the MESSAGE_ID of a message `list` shows"),
        (["list", "msg-1"], "`list` takes no MESSAGE_ID"),
        (["fix", "msg-1"], "argument {list,retry,drop}: invalid choice: 'fix'"),
        ([], "missing --store"),
    ],
)
def test_outbox_usage_errors(args: list[str], message: str) -> None:
    status, _out, err = run_here("outbox", *args)
    assert status == 2
    [line] = err.splitlines()
    assert line.startswith(f"synapse: {message}"), line


def _doc_lines(doc: str) -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / doc).read_text("utf-8")
    shown = next(b for b in text.split("```sh\n")[1:] if b.startswith("synapse outbox --store"))
    return [line.split("  #", 1)[0].strip() for line in shown.split("\n```", 1)[0].splitlines()]


@pytest.mark.parametrize("doc", ["durability.md", "cli.md"])
def test_the_outbox_lines_of_the_docs_run_as_shown(prepared: Made, store: Path, doc: str) -> None:
    """Each line with PATH and MESSAGE_ID filled in; `[list] [--json]` both ways."""
    listing, retry, drop = _doc_lines(doc)
    assert listing == "synapse outbox --store PATH [list] [--json]"

    def run_shown(line: str, message_id: str = "") -> str:
        words = line.replace("PATH", str(store)).replace("MESSAGE_ID", message_id).split()
        result = run(*words[1:])
        no_traceback(result)
        assert result.returncode == 0, (line, result.stderr)
        return result.stdout

    assert run_shown(listing.replace(" [list] [--json]", "")).endswith(
        f"{store}: 1 pending, 1 dead letter\n"
    )
    assert len(run_shown(listing.replace("[list] [--json]", "list --json")).splitlines()) == 2
    assert run_shown(retry, prepared.dead).startswith(f"retried {prepared.dead}: pending again")
    assert run_shown(drop, prepared.pending).startswith(f"dropped pending {prepared.pending}")
    assert run_shown(listing.replace(" [list] [--json]", "")).endswith(
        f"{store}: 1 pending, 0 dead letters\n"
    )


def test_the_outbox_transcript_of_cli_md_is_what_it_prints(prepared: Made, store: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text("utf-8")
    shown = text.split("$ synapse outbox --store req.sqlite\n", 1)[1].split("\n```", 1)[0]
    header, dead, pending, summary, retry_line, retried = shown.splitlines()
    status, out, _ = outbox("--store", str(store))
    printed = out.splitlines()
    assert status == 0 and printed[0].split() == header.split()  # the same columns
    assert (
        printed[1].split()[:2] == dead.split()[:2] and printed[2].split()[:2] == pending.split()[:2]
    )
    assert printed[3] == summary.replace("req.sqlite", str(store))
    assert retry_line.startswith("$ synapse outbox --store req.sqlite retry ")
    status, out, _ = outbox("--store", str(store), "retry", prepared.dead)
    assert out.strip() == retried.replace(retried.split()[1], prepared.dead + ":", 1).replace(
        "exec", EXEC
    )
