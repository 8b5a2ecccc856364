"""A window short of traffic goes on (window.max_stretch) rather than being thrown away as "no data": on a slow
machine or under light traffic the controller still gets windows it can judge; only a window that stays short to its
longest is "no data"."""
from controller.store import Decision
from seam import SamplingParams
from tests.controller.conftest import fast_policy

QUIET = {"trial": {"min_predicted_gain": 100.0}}     # no trials: only the windows are under test


def _emit(engine, prompt, tokens: int, request_id: str) -> None:
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    while engine.has_work:
        engine.step()


def _idle_controller(build, max_stretch: int):
    """Plain decoding, no traffic yet, windows of one check that need 40 tokens and 5 steps."""
    policy = fast_policy(window={"min_emitted_tokens": 40, "min_steps": 5, "max_stretch": max_stretch}, **QUIET)
    engine, controller = build(policy, k=0)
    controller.client.snapshot()
    return engine, controller


def test_a_window_short_of_traffic_goes_on_until_it_holds_enough(build, prompts):
    engine, controller = _idle_controller(build, max_stretch=3)
    _emit(engine, prompts[0], 24, "a")
    controller.tick()
    assert controller.window_index == 0 and controller.latest is None          # 24 tokens: the window goes on
    _emit(engine, prompts[1], 24, "b")
    controller.tick()
    assert controller.window_index == 1
    assert controller.latest.emitted_tokens == 48 and controller.latest.finished_requests == 2
    assert not controller.store.rows(Decision, action="no_data")


def test_a_window_that_stays_short_to_its_longest_is_no_data_once(build, prompts):
    engine, controller = _idle_controller(build, max_stretch=3)
    for _ in range(2):
        controller.tick()
    assert controller.window_index == 0 and not controller.store.rows(Decision, action="no_data")
    controller.tick()
    assert controller.window_index == 1
    for _ in range(3):                                  # another idle window: still one "no data" decision
        controller.tick()
    rows = controller.store.rows(Decision, action="no_data")
    assert controller.window_index == 2 and len(rows) == 1 and "0 tokens emitted" in rows[0]["reason"]


def test_without_stretch_a_short_window_is_no_data_at_once(build, prompts):
    engine, controller = _idle_controller(build, max_stretch=1)
    _emit(engine, prompts[0], 24, "a")
    controller.tick()
    assert controller.window_index == 1 and controller.latest.emitted_tokens == 24
    assert len(controller.store.rows(Decision, action="no_data")) == 1
