"""Deliberately broken peers, each our own `Peer` with one realistic fault, for the kit to catch.

Each is the demo peer with a `SynapseServer` subclass (or a partner / sender swapped) in place:

| peer | fault |
| --- | --- |
| `NoSignatureCheckPeer` | verifies no request signature (yet signs its own messages) |
| `Bare500Peer` | answers a body that is not JSON with a bare HTTP 500 |
| `CompleteAfterCancelPeer` | sends `task_complete` after it acknowledged a cancel |
| `ReplayTwicePeer` | no deduplication: a replayed `task_request` runs the task again |
| `WrongCallbackSecretPeer` | signs its callbacks with a secret the kit does not share |
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from aiohttp import web

from synapse.conformance import Report
from synapse.demo.handler import DemoHandler
from synapse.p2p.dedup import Begin, DedupKey, StoredReply
from synapse.p2p.engine import TaskKey
from synapse.runtime.aio import MemoryDedupStore
from synapse.store.memory import MemoryStore
from synapse.transport.client import HttpClient
from synapse.transport.inbound import Inbound
from synapse.transport.partners import Partner, PartnerRegistry
from synapse.transport.peer import HttpSender, Peer
from synapse.transport.server import SynapseServer
from synapse.types import (
    MessageType,
    SynapseError,
    TaskComplete,
    TaskCompletePayload,
    TaskRequest,
    TaskResult,
    build_message_now,
    decode_typed,
)

#: `await run_kit(peer_class, only=...)` (the `run_kit` fixture): the kit's report on a target.
RunKit = Callable[..., Coroutine[Any, Any, Report]]

TARGET_ID = "agent-under-test"
KIT_ID = "synapse-conformance"
SECRET = "conformance-tests-secret-0123456"


class DemoPeer(Peer):
    """The demo peer, with a hook to put another server class in place."""

    server_class: ClassVar[type[SynapseServer]] = SynapseServer

    def __init__(self, **kw: Any) -> None:
        super().__init__(TARGET_ID, handler=DemoHandler(), **kw)

    def register_kit(self, url: str) -> None:
        self.add_partner(KIT_ID, url, (SECRET,))

    def _build(self, endpoint: str) -> None:
        super()._build(endpoint)
        if self.server_class is not SynapseServer:
            built = self.server
            server = self.server_class(
                built.protocol, built.partners, dedup=built.dedup, rate_limit=built.rate_limit
            )
            server.client = self.client  # type: ignore[attr-defined]
            self._server = server


# --- 1. verifies no signature ---------------------------------------------------------------


@dataclass(frozen=True)
class _SignOnlyPartner(Partner):
    """A partner with no secret to verify its requests with, yet one to sign ours with."""

    signer: str = ""

    @property
    def signing_secret(self) -> str:
        return self.signer


class NoSignatureCheckPeer(DemoPeer):
    def register_kit(self, url: str) -> None:
        self.partners.add(_SignOnlyPartner(KIT_ID, url, (), signer=SECRET))


# --- 2. bare 500 on bad JSON ----------------------------------------------------------------


class _NotJson(Exception):
    pass


class Bare500Server(SynapseServer):
    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._handle(request)
        except _NotJson:
            return web.Response(status=500, text="Internal Server Error")

    async def _read_body(self, request: web.Request) -> bytes | SynapseError:
        body = await super()._read_body(request)
        if isinstance(body, bytes):
            try:
                json.loads(body)
            except ValueError as exc:
                raise _NotJson from exc
        return body


class Bare500Peer(DemoPeer):
    server_class = Bare500Server


# --- 3. task_complete after a cancel --------------------------------------------------------


class CompleteAfterCancelServer(SynapseServer):
    client: HttpClient
    late: set[asyncio.Task[Any]]

    async def _process(self, inbound: Inbound) -> StoredReply:
        reply = await super()._process(inbound)
        if inbound.head.type is MessageType.TASK_CANCEL and reply.status == 200:
            message = decode_typed(inbound.body)
            task_id = getattr(message.payload, "task_id", "")
            if not hasattr(self, "late"):
                self.late = set()
            task = asyncio.create_task(self._complete_anyway(inbound.partner, task_id))
            self.late.add(task)
            task.add_done_callback(self.late.discard)
        return reply

    async def _complete_anyway(self, partner: Partner, task_id: str) -> None:
        # Until the kit answers 409: it has read the cancel's task_ack and judged the
        # task_complete late (one sent before it read the ack is an honest race it accepts).
        for _ in range(250):
            complete = build_message_now(
                TaskComplete,
                TaskCompletePayload(
                    task_id=task_id, result=TaskResult(output_type="text", output="done anyway")
                ),
                sender=self.protocol.agent_endpoint(),
                to=partner.agent_id,
            )
            try:
                reply = await self.client.exchange(partner, complete, retries=0)
            except Exception:  # a broken peer does not care
                return
            if reply.status == 409:
                return
            await asyncio.sleep(0.02)  # polling the kit's verdict, bounded


class CompleteAfterCancelPeer(DemoPeer):
    server_class = CompleteAfterCancelServer


# --- 4. runs a replayed request again -------------------------------------------------------


class ForgetfulDedup(MemoryDedupStore):
    """A deduplication table that forgets each message as soon as it is asked about it."""

    def __init__(self) -> None:
        super().__init__(window=600.0)

    def begin(
        self, key: DedupKey, fingerprint: bytes, *, now: datetime, timestamp: datetime
    ) -> Begin:
        self.forget(key)
        return super().begin(key, fingerprint, now=now, timestamp=timestamp)


class ReplayTwiceServer(SynapseServer):
    async def _process(self, inbound: Inbound) -> StoredReply:
        try:
            message = decode_typed(inbound.body)
        except SynapseError:
            return await super()._process(inbound)  # refused there, as it should be
        if isinstance(message, TaskRequest):
            key = TaskKey(inbound.head.from_.agent_id, message.payload.task.id)
            engine = self.protocol.engine
            rec = engine.get(key)
            if rec is not None and rec.request_id == inbound.head.id:
                # The same request again: once the first run is over, run it anew.
                for _ in range(500):
                    if rec.is_final:
                        break
                    await asyncio.sleep(0.01)
                engine.tasks.pop(key, None)
                store = self.protocol.store
                if isinstance(store, MemoryStore):
                    store.forget_finished(key)  # finished tasks are kept there
        return await super()._process(inbound)


class ReplayTwicePeer(DemoPeer):
    server_class = ReplayTwiceServer

    def __init__(self, **kw: Any) -> None:
        super().__init__(dedup=ForgetfulDedup(), **kw)


# --- 5. callbacks signed with the wrong secret ----------------------------------------------


class WrongCallbackSecretPeer(DemoPeer):
    def register_kit(self, url: str) -> None:
        super().register_kit(url)
        wrong = PartnerRegistry([Partner(KIT_ID, url, ("not-the-shared-secret",))])
        self.protocol.set_callback_sender(HttpSender(self.client, wrong))


BROKEN_PEERS: dict[str, type[DemoPeer]] = {
    "no_signature_check": NoSignatureCheckPeer,
    "bare_500": Bare500Peer,
    "complete_after_cancel": CompleteAfterCancelPeer,
    "replay_twice": ReplayTwicePeer,
    "wrong_callback_secret": WrongCallbackSecretPeer,
}
