"""The OpenAI-compatible HTTP API on a real loopback server, driven by the openai client and raw HTTP."""

import httpx
import openai
import pytest

from engine.factory import build_engine
from engine.server.api import create_app
from engine.server.local_server import serving_in_thread
from engine.server.service import EngineService
from seam import EngineConfig

TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def server(moe_models):
    service = EngineService(build_engine(moe_models, EngineConfig(draft_len=3)))
    with serving_in_thread(create_app(service, "governor-moe", TOKEN), service) as url:
        yield url, service


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused")


def test_openai_client_lists_the_model(client):
    assert [m.id for m in client.models.list().data] == ["governor-moe"]


def test_openai_client_completion_respects_max_tokens(client):
    reply = client.completions.create(model="governor-moe", prompt="def add(a, b):\n", max_tokens=12,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 12
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].text


def test_openai_client_streams_chat_chunks_that_add_up_to_the_whole_reply(client):
    kwargs = dict(model="governor-moe", messages=[{"role": "user", "content": "Write a loop"}], max_tokens=20,
                  temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole
    assert chunks[-1].usage.completion_tokens >= 1


def test_stop_string_ends_the_completion_before_the_stop_text(client):
    kwargs = dict(model="governor-moe", prompt="import os\nimport sys\nimport", max_tokens=40, temperature=0)
    unstopped = client.completions.create(**kwargs).choices[0].text
    stop = unstopped[12:15]
    reply = client.completions.create(**kwargs, stop=[stop])
    assert reply.choices[0].text == unstopped[:unstopped.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client):
    kwargs = dict(model="governor-moe", prompt="class Foo:\n", max_tokens=16, temperature=1.0, seed=42)
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


@pytest.mark.parametrize("body, field", [
    ({"prompt": "x", "temperature": 7}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ({"prompt": "", "max_tokens": 4}, "prompt"),
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "x", "n": 3}, "n"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "model": "gpt-4"}, "model"),
])
def test_malformed_completion_bodies_get_a_4xx_naming_the_field(server, body, field):
    httpx.get(f"{server[0]}/admin/window?reader=test")
    reply = httpx.post(f"{server[0]}/v1/completions", json={"model": "governor-moe", **body})
    assert 400 <= reply.status_code < 500
    assert reply.json()["error"]["param"] == field
    assert field in reply.json()["error"]["message"]
    assert httpx.get(f"{server[0]}/admin/window?reader=test").json()["steps"] == 0


def test_chat_with_an_unknown_role_is_refused(server):
    reply = httpx.post(f"{server[0]}/v1/chat/completions",
                       json={"model": "governor-moe", "messages": [{"role": "wizard", "content": "hi"}]})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "messages.0.role"


def test_invalid_json_is_refused(server):
    reply = httpx.post(f"{server[0]}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 400


def test_config_change_needs_the_admin_token(server):
    url = f"{server[0]}/admin/config"
    before = httpx.get(url).json()
    assert httpx.put(url, json={**before, "draft_len": 5}).status_code == 401
    assert httpx.put(url, json={**before, "draft_len": 5}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url).json() == before


@pytest.mark.parametrize(("change", "field"), [
    ({"draft_len": 99}, "draft_len"),
    ({"draft_len_schedule": [[4, 2], [2, 1]]}, "draft_len_schedule"),
    ({"draft_len_schedule": [[1, 2], [8, 17]]}, "draft_len_schedule.1.1"),
    ({"draft_len_schedule": [[1, 2, 3]]}, "draft_len_schedule.0"),
])
def test_invalid_config_is_refused_naming_the_field(server, change, field):
    url = f"{server[0]}/admin/config"
    before = httpx.get(url).json()
    reply = httpx.put(url, json={**before, **change}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field
    assert httpx.get(url).json() == before


def test_config_change_with_the_token_takes_effect(server):
    url = f"{server[0]}/admin/config"
    before = httpx.get(url).json()
    new = {**before, "version": before["version"] + 1, "spec_method": "ngram", "draft_len": 2,
           "draft_len_schedule": [[1, 6], [16, 2], [1024, 0]]}
    assert httpx.put(url, json=new, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    openai.OpenAI(base_url=f"{server[0]}/v1", api_key="x").completions.create(
        model="governor-moe", prompt="a = 1\nb = 2\n", max_tokens=4, temperature=0)
    assert httpx.get(url).json() == new
    httpx.put(url, json=before, headers={"Authorization": f"Bearer {TOKEN}"})
