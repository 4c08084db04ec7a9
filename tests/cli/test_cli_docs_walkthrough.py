"""docs/cli.md's walkthrough, run as shown: its executor in one process, every requester
command of 'terminal 2' against it, with the exit status and output its comments promise.
Only the ports differ: free ones instead of the document's 8080 and 9001."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from clikit import clean_env, free_port, run, serve

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text("utf-8")


def walkthrough() -> tuple[list[str], dict[str, str], list[tuple[str, str]]]:
    """(serve arguments, terminal 2's environment, [(command line, comment)])."""
    block = DOC.split("# terminal 1: the executor\n", 1)[1].split("\n```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.strip() for line in joined.splitlines() if line.strip()]
    serve_line = next(line for line in lines if line.startswith("synapse serve"))
    export = next(line for line in lines if line.startswith("export "))
    env = dict(item.split("=", 1) for item in shlex.split(export)[1:])
    commands = []
    for line in lines:
        command, _, comment = line.partition("  #")
        if command.startswith(("synapse send", "synapse ping", "synapse caps")) or (
            "synapse send" in command
        ):
            commands.append((command.strip(), comment.strip()))
    return shlex.split(serve_line)[2:], env, commands


def test_the_walkthrough_is_found() -> None:
    serve_args, env, commands = walkthrough()
    assert "--agent-id" in serve_args and env["SYNAPSE_AS"] == "agent-r"
    assert len(commands) >= 10


def test_the_cli_walkthrough_runs_as_documented(tmp_path: Path) -> None:
    serve_args, env, commands = walkthrough()
    keygen = "openssl rand -hex 32 > synapse.secret"
    assert keygen in DOC.split("# terminal 1: the executor", 1)[1]
    subprocess.run(["bash", "-c", keygen], cwd=tmp_path, check=True)  # both terminals' cwd
    port, listen_port = free_port(), free_port()

    def ported(text: str) -> str:
        return text.replace("127.0.0.1:8080", f"127.0.0.1:{port}").replace(
            "127.0.0.1:9001", f"127.0.0.1:{listen_port}"
        )

    args = [ported(a) for a in serve_args]
    at = args.index("--port")
    args[at + 1] = str(port)
    env = {k: ported(v) for k, v in env.items()}
    with serve(*args[:at], *args[at + 2 :], port=port, cwd=str(tmp_path)):
        for line, comment in commands:
            words = shlex.split(ported(line))
            extra = {}
            while "=" in words[0] and words[0].split("=", 1)[0].isupper():
                name, value = words.pop(0).split("=", 1)
                extra[name] = value
            assert words[0] == "synapse", line
            interactive = "asks" in comment
            answer = "现代\n" if "style" in comment else "approve\n" if interactive else ""
            done = run(*words[1:], input=answer, env=clean_env({**env, **extra}), cwd=str(tmp_path))
            expected = 0
            found = re.search(r"exit (\d)", comment)
            if found:
                expected = int(found.group(1))
            assert done.returncode == expected, (line, done.stdout, done.stderr)
            promised = re.search(r"→ (\S+)", comment)
            if promised:
                assert promised.group(1) in done.stdout, (line, done.stdout)
            said = re.search(r"exit \d: (.+?): …", comment)
            if said:
                assert said.group(1) in done.stderr + done.stdout, (line, done.stderr)
