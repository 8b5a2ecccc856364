"""The dashboard's event streams: one payload per period shared by every open stream, and a cap on open streams
(the next one gets 429 in the OpenAI error shape, counted on /metrics), on a real loopback server."""
import asyncio
import json

import httpx

from dashboards.broadcast import Broadcast
from dashboards.operator_page import create_dashboard_router
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from engine.telemetry.live import LiveTelemetry
from seam import EngineConfig
from tests.engine.helpers import make_engine


def test_every_open_stream_gets_the_same_payload_built_once_per_period():
    builds = []

    def build() -> dict:
        builds.append(len(builds))
        return {"build": builds[-1]}

    async def read_three(broadcast: Broadcast) -> list[dict]:
        events, stream = [], broadcast.events()
        async for event in stream:
            events.append(json.loads(event.removeprefix("data: ")))
            if len(events) == 3:
                await stream.aclose()
                return events

    async def scenario():
        broadcast = Broadcast(build, max_clients=4, period_seconds=0.05)
        return await asyncio.gather(*(read_three(broadcast) for _ in range(4)))

    seen = asyncio.run(scenario())
    assert all(events == seen[0] for events in seen)
    assert len(builds) <= 4                 # one build per period for all four streams, not one per stream


def test_streams_past_the_cap_get_429(moe_models):
    service = EngineService(make_engine(moe_models, EngineConfig(draft_len=2)))
    refused = []
    app = create_app(service, "governor-moe", "token")
    app.include_router(create_dashboard_router(LiveTelemetry(), lambda: service.engine.config, max_clients=2,
                                               on_refuse=lambda: refused.append(1)))

    async def scenario(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream("GET", "/dashboard/stream") as first, \
                    client.stream("GET", "/dashboard/stream") as second:
                lines = [first.aiter_lines(), second.aiter_lines()]     # held: a dropped iterator closes its stream
                for stream_lines in lines:
                    assert (await anext(stream_lines)).startswith("data: {")
                async with client.stream("GET", "/dashboard/stream") as third:
                    refused = third.status_code, third.headers.get("retry-after"), json.loads(await third.aread())
            return refused, await client.get("/dashboard/state")

    with serving_in_thread(app, service) as url:
        (status, retry_after, body), state = asyncio.run(asyncio.wait_for(scenario(url), 60))
    assert status == 429 and retry_after
    assert body["error"]["code"] == "sse_clients" and refused == [1]
    assert state.status_code == 200
