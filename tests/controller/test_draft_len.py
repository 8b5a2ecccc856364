"""The rule policy reaches the best draft length k that a sweep of the same windows measures, on the shipped model,
within the sweep's own noise, and every draft-length trial ends with the judge's evidence."""
import time

from controller.store import Decision
from controller.window_stats import tokens_per_busy_second
from seam import EngineConfig
from tests.controller.conftest import fast_policy
from tests.controller.traffic import ClosedLoopTraffic

WINDOW_SECONDS = 1.5
MIN_NOISE_BAND = 0.2  # a k within 20% (or the sweep's own measured spread, if larger) of the best k counts as best
K_MAX = 8
MIN_WINDOWS, MAX_WINDOWS = 12, 30   # at least 12 windows; up to 30 until a k has been kept
CONCURRENCY = 4


def _measure(engine, k: int) -> float:
    engine.apply(EngineConfig(draft_len=k))
    time.sleep(0.3)
    engine.snapshot()                       # drop the steps that ran under the previous k
    time.sleep(WINDOW_SECONDS)
    return tokens_per_busy_second(engine.snapshot())


def _sweep(engine) -> tuple[dict[int, float], float]:
    """Tokens per busy second per k (the better of an upward and a downward pass: other work on the machine only
    slows a window down), and the noise band: the largest disagreement between the two passes, at least 20%."""
    ks = range(1, K_MAX + 1)
    up = {k: _measure(engine, k) for k in ks}
    down = {k: _measure(engine, k) for k in reversed(ks)}
    best = {k: max(up[k], down[k]) for k in ks}
    spread = max(abs(up[k] - down[k]) / best[k] for k in ks)
    return best, max(MIN_NOISE_BAND, spread)


def test_rule_policy_reaches_the_sweeps_best_k(build, prompts):
    policy = fast_policy(window={"seconds": WINDOW_SECONDS}, speculation={"k_max": K_MAX},
                         trial={"retry_windows": 3})
    engine, controller = build(policy, k=1)
    with ClosedLoopTraffic(engine, prompts, concurrency=CONCURRENCY):
        sweep, band = _sweep(engine)
        engine.apply(controller.current)
        time.sleep(0.3)
        controller.client.snapshot()   # the controller starts from a fresh window
        for window in range(MAX_WINDOWS):    # a loaded machine can leave a trial undecided: it is tried again
            time.sleep(WINDOW_SECONDS)
            controller.tick()
            if window >= MIN_WINDOWS and controller.store.rows(Decision, action="keep") \
                    and controller.state()["trial"] is None:
                break
    best = max(sweep, key=sweep.get)
    chosen = controller.last_known_good.draft_len_for(CONCURRENCY)   # a learned schedule leaves draft_len as it was
    judged = [*controller.store.rows(Decision, action="keep"), *controller.store.rows(Decision, action="revert")]
    print(f"sweep tokens/busy s {({k: round(v) for k, v in sweep.items()})}, noise band {band:.2f}; best k={best}; "
          f"controller k={chosen}")
    # The switchback judge keeps a k only on decisive evidence: within the noise band, staying put is right too.
    assert sweep[chosen] >= (1 - band) * sweep[best], (chosen, band, sweep)
    trial = controller.store.rows(Decision, action="trial")[-1]
    assert trial["predicted_gain"] is not None and "predictions" in trial["inputs"]
    assert judged, "no draft-length trial was judged"
    assert all(d["inputs"]["judge"]["pairs"] > 0 and d["measured_gain"] is not None for d in judged)
    predicted = [d for d in judged if d["predicted_gain"] is not None   # every predicted trial that measured a look's
                 and d["inputs"]["judge"]["pairs"] >= controller.policy.judge.min_samples]   # pairs: checked
    calibration = controller.state()["calibration"]
    assert calibration["trials"] == len(predicted) and 0 <= calibration["over_predicted_share"] <= 1
