"""One payload per period shared by every open event stream: however many dashboards are open, the state is built
once per second (in a worker thread), and at most max_clients streams are served at once."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from seam import strict_json


class Broadcast:
    def __init__(self, build: Callable[[], dict], max_clients: int, period_seconds: float = 1.0):
        self.build, self.max_clients, self.period_seconds = build, max_clients, period_seconds
        self._clients: set[asyncio.Queue] = set()
        self._task: asyncio.Task | None = None

    @property
    def full(self) -> bool:
        return len(self._clients) >= self.max_clients

    async def events(self) -> AsyncIterator[str]:
        """Each new event from now on; an unread one is replaced by the next. Check `full` before streaming."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=1)
        self._clients.add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            while True:
                yield await queue.get()
        finally:
            self._clients.discard(queue)

    async def _run(self) -> None:
        while self._clients:
            event = f"data: {strict_json.dumps(await asyncio.to_thread(self.build))}\n\n"
            for queue in list(self._clients):
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait(event)
            await asyncio.sleep(self.period_seconds)
