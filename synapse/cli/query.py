"""`synapse caps` (capability_query) and `synapse ping` (heartbeat): one exchange, one answer."""

from __future__ import annotations

from typing import TextIO

from synapse.cli.client import ClientSetup, exchange_error, start_peer, to_json
from synapse.cli.errors import Exit
from synapse.runtime.sender import DeliveryError
from synapse.types import CapabilityResponsePayload, RemoteProtocolError


async def run_caps(setup: ClientSetup, out: TextIO, *, task_type: str | None, as_json: bool) -> int:
    peer = setup.peer(serve=False)
    await start_peer(peer, None)
    try:
        payload = await peer.capabilities(setup.target.agent_id, task_type)
    except (RemoteProtocolError, DeliveryError) as exc:
        raise exchange_error(exc, setup) from exc
    finally:
        await peer.close(0)
    out.write((to_json(payload) if as_json else capability_table(payload)) + "\n")
    return Exit.OK


def capability_table(payload: CapabilityResponsePayload) -> str:
    """The capabilities as an aligned table a person can read."""
    rows = [("NAME", "VERSION", "DESCRIPTION")] + [
        (c.name, c.version or "-", c.description or "") for c in payload.capabilities
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip() for row in rows]
    if not payload.capabilities:
        lines.append("(no capability matches)")
    lines.append(
        f"{payload.agent_id}: {len(payload.capabilities)} capabilities, "
        f"at most {payload.max_concurrent_tasks} tasks at once"
    )
    return "\n".join(lines)


async def run_ping(setup: ClientSetup, out: TextIO, *, as_json: bool) -> int:
    peer = setup.peer(serve=False)
    await start_peer(peer, None)
    try:
        payload, elapsed = await peer.ping(setup.target.agent_id)
    except (RemoteProtocolError, DeliveryError) as exc:
        raise exchange_error(exc, setup) from exc
    finally:
        await peer.close(0)
    ms = round(elapsed * 1000, 3)
    if as_json:
        out.write(
            to_json(
                {
                    "agent_id": setup.target.agent_id,
                    "status": payload.status,
                    "active_tasks": payload.active_tasks,
                    "rtt_ms": ms,
                }
            )
            + "\n"
        )
    else:
        out.write(
            f"{setup.target.agent_id}: {payload.status.value}, {payload.active_tasks} active "
            f"tasks with us, round trip {ms:.1f} ms\n"
        )
    return Exit.OK


__all__ = ["capability_table", "run_caps", "run_ping"]
