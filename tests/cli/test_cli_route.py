"""`synapse serve --route POOL.toml`: a router process in front of spoke processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from clikit import (
    EXECUTOR,
    REQUESTER,
    SECRET,
    client_args,
    error_lines,
    free_port,
    run,
    run_here,
    serve,
    url,
)


def pool_file(tmp_path: Path, spokes: dict[str, int]) -> Path:
    lines = ["refresh_interval = 30", ""]
    for name, port in spokes.items():
        lines += [
            "[[partner]]",
            f'agent_id = "{name}"',
            f'endpoint = "{url(port)}"',
            f'secret = "{SECRET}"',
            "",
        ]
    path = tmp_path / "pool.toml"
    path.write_text("\n".join(lines))
    return path


def spoke_args(name: str, hub_port: int, *extra: str) -> list[str]:
    return [
        "--agent-id",
        name,
        "--secret",
        SECRET,
        "--peer",
        f"{EXECUTOR}={url(hub_port)}",
        "--log-json",
        "--log-level",
        "debug",  # every message_in, so that the test sees which spoke got each task
        *extra,
    ]


def test_serve_route_sends_each_task_to_a_spoke(tmp_path: Path) -> None:
    hub_port, requester_port = free_port(), free_port()
    spoke_ports = {"spoke-1": free_port(), "spoke-2": free_port()}
    pool = pool_file(tmp_path, spoke_ports)
    with (
        serve(*spoke_args("spoke-1", hub_port), port=spoke_ports["spoke-1"]) as spoke1,
        serve(*spoke_args("spoke-2", hub_port), port=spoke_ports["spoke-2"]) as spoke2,
        serve(
            "--agent-id",
            EXECUTOR,
            "--secret",
            SECRET,
            "--peer",
            f"{REQUESTER}={url(requester_port)}",
            "--route",
            str(pool),
            port=hub_port,
        ) as hub,
    ):
        args = client_args(hub, requester_port)
        caps = run("caps", *args)
        assert caps.returncode == 0, caps.stderr
        assert "text_generation" in caps.stdout and "portrait" in caps.stdout
        echo = run("send", *args, "echo", '{"text": "routed"}')
        assert echo.returncode == 0, echo.stderr
        assert echo.stdout.strip() == "routed"
        poem = run("send", *args, "--field", "style=现代", "text_generation", '{"prompt": "春天"}')
        assert poem.returncode == 0, poem.stderr
        assert "现代" in poem.stdout
        portrait = run("send", *args, "--reject", "portrait", '{"subject": "Ada"}')
        assert portrait.returncode == 1
        assert hub.stop() == 0
        spoke1.stop()
        spoke2.stop()
    log = "".join(hub.lines)
    assert "serving_routes" in log and "route_accepted" in log
    assert "Traceback" not in log
    # Every task was requested of a spoke once, and accepted there.
    events = [json.loads(line) for line in spoke1.lines + spoke2.lines]
    requests = [e for e in events if e["event"] == "message_in" and e["type"] == "p2p:task_request"]
    assert [e["sender"] for e in requests] == [EXECUTOR] * 3
    assert sorted(e["reply"] for e in requests) == [
        "p2p:task_confirm",
        "p2p:task_confirm",
        "p2p:task_need_info",
    ]


def test_a_bad_pool_file_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "pool.toml"
    bad.write_text("[pin]\necho = ['nobody']\n")
    status, _out, err = run_here(
        "serve",
        "--agent-id",
        EXECUTOR,
        "--port",
        str(free_port()),
        "--secret",
        SECRET,
        "--peer",
        f"{REQUESTER}={url(free_port())}",
        "--route",
        str(bad),
    )
    assert status == 2
    (line,) = error_lines(err)
    assert "bad pool" in line and "not in the pool" in line


def test_route_and_handler_exclude_each_other(tmp_path: Path) -> None:
    status, _out, err = run_here(
        "serve",
        "--agent-id",
        EXECUTOR,
        "--port",
        "0",
        "--secret",
        SECRET,
        "--peer",
        f"{REQUESTER}={url(free_port())}",
        "--route",
        str(tmp_path / "pool.toml"),
        "--handler",
        "synapse.demo.handler:DemoHandler",
    )
    assert status == 2
    assert any("--route and --handler" in line for line in error_lines(err))


def test_the_pool_file_comes_from_the_environment_or_the_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "pool.toml"
    bad.write_text("[pin]\necho = ['nobody']\n")
    peer = f"{REQUESTER}={url(free_port())}"
    base = ["serve", "--agent-id", EXECUTOR, "--port", "0", "--secret", SECRET, "--peer", peer]
    status, _out, err = run_here(*base, env={"SYNAPSE_ROUTE": str(bad)})
    assert status == 2 and "bad pool" in err
    config = tmp_path / "synapse.toml"
    config.write_text(f'route = "{bad}"\n')
    status, _out, err = run_here(*base, "--config", str(config))
    assert status == 2 and "bad pool" in err


def test_serve_a2a_route_describes_the_routed_types_on_its_card(tmp_path: Path) -> None:
    import urllib.request

    hub_port, spoke_port = free_port(), free_port()
    pool = tmp_path / "pool.toml"
    pool.write_text(
        f'[[partner]]\nagent_id = "spoke-1"\nendpoint = "{url(spoke_port)}"\n'
        f'secret = "{SECRET}"\ntask_types = ["echo"]\n'
    )
    with (
        serve(*spoke_args("spoke-1", hub_port), port=spoke_port) as spoke,
        serve(
            "--agent-id",
            EXECUTOR,
            "--secret",
            SECRET,
            "--peer",
            f"{REQUESTER}={url(free_port())}",
            "--route",
            str(pool),
            "--a2a",
            port=hub_port,
        ) as hub,
    ):
        deadline = time.monotonic() + 20
        while not any("serving_routes" in line for line in hub.lines):  # the pool is known
            assert time.monotonic() < deadline, "no serving_routes line"
            time.sleep(0.02)
        card_url = f"http://127.0.0.1:{hub_port}/.well-known/agent-card.json"
        with urllib.request.urlopen(card_url, timeout=10) as response:
            card = json.loads(response.read())
        # Only what the pool routes (echo), not the demo handler's five types.
        assert [s["id"] for s in card["skills"]] == ["echo"]
        assert hub.stop() == 0
        spoke.stop()
