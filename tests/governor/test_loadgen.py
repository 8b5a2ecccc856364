import argparse
import asyncio
import json
import math
import socket
import statistics
import threading
import time

import pytest
import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from governor.load_cli import add_load_arguments, phases_from_args, run_load
from governor.loadgen import arrivals
from governor.loadgen.phases import DEMO_FILE, Phase, PhaseFileError, load_phases
from governor.loadgen.prompts import prompt_set
from governor.loadgen.runner import LoadError, run_forever, run_phases

CHUNK_DELAY_S = 0.05
TOKENS_PER_CHUNK = 2


# arrivals


def test_poisson_mean_rate_matches_qps():
    offsets = arrivals.poisson(qps=50, duration_s=2000, seed=1)
    assert len(offsets) / 2000 == pytest.approx(50, rel=0.02)


def test_poisson_gaps_are_exponential():
    offsets = arrivals.poisson(qps=10, duration_s=2000, seed=2)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)


def test_arrivals_are_sorted_and_inside_the_phase():
    for kind in arrivals.KINDS:
        offsets = arrivals.offsets(kind, qps=7, duration_s=30, seed=3, burst_size=5)
        assert offsets == sorted(offsets)
        assert all(0 <= t < 30 for t in offsets)


def test_arrivals_are_deterministic_for_a_seed():
    assert arrivals.poisson(5, 100, seed=7) == arrivals.poisson(5, 100, seed=7)
    assert arrivals.burst(5, 100, seed=7, size=4) == arrivals.burst(5, 100, seed=7, size=4)
    assert arrivals.poisson(5, 100, seed=7) != arrivals.poisson(5, 100, seed=8)


def test_burst_sends_groups_of_the_burst_size_at_one_instant():
    offsets = arrivals.burst(qps=4, duration_s=500, seed=4, size=6)
    groups = {}
    for t in offsets:
        groups[t] = groups.get(t, 0) + 1
    assert set(groups.values()) == {6}
    assert len(offsets) / 500 == pytest.approx(4, rel=0.1)


def test_constant_spaces_requests_evenly():
    assert arrivals.constant(qps=4, duration_s=1) == [0.0, 0.25, 0.5, 0.75]


def test_arrivals_refuse_a_non_positive_rate():
    with pytest.raises(ValueError, match="qps"):
        arrivals.poisson(qps=0, duration_s=10)


# prompts


@pytest.mark.parametrize("kind", ["code", "prose", "chat"])
def test_prompts_respect_the_byte_limit(kind):
    prompts = prompt_set(kind, 50, seed=1, max_bytes=120)
    assert len(prompts) == 50
    assert all(0 < p.size_bytes <= 120 for p in prompts)


@pytest.mark.parametrize("kind", ["code", "prose", "chat"])
def test_prompts_are_deterministic_for_a_seed(kind):
    assert prompt_set(kind, 10, seed=5) == prompt_set(kind, 10, seed=5)
    assert prompt_set(kind, 10, seed=5) != prompt_set(kind, 10, seed=6)


def test_code_prompts_start_at_a_definition_and_end_at_a_line_boundary():
    for p in prompt_set("code", 30, seed=2):
        assert p.text.split()[0] in ("def", "class", "async")
        assert p.text.endswith("\n")
        assert p.endpoint == "/v1/completions"


def test_prose_prompts_are_plain_sentences():
    for p in prompt_set("prose", 30, seed=3):
        assert p.text[0].isupper()
        assert "\n" not in p.text and "::=" not in p.text and "*" not in p.text


def test_chat_prompts_are_user_messages_for_the_chat_endpoint():
    p = prompt_set("chat", 1, seed=4)[0]
    assert p.endpoint == "/v1/chat/completions"
    assert p.body()["messages"][0]["role"] == "user"
    assert len(p.body()["messages"][0]["content"]) > 40


def test_unknown_prompt_kind_is_refused():
    with pytest.raises(ValueError, match="code, prose, chat"):
        prompt_set("poetry", 1)


# phases


def test_shipped_demo_file_loads():
    phases = load_phases(DEMO_FILE)
    assert {p.prompts for p in phases} == {"code", "prose", "chat"}
    assert {p.temperature for p in phases} >= {0.0, 1.0}


