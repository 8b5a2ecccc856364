"""A non-streaming request whose client disconnects is cancelled, so its KV blocks go back to the pool at once
instead of after max_tokens of generation nobody will read."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import Request
from fastapi.responses import Response

from engine.server.service import Submission


async def whole_unless_abandoned(request: Request, whole: Awaitable, submission: Submission):
    """The whole reply; if the client disconnects first, the request is cancelled and its KV blocks freed."""
    answer, gone = asyncio.ensure_future(whole), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        abandoned = not answer.done()
        if abandoned:
            answer.cancel()
            submission.cancel()
    return Response(status_code=499) if abandoned else answer.result()      # 499: nobody is left to read it


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
