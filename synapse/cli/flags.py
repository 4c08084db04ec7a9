"""The flags several commands share, and how every command's `--help` reads: one formatter,
and the example command lines each help ends with."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence

from synapse.cli.options import (
    CONFIG,
    LOG_JSON,
    PEER_SECRET_FILE,
    RETRIES,
    SECRET,
    SIGNING,
    VERBOSE,
    add_setting,
)
from synapse.cli.security_settings import add_secret_flags

#: Help is wrapped to this many columns (argparse's default follows the terminal, which makes
#: the text differ between a terminal, a pipe and a test).
HELP_WIDTH = 88


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions and epilogs paragraph by paragraph, and keeps an indented line (an
    example command) as it is written."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=HELP_WIDTH, max_help_position=32)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs: list[str] = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if lines and all(line.startswith("  ") or line.endswith(":") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(paragraph.split()),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                    )
                )
        return "\n\n".join(paragraphs)


def epilog(exit_statuses: str, examples: Sequence[str]) -> str:
    """A command's epilog: its exit statuses, then its example command lines."""
    shown = "\n".join(f"  {example}" for example in examples)
    return f"{exit_statuses}\n\nexamples:\n{shown}"


def add_output_flags(
    parser: argparse.ArgumentParser, *, config_holds: str, verbose_logs: str
) -> None:
    """`--config`, `--log-json` and `-v`, with help that says what they do for this command:
    what its config file holds, and what `-v` adds to its log."""
    group = parser.add_argument_group("output and settings")
    add_setting(group, CONFIG, help=f"TOML file with {config_holds}", metavar="PATH")
    add_setting(group, LOG_JSON)
    add_setting(group, VERBOSE, short="-v", help=verbose_logs)


def add_secret_options(group: argparse._ArgumentGroup, *, serve: bool = False) -> None:
    add_secret_flags(group, serve=serve)
    add_setting(group, SECRET)
    add_setting(group, PEER_SECRET_FILE)


def add_signing_options(group: argparse._ArgumentGroup) -> None:
    add_setting(
        group,
        SIGNING,
        help=(
            "where our signatures go: X-Synapse-Signature header or body `signature` (default "
            "header)"
        ),
    )
    add_setting(group, RETRIES)


#: What `--config` holds, and what `-v` logs, for the commands that talk to partners …
PEER_CONFIG = "settings and [[peer]] tables"
PEER_VERBOSE = "log every transition and HTTP attempt"
#: … and for those that only read a store or print.
STORE_CONFIG = "settings (such as `store`)"
QUIET_VERBOSE = "log at debug level"


#: The command lines each command's `--help` ends with (tests/cli parses every one).
EXAMPLES: dict[str, list[str]] = {
    "serve": [
        "synapse serve --agent-id agent-e --port 8001 --secret-file synapse.secret \\\n"
        "                --peer agent-r=http://127.0.0.1:8002/synapse/callback",
        "synapse serve --config exec.toml --store agent-e.sqlite --handler my_agent:Agent",
        'synapse serve --agent-id agent-e --port 8080 --a2a --a2a-token "$TOKEN=alice"',
    ],
    "send": [
        "synapse send --target http://127.0.0.1:8001/synapse/callback --agent-id agent-e "
        "\\\n               --as agent-r --secret-file synapse.secret "
        "--listen 127.0.0.1:8002 \\\n"
        """               echo '{"text": "hi"}'""",
        "synapse send --config r.toml --field style=现代 \\\n"
        """               text_generation '{"prompt": "spring"}'""",
        """synapse send --config r.toml --deadline 10m --timeout 15m slow '{"steps": 5}'""",
    ],
    "outbox": [
        "synapse outbox --store agent-e.sqlite",
        "synapse outbox retry MESSAGE_ID --store agent-e.sqlite",
        "synapse outbox drop MESSAGE_ID --store agent-e.sqlite --json",
    ],
    "audit": [
        "synapse audit TASK_ID --store agent-r.sqlite",
        "synapse audit TASK_ID --store agent-r.sqlite --head DIGEST --export trail.jsonl",
    ],
    "schema": ["synapse schema task_request", "synapse schema --out schemas/"],
    "demo": ["synapse demo", "synapse demo --signing body"],
    "mcp": [
        "synapse mcp --as agent-r --listen 127.0.0.1:8002 --secret-file synapse.secret "
        "\\\n            --peer agent-e=http://127.0.0.1:8001/synapse/callback",
        "synapse mcp --a2a-agent http://127.0.0.1:8080",
    ],
    "caps": [
        "synapse caps --config r.toml",
        "synapse caps --config r.toml --task-type echo --json",
    ],
    "ping": ["synapse ping --config r.toml", "synapse ping --config r.toml --json"],
}