def test_phase_file_defaults_optional_fields(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("phases:\n  - {name: a, duration_s: 5, qps: 1, prompts: prose, temperature: 1.0}\n")
    (phase,) = load_phases(path)
    assert (phase.arrival, phase.max_tokens, phase.top_p) == ("poisson", 64, 1.0)


def test_bad_value_error_names_file_field_and_allowed_values(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("phases:\n  - {name: a, duration_s: 5, qps: 1, arrival: posson}\n")
    with pytest.raises(PhaseFileError) as e:
        load_phases(path)
    assert str(path) in str(e.value)
    assert "phases[0].arrival" in str(e.value)
    assert "'poisson', 'burst' or 'constant'" in str(e.value)


def test_unknown_field_error_names_it_and_lists_allowed_fields(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("phases:\n  - {name: a, duration_s: 5, qps: 1, temprature: 1}\n")
    with pytest.raises(PhaseFileError, match=r"phases\[0\]\.temprature: unknown field; allowed fields: .*temperature"):
        load_phases(path)


def test_missing_field_error_names_it(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("phases:\n  - {name: a, duration_s: 5}\n")
    with pytest.raises(PhaseFileError, match=r"phases\[0\]\.qps: required"):
        load_phases(path)


def test_invalid_yaml_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("phases: [\n")
    with pytest.raises(PhaseFileError, match="broken.yaml: not valid YAML"):
        load_phases(path)


# a real server on a loopback port, streaming like an OpenAI server


def fake_openai_app() -> FastAPI:
    app = FastAPI()
    app.state.active = 0
    app.state.most_active = 0

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "fake-with-usage"}, {"id": "fake-no-usage"}]}

    @app.post("/v1/completions")
    async def completions(body: dict = Body(...)):
        return respond(body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: dict = Body(...)):
        return respond(body, chat=True)

    def respond(body: dict, chat: bool):
        if body["max_tokens"] > 100:
            return JSONResponse({"error": {"message": "max_tokens must be <= 100"}}, status_code=400)
        usage = body["model"] == "fake-with-usage" and body.get("stream_options", {}).get("include_usage")
        return StreamingResponse(events(body["max_tokens"], chat, usage), media_type="text/event-stream")

    async def events(tokens: int, chat: bool, usage: bool):
        app.state.active += 1
        app.state.most_active = max(app.state.most_active, app.state.active)
        try:
            if chat:
                yield sse({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            chunks = math.ceil(tokens / TOKENS_PER_CHUNK)
            for i in range(chunks):
                await asyncio.sleep(CHUNK_DELAY_S)
                text = "ab"
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                choice["finish_reason"] = "length" if i == chunks - 1 else None
                yield sse({"choices": [choice]})
            if usage:
                yield sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
            yield "data: [DONE]\n\n"
        finally:
            app.state.active -= 1

    return app


def sse(event: dict) -> str:
    return f"data: {json.dumps(event)}\n\n"


@pytest.fixture(scope="module")
def server():
    app = fake_openai_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    uv.should_exit = True
    thread.join(5)


def phase(**fields) -> Phase:
    return Phase(**{"name": "p", "duration_s": 0.3, "qps": 10, "arrival": "constant", "max_tokens": 6, **fields})


def run(url, phases, **options):
    return asyncio.run(run_phases(url, phases, progress=False, **options))


def test_records_time_the_stream(server):
    url, _ = server
    result = run(url, [phase()])
    assert result.model == "fake-with-usage"
    assert len(result.records) == 3
    for r in result.records:
        assert r.ok and r.status == 200 and r.finish_reason == "length"
        assert 0 < r.ttft_s <= r.e2e_s
        assert len(r.itl_s) == 2 and all(gap > 0 for gap in r.itl_s)


def test_token_count_comes_from_usage_when_the_server_sends_it(server):
    url, _ = server
    result = run(url, [phase(max_tokens=6)])
    assert [r.output_tokens for r in result.records] == [6, 6, 6]


def test_token_count_falls_back_to_content_chunks(server):
    url, _ = server
    result = run(url, [phase(max_tokens=6, prompts="chat")], model="fake-no-usage")
    assert [r.output_tokens for r in result.records] == [3, 3, 3]


def test_open_loop_sends_on_schedule_while_earlier_requests_are_in_flight(server):
    url, app = server
    app.state.most_active = 0
    slow = phase(qps=10, duration_s=0.5, max_tokens=20)  # 10 chunks: about 0.5 s per request
    result = run(url, [slow])
    sent = [r.sent_s for r in result.records]
    ended = [r.sent_s + r.e2e_s for r in result.records]
    assert len(sent) == 5
    assert all(abs(r.sent_s - r.arrival_s) < 0.1 for r in result.records)
    assert all(sent[i + 1] < ended[i] for i in range(4))
    assert app.state.most_active >= 3


def test_phases_follow_each_other_on_the_clock(server):
    url, _ = server
    result = run(url, [phase(name="a", qps=5, duration_s=0.4), phase(name="b", qps=5, duration_s=0.4, prompts="prose")])
    b = [r for r in result.records if r.phase == "b"]
    assert [r.arrival_s for r in b] == pytest.approx([0.4, 0.6])
    assert {r.kind for r in b} == {"prose"}


def test_http_errors_are_recorded_with_status_and_message(server):
    url, _ = server
    result = run(url, [phase(max_tokens=500)])
    assert {r.status for r in result.records} == {400}
    assert all("max_tokens must be <= 100" in r.error for r in result.records)
    assert result.phases[0].errors == 3 and result.phases[0].completed == 0


def test_concurrency_cap_drops_and_counts_arrivals(server):
    url, _ = server
    result = run(url, [phase(qps=10, duration_s=0.3, max_tokens=20)], max_concurrency=1)
    summary = result.phases[0]
    assert (summary.requests, summary.completed, summary.dropped) == (3, 1, 2)


def test_drain_timeout_cancels_requests_still_in_flight(server):
    url, _ = server
    result = run(url, [phase(qps=10, duration_s=0.1, max_tokens=40)], drain_timeout_s=0.2)
    (record,) = result.records
    assert record.error.startswith("cancelled")


def test_summary_reports_rates_and_percentiles(server):
    url, _ = server
    summary = run(url, [phase(qps=10, duration_s=0.5)]).phases[0]
    assert summary.completed == 5 and summary.output_tokens == 30
    assert summary.tokens_per_s > 0
    assert summary.ttft_s["p50"] <= summary.ttft_s["p99"] <= summary.e2e_s["p99"]


def test_result_is_written_as_json(server, tmp_path):
    url, _ = server
    path = tmp_path / "out.json"
    run(url, [phase()]).write_json(path)
    data = json.loads(path.read_text())
    assert data["phases"][0]["name"] == "p"
    assert len(data["records"]) == 3 and data["records"][0]["ttft_s"] > 0


def test_unreachable_server_is_a_load_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(LoadError, match="cannot list models"):
        run(f"http://127.0.0.1:{port}", [phase()])


def test_run_forever_repeats_phases_until_stopped(server):
    url, _ = server
    stop, cycles = threading.Event(), []
    thread = threading.Thread(
        target=run_forever, args=(url, [phase(duration_s=0.2, qps=10)], stop), kwargs={"on_cycle": cycles.append}
    )
    thread.start()
    deadline = time.monotonic() + 10
    while len(cycles) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert len(cycles) >= 2
    assert all(r.ok for r in cycles[0].records)


# CLI


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="governor load")
    add_load_arguments(parser)
    return parser.parse_args(argv)


def test_cli_without_phase_flags_runs_the_demo_file():
    assert phases_from_args(parse()) == load_phases(DEMO_FILE)


def test_cli_quick_flags_make_one_phase():
    (p,) = phases_from_args(parse("--qps", "3", "--prompts", "chat", "--temperature", "0.5"))
    assert (p.qps, p.prompts, p.temperature, p.duration_s) == (3.0, "chat", 0.5, 30.0)


def test_cli_rejects_a_non_positive_rate(capsys):
    with pytest.raises(SystemExit):
        parse("--qps", "-1")
    assert "--qps: must be > 0" in capsys.readouterr().err


def test_cli_out_of_range_flag_names_the_flag():
    with pytest.raises(PhaseFileError, match="--temperature: Input should be less than or equal to 2"):
        phases_from_args(parse("--temperature", "5"))


def test_cli_refuses_phase_file_together_with_quick_flags():
    with pytest.raises(PhaseFileError, match="exclude each other"):
        phases_from_args(parse("--phases", str(DEMO_FILE), "--qps", "2"))


def test_cli_run_writes_results_and_prints_a_summary(server, tmp_path, capsys):
    url, _ = server
    out = tmp_path / "r.json"
    args = parse("--url", url, "--qps", "10", "--duration", "0.3", "--arrival", "constant", "--max-tokens", "4",
                 "--out", str(out))
    assert run_load(args) == 0
    captured = capsys.readouterr()
    assert "flags" in captured.out and "tok/s" in captured.out
    assert "load finished" in captured.err
    assert len(json.loads(out.read_text())["records"]) == 3
