"""Per-partner secrets: sharing one refused unless allowed, secrets from files and the
environment instead of the command line (in-process settings, and a real `serve`)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from synapse.cli.errors import CliError
from synapse.cli.main import build_parser
from synapse.cli.security_settings import secrets_on_command_line
from synapse.cli.settings import Settings
from synapse.demo.handler import DemoHandler
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.transport.peer import Peer


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return Settings.load(build_parser().parse_args(argv), env or {})


def test_registry_names_who_shares_a_secret_never_the_secret() -> None:
    registry = PartnerRegistry(
        [
            Partner("a", "http://a.example/cb", ("s-new", "shared-old")),
            Partner("b", "http://b.example/cb", ("shared-old",)),
            Partner("c", "http://c.example/cb", ("s-c",)),
        ]
    )
    assert registry.shared_secrets() == [("a", "b")]
    with pytest.raises(ValueError, match=r"partners share a secret \(a, b\)") as caught:
        registry.check_distinct_secrets()
    assert "shared-old" not in str(caught.value)
    registry.check_distinct_secrets(allow_shared=True)
    assert PartnerRegistry([Partner("x", "http://x/", ("1",))]).shared_secrets() == []


async def test_a_peer_refuses_to_start_with_a_shared_secret() -> None:
    partners = [Partner("a", "http://a.example/cb", ("s",)), Partner("b", "http://b/cb", ("s",))]
    peer = Peer("me", handler=DemoHandler(), partners=partners)
    with pytest.raises(ValueError, match="share a secret"):
        await peer.start()
    allowed = Peer("me", handler=DemoHandler(), partners=partners, allow_shared_secrets=True)
    async with allowed:
        assert len(allowed.partners) == 2


async def test_add_partner_refuses_a_secret_another_partner_has() -> None:
    async with Peer("me", handler=DemoHandler()) as peer:
        peer.add_partner("a", "http://a.example/cb", ("s",))
        with pytest.raises(ValueError, match="share a secret"):
            peer.add_partner("b", "http://b.example/cb", ("s",))
        assert "b" not in peer.partners
        # Replacing a partner's own secret is not sharing.
        peer.add_partner("a", "http://a.example/cb", ("s2", "s"))


def test_one_default_secret_for_two_partners_is_refused_unless_allowed() -> None:
    argv = ["serve", "--secret", "k" * 32, "--peer", "a=http://a/", "--peer", "b=http://b/"]
    with pytest.raises(CliError, match=r"partners share a secret \(a, b\).*allow-shared-secret"):
        settings(argv).partners()
    assert len(settings([*argv, "--allow-shared-secret"]).partners()) == 2
    assert len(settings(argv, {"SYNAPSE_ALLOW_SHARED_SECRET": "1"}).partners()) == 2
    # One partner with the default secret is not sharing it.
    assert settings(["serve", "--secret", "k" * 32, "--peer", "a=http://a/"]).partners()[0].secrets


def test_secrets_from_files_and_environment_variables(tmp_path: Path) -> None:
    (tmp_path / "default.secret").write_text("\n  from-file  \n")
    config = tmp_path / "c.toml"
    config.write_text(
        textwrap.dedent(
            """
            secret_file = "default.secret"
            allow_shared_secret = false
            [[peer]]
            agent_id = "a"
            endpoint = "http://a.example/cb"
            secret_env = "A_SECRETS"
            [[peer]]
            agent_id = "b"
            endpoint = "http://b.example/cb"
            [[peer]]
            agent_id = "c"
            endpoint = "http://c.example/cb"
            """
        )
    )
    env = {"A_SECRETS": "a-new, a-old", "C_SECRET": "c-only"}
    argv = ["serve", "--config", str(config), "--peer-secret-env", "c=C_SECRET"]
    argv += ["--allow-weak-secret"]  # short secrets: where each comes from is the point
    partners = {p.agent_id: p.secrets for p in settings(argv, env).partners()}
    assert partners == {"a": ("a-new", "a-old"), "b": ("from-file",), "c": ("c-only",)}
    # --secret-file on the command line (a path, not the secret) and from the environment.
    (tmp_path / "other").write_text("other-secret\n")
    other = str(tmp_path / "other")
    s = settings(["serve", "--secret-file", other, "--peer", "b=http://b/", "--allow-weak-secret"])
    assert s.partners()[0].secrets == ("other-secret",)
    s = settings(
        ["serve", "--peer", "b=http://b/", "--allow-weak-secret"],
        {"SYNAPSE_SECRET_FILE": str(tmp_path / "other")},
    )
    assert s.partners()[0].secrets == ("other-secret",)
    with pytest.raises(CliError, match=r"A_SECRETS .* is empty"):
        settings(argv, {"C_SECRET": "c"}).partners()
    with pytest.raises(CliError, match="cannot read secret file"):
        settings(["serve", "--secret-file", str(tmp_path / "nope")]).default_secret()


def test_serve_refuses_a_shared_secret_at_start() -> None:
    """A real `synapse serve`: the refusal is one line and exit 2, before it listens."""
    argv = [sys.executable, "-m", "synapse.cli.main", "serve", "--agent-id", "e", "--port", "0"]
    argv += ["--peer", "a=http://127.0.0.1:1/x"]
    argv += ["--peer", "b=http://127.0.0.1:2/x"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNAPSE_")}
    env["SYNAPSE_SECRET"] = "the-one-secret-0123456789abcdefgh"
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("synapse: partners share a secret (a, b)")
    assert "the-one-secret-0123456789abcdefgh" not in result.stderr
    assert "listening" not in result.stderr


def test_secrets_given_as_flags_are_named_for_the_warning() -> None:
    args = build_parser().parse_args(["serve", "--secret", "k" * 32, "--a2a-token", "t=alice"])
    assert secrets_on_command_line(args) == ["--secret", "--a2a-token"]
    args = build_parser().parse_args(["serve", "--secret-file", "/run/secrets/k"])
    assert secrets_on_command_line(args) == []


@pytest.mark.parametrize(
    ("secret", "allowed", "refused", "warned"),
    [
        ("S", False, True, False),
        ("0123456789abcde", False, True, False),  # 15 bytes
        ("S", True, False, True),  # accepted knowingly, still warned of
        ("0123456789abcdef", False, False, True),  # 16: accepted, under 32 warned of
        ("秘" * 6, False, False, True),  # 18 bytes in UTF-8: bytes count, not characters
        ("0123456789abcdef0123456789abcdef", False, False, False),
    ],
)
def test_a_weak_secret_is_refused_or_warned_of(
    secret: str, allowed: bool, refused: bool, warned: bool
) -> None:
    argv = ["serve", "--secret", secret, "--peer", "a=http://a/"]
    argv += ["--allow-weak-secret"] if allowed else []
    s = settings(argv)
    s.warnings = io.StringIO()
    if refused:
        with pytest.raises(CliError, match=r"needs at least 16 .*--allow-weak-secret"):
            s.partners()
        return
    assert s.partners()[0].secrets == (secret,)
    said = s.warnings.getvalue()
    assert ("under the 32 recommended" in said) is warned, said
    assert len(secret) < 4 or secret not in said  # a warning never shows the secret


def test_every_secret_of_a_rotation_counts() -> None:
    """An old secret still verifies: a weak one among strong ones is refused too."""
    env = {"A_SECRETS": "0123456789abcdef0123456789abcdef, old"}
    argv = ["serve", "--peer", "a=http://a/", "--peer-secret-env", "a=A_SECRETS"]
    with pytest.raises(CliError, match="is 3 bytes long"):
        settings(argv, env).partners()
