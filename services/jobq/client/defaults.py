"""The clients an app's typed tasks publish with, unless given one.

``task.publish(...)`` uses the client given to ``app.use(...)``, else one
opened on first use from the app's settings: one per event loop for async
code, one per process for ``publish_sync`` (the SyncClient is fork-safe).
Those it opened it closes in ``app.close()`` / ``await app.aclose()``; the
ones given to ``use`` are their owner's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jobq.client.producer import Client
from jobq.client.sync import SyncClient
from jobq.settings import Settings


class Clients:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings
        self._sync: Any = None  # SyncClient, or test mode's stand-in (jobq.testing)
        self._async: dict[Any, Any] = {}  # event loop (None: any) -> Client
        self._given: list[Any] = []  # clients given to use(): theirs to close

    def use(self, client: Client | SyncClient) -> None:
        """Tasks publish with ``client`` (its owner connects and closes it)."""
        if isinstance(client, SyncClient):
            self._sync = client
        else:
            self._async[None] = client  # any loop: the owner's
        self._given.append(client)

    def stand_in(self, async_like: Any, sync_like: Any) -> None:
        """Publish into these instead (jobq.testing's in-memory client)."""
        self._async = {None: async_like}
        self._sync = sync_like

    async def async_client(self) -> Client:
        """The client ``task.publish`` uses: given to ``use``, else one per
        event loop, opened on first use."""
        if None in self._async:
            given: Client = self._async[None]
            return given
        loop = asyncio.get_running_loop()
        client: Client | None = self._async.get(loop)
        if client is None:
            client = self._async[loop] = Client(self.settings)
            try:
                await client.connect()
            except BaseException:
                del self._async[loop]
                raise
        return client

    def sync_client(self) -> SyncClient:
        """The client ``task.publish_sync`` uses (one per process, fork-safe)."""
        if self._sync is None:
            self._sync = SyncClient(self.settings)
        sync: SyncClient = self._sync
        return sync

    async def aclose(self) -> None:
        """Close the clients opened here (not those given to use())."""
        client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None and client not in self._given:
            await client.close()
        self.close()

    def close(self) -> None:
        if self._sync is not None and self._sync not in self._given:
            self._sync.close()
            self._sync = None
