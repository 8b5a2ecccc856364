"""What alerts, operators and the built-in SLO evaluator do to a running controller: roll back, pin and release, turn
speculation off, switch policy, start and stop a search, record a notification or an action not taken. Each takes the
controller's lock and records exactly one decision before it returns."""
from __future__ import annotations

from controller.clients import ApplyFailed
from controller.loop import Controller
from controller.store import Pin, RollbackRow
from policies import Policy
from seam import EngineConfig


class PinHeld(RuntimeError):
    """An action that would change the config while a pin holds; the pin's owner releases it first."""

    def __init__(self, pin: Pin):
        super().__init__(f"config v{pin.config_version} is pinned by {pin.owner} ({pin.reason}); release it first")
        self.pin = pin


class Operator:
    """The actions on one controller; holds nothing of its own, so any number of them may act on it."""

    def __init__(self, controller: Controller):
        self.controller = controller

    def rollback(self, reason: str, inputs: dict | None = None, alert: int | None = None,
                 lift_pin: bool = False) -> int:
        """Restore the last known good config and record exactly one rollback decision. While a pin holds, raises
        PinHeld (the pin decides what runs), unless lift_pin (an operator's rollback lifts it). Raises ApplyFailed if
        the engine could not take it (the running trial is over, `current` stays what the engine has, every tick
        retries)."""
        controller = self.controller
        with controller.lock:
            pin = controller.store.pin()
            if pin is not None and not lift_pin:
                raise PinHeld(pin)
            from_version = controller.current.version
            ended = controller.end_trial_for("rolled_back")
            if pin is not None:
                controller.store.set_pin(None)
            controller.forget_partial_window()
            if not controller.converge(controller.last_known_good, reason):
                raise ApplyFailed(f"rollback to v{controller.last_known_good.version} failed; retried every tick")
            good = controller.last_known_good.version
            decision = controller.decide("rollback", reason, {**(inputs or {}), "from_version": from_version,
                                                              "ended_trial": ended,
                                                              "lifted_pin": None if pin is None else pin.__dict__},
                                         config_version=good, settles_alert=alert,
                                         rollback=RollbackRow(reason, from_version, good))
            controller.metrics.rollback()
            return decision

    def pin(self, config: EngineConfig | None, owner: str, reason: str, alert: int | None = None) -> int:
        """Hold config (the current one if None) until released; the loop proposes nothing meanwhile. The engine
        checks config first: a refused one (EngineClientError) changes nothing. A running trial ends first; an
        alert's pin (owner 'alert:...') of the current config holds the last known good instead, so that an
        unjudged trial config never becomes last known good."""
        controller = self.controller
        with controller.lock:
            if config is not None:
                controller.client.check(config)
                config = controller.store.record_config(config, owner.split(":")[0], reason)
            elif controller.trial_running:
                config = controller.last_known_good
            ended = None
            if config is not None:
                if not controller.apply(config, reason):
                    raise ApplyFailed(f"pin: applying v{config.version} failed")
                ended = controller.end_trial_for("pinned_over")
                controller.adopt(config)
            controller.store.set_pin(Pin(controller.current.version, owner, reason))
            return controller.decide("pin", reason, {"owner": owner, "ended_trial": ended},
                                     config_version=controller.current.version, settles_alert=alert)

    def release(self, reason: str, owner: str | None = None, alert: int | None = None) -> int | None:
        """Lift the pin (only the owner's, if owner is given); None if there is none to lift. An operator's pinned
        config becomes the last known good; an alert's pin is never judged, so the last known good comes back."""
        controller = self.controller
        with controller.lock:
            pin = controller.store.pin()
            if pin is None or (owner is not None and pin.owner != owner):
                return None
            if pin.owner.startswith("alert:"):
                if not controller.converge(controller.last_known_good, reason):
                    raise ApplyFailed(f"release: restoring v{controller.last_known_good.version} failed")
            else:
                controller.last_known_good = controller.current
                controller.store.set_last_known_good(controller.current)
            controller.store.set_pin(None)
            controller.strategy.released(controller.current)
            return controller.decide("release", reason, {"owner": pin.owner},
                                     config_version=controller.current.version, settles_alert=alert)

    def disable_speculation(self, owner: str, reason: str, alert: int | None = None) -> int:
        """Pin the last known good config with speculation off (never a trial's config)."""
        controller = self.controller
        with controller.lock:
            self.refuse_if_pinned()
            return self.pin(controller.last_known_good.changed(spec_method="off"), owner, reason, alert)

    def notify(self, reason: str, inputs: dict, alert: int | None = None) -> int:
        controller = self.controller
        return controller.decide("notify", reason, inputs, config_version=controller.current.version,
                                 settles_alert=alert)

    def skip(self, reason: str, inputs: dict, alert: int | None = None) -> int:
        """Record that an action was not taken, and why (e.g. an alert's rollback while a pin holds)."""
        controller = self.controller
        return controller.decide("skip", reason, inputs, config_version=controller.current.version,
                                 settles_alert=alert, outcome="skipped")

    def switch_policy(self, policy: Policy, name: str) -> int:
        """The new policy's strategy is built first: one that cannot be built (raises) changes nothing."""
        controller = self.controller
        with controller.lock:
            strategy = controller.strategy_for(policy)
            ended = controller.end_trial_for("abandoned", revert=True)
            controller.policy, controller.policy_name, controller.strategy = policy, name, strategy
            return controller.decide("policy_switch", f"policy switched to {name} ({policy.kind})",
                                     {"policy": name, "ended_trial": ended})

    def start_search(self, policy: Policy, name: str) -> int | None:
        """Switch to an Optuna policy, remembering the one in use to return to; None if a search already runs."""
        controller = self.controller
        with controller.lock:
            if controller.policy.kind == "optuna":
                return None
            controller.before_search = (controller.policy, controller.policy_name)
            return self.switch_policy(policy, name)

    def stop_search(self, default: Policy, default_name: str) -> int | None:
        """Return from an Optuna search to the policy used before it (default if it ran from the start); None if
        no search runs."""
        controller = self.controller
        with controller.lock:
            if controller.policy.kind != "optuna":
                return None
            policy, name = controller.before_search or (default, default_name)
            controller.before_search = None
            return self.switch_policy(policy, name)

    def refuse_if_pinned(self) -> None:
        pin = self.controller.store.pin()
        if pin is not None:
            raise PinHeld(pin)

