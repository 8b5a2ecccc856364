"""Fleet canaries on two real engine replicas, each behind its own loopback HTTP server: a candidate whose steps are
slowed by 20 % (a test-only fault; the product ships no such knob) runs on the canary replica alone, is judged
worse against the other replica over the same checks, and reverted; the other replica never leaves the incumbent.

One thread steps both replicas in turn under the same closed-loop load, so that the load of the shared test machine
falls on both alike (separate replicas on separate machines do not share it; two engine threads on 2 shared cores
would take it in turns)."""
import contextlib
import itertools
import threading
import time

import uvicorn

from controller.clients import HttpClient
from controller.loop import Controller
from controller.store import Decision, Store, Trial
from controller.trials.canary import FleetCanary
from engine.server.api import create_app
from engine.server.local_server import free_port
from engine.server.service import EngineService
from policies import parse_policy
from seam import EngineConfig, Experiment, SamplingParams
from tests.controller.conftest import fast_policy
from tests.controller.server import TOKEN
from tests.controller.strategies import OneTrial
from tests.engine.helpers import code_prompts, make_engine

LONG = SamplingParams(max_tokens=192, temperature=0.0, ignore_eos=True)    # few prefills: less noise per check
SLOWDOWN = 0.25     # each step of the candidate takes a quarter longer: 20 % fewer tokens per busy second


def _slow_unless(engine, baseline_version: int) -> None:
    """Every step of any config but the baseline spends SLOWDOWN more of its own time, inside the step's timing (its
    drafts and target forward run, then it waits before verifying)."""
    draft, verify, began = engine._draft, engine._verify, [time.perf_counter()]

    def timed_draft(*args, **kwargs):
        began[0] = time.perf_counter()
        return draft(*args, **kwargs)

    def slowed_verify(*args, **kwargs):
        if engine.config.version != baseline_version:
            time.sleep(SLOWDOWN * (time.perf_counter() - began[0]))
        return verify(*args, **kwargs)
    engine._draft, engine._verify = timed_draft, slowed_verify


def _record_applies(engine) -> list:
    applied, apply = [], engine.apply

    def recording(change):
        applied.append(change)
        apply(change)
    engine.apply = recording
    return applied


@contextlib.contextmanager
def _lockstep(engines, prompts, concurrency: int = 4, params=LONG):
    """Closed-loop traffic on every engine, stepped one after another by one thread."""
    stop, ids, cycle = threading.Event(), itertools.count(), itertools.cycle(prompts)

    def run():
        while not stop.is_set():
            for engine in engines:
                while len(engine.scheduler.running) + len(engine.scheduler.waiting) < concurrency:
                    engine.add_request(f"t{next(ids)}", next(cycle), params)
                engine.step()
    thread = threading.Thread(target=run, name="test-lockstep", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


@contextlib.contextmanager
def _admin_server(engine):
    """The engine's HTTP API on loopback; its steps are driven by _lockstep, not by a service thread."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(EngineService(engine), "governor-moe", TOKEN),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_slowed_candidate_is_rejected_on_the_canary_alone(moe_models, tmp_path):
    prompts = code_prompts(moe_models.tokenizer, 8, max_bytes=48)
    # plain decoding: every step emits one token per sequence, so a check's throughput varies with time alone
    engines = [make_engine(moe_models, EngineConfig(spec_method="off", draft_len=0)) for _ in range(2)]
    policy = parse_policy(fast_policy(window={"seconds": 2.0, "checks": 4, "min_emitted_tokens": 20},
                                      trial={"mode": "canary"},
                                      judge={"confidence": 0.95, "min_samples": 12, "max_blocks": 48}), "canary")
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(_admin_server(engine)) for engine in engines]
        stack.enter_context(_lockstep(engines, prompts))
        client = FleetCanary(HttpClient(urls, TOKEN), lambda: policy.trial)
        controller = Controller(client, Store(f"sqlite:///{tmp_path / 'governor.db'}"), policy)
        baseline = controller.current
        applied = [_record_applies(engine) for engine in engines]
        for engine in engines:
            _slow_unless(engine, baseline.version)
        controller.strategy = strategy = OneTrial(lambda current: current,
                                                  "the same config under a new version, slowed")
        client.snapshot()
        for _ in range(100):
            time.sleep(policy.window.seconds / policy.window.checks)
            controller.tick()
            if strategy.outcomes:
                break

    decisions = controller.store.rows(Decision, 8)
    assert strategy.outcomes == ["reverted"], [(d["action"], d["reason"]) for d in decisions]
    canary, other = applied
    trial = controller.store.rows(Trial)[0]
    assert [c.version for c in canary] == [trial["config_version"], baseline.version]    # the candidate, the revert
    assert all(isinstance(c, EngineConfig) and c.version == baseline.version for c in other), other
    assert not any(isinstance(c, Experiment) for c in canary + other)
    revert = controller.store.rows(Decision, action="revert")[0]
    judge = revert["inputs"]["judge"]
    assert judge["outcome"] == "worse" and judge["comparison"]["interval"][1] < 1.0, judge
    assert controller.current == baseline and all(e.desired_config == baseline for e in engines)
    arms = revert["inputs"]["trial"], revert["inputs"]["baseline"]      # the canary's side, the other replica's
    assert [arm["config_version"] for arm in arms] == [trial["config_version"], baseline.version]
