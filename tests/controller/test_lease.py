"""The leader lease on both backends (SQLite and a real PostgreSQL server), two holders on separate connections:
one leads, the other takes over only once the lease goes unrenewed for its duration (or is released), and the old
holder's writes are fenced off by the epoch."""
import time

import pytest

from controller.operate.lease import Lease, LeaseLost
from controller.store import Decision, Store

DURATION = 0.4


def _pair(url: str) -> tuple[Lease, Lease]:
    return (Lease(Store(url), lambda: DURATION, holder="first"), Lease(Store(url), lambda: DURATION, holder="second"))


def test_a_standby_takes_over_an_unrenewed_lease_and_the_old_holder_is_fenced_off(store_url):
    first, second = _pair(store_url)
    first.step()
    second.step()
    assert first.leading_epoch() == 1 and second.leading_epoch() is None
    assert second.state() == {"role": "standby", "holder": "second", "leader": "first", "epoch": None}
    first.store.record_decision("notify", "written while leading")

    seen = time.monotonic()
    while second.leading_epoch() is None:       # first stops renewing, as a killed process does
        second.step()
        time.sleep(DURATION / 8)
    assert time.monotonic() - seen >= DURATION and second.leading_epoch() == 2

    with pytest.raises(LeaseLost):
        first.store.record_decision("notify", "written after the lease moved on")
    assert [d["reason"] for d in second.store.decisions()] == ["written while leading"]
    first.step()
    assert first.leading_epoch() is None and first.state()["leader"] == "second"
    second.store.record_decision("notify", "the new leader writes")
    assert second.store.count(Decision) == 2


def test_a_renewed_lease_stays_and_a_released_one_moves_at_once(store_url):
    first, second = _pair(store_url)
    first.step()
    for _ in range(6):                          # renewed every third of the duration: never taken
        time.sleep(DURATION / 3)
        first.step()
        second.step()
    assert first.leading_epoch() == 1 and second.leading_epoch() is None
    first.stop()                                 # a clean stop releases it
    second.step()
    assert second.leading_epoch() == 2 and first.leading_epoch() is None
