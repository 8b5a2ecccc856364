"""A trial that ends between two windows still teaches the strategy what its arms measured: a probe that ends futile
within a window otherwise leaves the goodput model blind to the config it probed, and the next probe runs blind too."""
import time

from tests.controller.conftest import fast_policy
from tests.controller.strategies import OneTrial
from tests.controller.traffic import ClosedLoopTraffic


def test_the_arms_of_a_trial_that_ends_between_windows_are_observed(build, prompts):
    policy = fast_policy(window={"seconds": 2.0}, judge={"block_steps": 2, "min_samples": 6, "max_blocks": 12})
    engine, controller = build(policy, k=1)
    controller.strategy = strategy = OneTrial(lambda current: current.changed(draft_len=3), "k 1 -> 3")
    with ClosedLoopTraffic(engine, prompts, concurrency=4):
        controller.client.snapshot()
        time.sleep(policy["window"]["seconds"])
        controller.tick()                                   # a window of k 1; the trial of k 3 starts
        assert controller.state()["trial"] is not None and [w.draft_len for w in strategy.observed] == [1]
        time.sleep(4.0)                                     # every tick closes a window here: the trial's 12 blocks
        controller.tick()                                   # of 2 steps end before this one (0.5 s was too short for
                                                            # them on a busy CI machine)
    assert controller.state()["trial"] is None and controller.window_index == 1    # no window closed since
    assert sorted(w.draft_len for w in strategy.observed[1:]) == [1, 3]          # both arms taught, as they ran
    ended = controller.store.decisions(limit=1)[0]
    assert strategy.measured == [ended["measured_gain"]] and ended["measured_gain"] > 0   # and the judge's estimate
