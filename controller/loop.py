"""The level-based reconcile loop: observe a Window, let the policy propose, run the proposal as a switchback trial
(the engine alternates candidate and incumbent in short blocks), let the judge decide from the blocks, keep the
candidate (new last-known-good) or go back to the incumbent. Alerts and operators act through
controller.operate.actions; restarts, drift and failed applies are handled here; every decision is recorded before it
returns."""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from controller.clients import EngineClient, EngineClientError
from controller.counters import CountingSink, MetricsSink
from controller.decide.calibration import Calibration
from controller.decide.rule_policy import RulePolicy
from controller.outcomes import Action, JudgeOutcome, ProposalKind, TrialOutcome
from controller.periodic import Periodic
from controller.store import Store
from controller.strategy import UNMEASURED, Proposal, Strategy
from controller.trials.judge import BETTER, INCONCLUSIVE, SwitchbackJudge, Verdict, same_tokens
from controller.trials.trial import Trial, candidate_breaches, incumbent_breaks_slo, speculation_gain
from controller.window_stats import merge_windows, no_data_reason, short_of_traffic, slo_breaches, window_summary
from policies import Policy
from seam import EngineConfig, Experiment, Window

log = logging.getLogger("governor.controller")
MAX_NO_DATA_WINDOWS = 3     # a trial that sees no traffic for this many windows is reverted as inconclusive
KEPT_PROBE_ACTIONS: dict[ProposalKind, Action] = {"fallback_probe": "fallback", "speculation_probe": "reenable"}
OUTCOMES: dict[JudgeOutcome, TrialOutcome] = {BETTER: "kept", "worse": "reverted"}   # otherwise the verdict itself


class Controller:
    def __init__(self, client: EngineClient, store: Store, policy: Policy, policy_name: str = "default",
                 metrics: MetricsSink | None = None, on_decision=None, resume: bool = True):
        """resume: take charge at once (a standby passes False, and take_over() once it holds the lease)."""
        self.client, self.store, self.metrics = client, store, metrics or CountingSink()
        self.on_decision = on_decision or (lambda decision_id, action, reason: None)
        self.lock = threading.RLock()               # held by every state change (loop, alerts, operators)
        self._ticks = Periodic("governor-controller", self.tick, self.check_seconds)
        self.window_index = 0
        self.latest: Window | None = None
        self._parts: list[Window] = []
        self._trial: Trial | None = None
        self._no_data = False
        self._cooldown_until = 0
        self._slo_alert: str | None = None         # startsAt of the built-in SLO alert while it fires
        self.alerts = None                         # set by AlertIntake, for the built-in SLO evaluator
        self.policy, self.policy_name = policy, policy_name
        self.calibration = Calibration()              # predicted vs measured gains, kept across policy switches
        self.strategy = self.strategy_for(policy) if resume else RulePolicy(policy)
        self.before_search: tuple[Policy, str] | None = None   # the policy an Optuna search returns to
        self._wanted: EngineConfig | None = None     # a config to converge to that could not be applied yet
        self.current, self.last_known_good = self._resume() if resume else self._stored()

    # -- start, stop, one tick -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._ticks.start()

    def stop(self) -> None:
        self._ticks.stop()

    def fault(self) -> str | None:
        """The 'controller' health probe: None while its loop runs (or was never started)."""
        return "the controller thread died" if self._ticks.died() else None

    def check_seconds(self) -> float:
        """Seconds between two checks (ticks): a window is `checks` of them."""
        return self.policy.window.seconds / self.policy.window.checks

    def tick(self) -> None:
        """One check: take the engine's window so far; every `checks` ticks a whole window is judged (a window short
        of traffic goes on to the first later check where it holds enough, for at most max_stretch windows)."""
        with self.lock:
            self._reconcile()
            part = self.client.snapshot()
            self._parts.append(part)
            if self._trial is not None and self._trial_ended(part):
                self._learn(merge_windows(self._parts))     # what the trial's arms measured since the last window
                self._parts = []        # the next window measures the config the trial left in use
                return
            settings = self.policy.window
            if len(self._parts) < settings.checks:
                return
            window = merge_windows(self._parts)
            if short_of_traffic(window, self.policy) and len(self._parts) < settings.checks * settings.max_stretch:
                return                  # the window goes on until it holds enough traffic to judge
            self._parts = []
            self.window_index += 1
            self.latest = window
            self._on_window(window)

    def _on_window(self, window: Window) -> None:
        reason = no_data_reason(window, self.policy)
        if reason is not None:
            self._on_no_data(reason, window)
            return
        self._no_data = False
        self._learn(window)
        self._evaluate_slo(window)
        if self._trial is not None:
            return
        if self.store.pin() is not None or self._wanted is not None or self.window_index < self._cooldown_until:
            return
        proposal = self.strategy.propose(self.current, window, self.window_index)
        if proposal is not None:
            self._start_trial(proposal, window)

    def _learn(self, window: Window) -> None:
        """The strategy learns what the window measured, each arm apart while a trial runs. A trial that ends between
        two windows teaches its last part too: in the controller bench, probes of speculation at 16 sequences ended
        futile within 2 s, each before a window closed, so prompt lookup's model never measured speculating there
        and every later probe ran blind."""
        for measured in (window.arms or {"": window}).values():
            self.strategy.observe(measured)

    def _on_no_data(self, reason: str, window: Window) -> None:
        trial = self._trial
        if trial is not None:
            trial.no_data_windows += 1
            if trial.no_data_windows >= MAX_NO_DATA_WINDOWS:
                self._end_trial(INCONCLUSIVE, f"trial ended, incumbent kept: {MAX_NO_DATA_WINDOWS} windows without "
                                f"enough traffic to judge it ({reason})")
            return
        if not self._no_data:
            self.decide("no_data", reason + "; nothing is judged until traffic returns", window_summary(window))
            self._no_data = True

    # -- trials ----------------------------------------------------------------------------------------------------

    def _start_trial(self, proposal: Proposal, baseline: Window) -> None:
        config = self.store.record_config(proposal.config, "controller", proposal.reason)
        settings = self.policy.judge
        experiment = Experiment(incumbent=self.current, candidate=config, block_steps=settings.block_steps)
        if not self.apply(experiment, f"trial: {proposal.reason}"):
            self.strategy.finished(proposal, "failed", None, self.window_index)
            return
        trial_id = self.store.start_trial(self.strategy.name, config, self.current, proposal.predicted_gain,
                                          getattr(proposal.optuna_trial, "number", None))
        judge = SwitchbackJudge(settings, proposal.keep_gain, same_tokens=self.policy.trial.mode == "switchback"
                                and same_tokens(self.current, config), configs=(self.current, config))
        self._trial = Trial(trial_id, proposal, config, baseline, judge)
        self.decide("trial", proposal.reason, {**proposal.inputs, "kind": proposal.kind,
                                               "keep_gain": proposal.keep_gain, "baseline": window_summary(baseline),
                                               "switchback": settings.model_dump()},
                    predicted_gain=proposal.predicted_gain, config_version=config.version, trial_id=trial_id)

    def _trial_ended(self, part: Window) -> bool:
        """Feed the trial this part's blocks; end it if the candidate breaks the SLO or the judge decides."""
        trial = self._trial
        trial.add(part)
        breaches = candidate_breaches(part, trial.judge, self.policy)
        if breaches:
            self._end_trial("cut_short", "trial cut short, incumbent restored: the candidate's blocks break the SLO "
                            "while the incumbent's do not: " + "; ".join(breaches))
            return True
        verdict = trial.judge.look()
        if verdict is None or not verdict.decided:
            return False
        outcome = OUTCOMES.get(verdict.outcome, verdict.outcome)
        if outcome == INCONCLUSIVE and not self._measured(verdict):
            outcome = UNMEASURED
        self._end_trial(outcome, verdict.reason, verdict)
        return True

    def _end_trial(self, outcome: TrialOutcome, reason: str, verdict: Verdict | None = None) -> None:
        trial, self._trial = self._trial, None
        kind = trial.proposal.kind
        gain = verdict.comparison.effect if verdict is not None and verdict.comparison is not None else None
        candidate, incumbent = trial.arm("candidate"), trial.arm("incumbent")
        self.store.finish_trial(trial.id, outcome, gain)
        self.metrics.trial(outcome)
        if trial.proposal.raw_gain is not None and gain is not None and self._measured(verdict):
            self.calibration.record(kind, trial.proposal.raw_gain, trial.proposal.predicted_gain, gain,
                                    trial.proposal.inputs.get("band"))
            self.metrics.calibration(self.calibration.summary())
        self.strategy.finished(trial.proposal, outcome, candidate, self.window_index, gain)
        inputs = {"kind": kind, "outcome": outcome, "seconds": round(time.monotonic() - trial.started, 3),
                  "trial": None if candidate is None else window_summary(candidate),
                  "baseline": None if incumbent is None else window_summary(incumbent),
                  "judge": None if verdict is None else verdict.evidence()}
        if outcome == "kept":
            self.last_known_good = trial.config
            self.store.set_last_known_good(trial.config)
            if not self.converge(trial.config, f"keep trial {trial.id}"):
                reason += f"; v{trial.config.version} could not be applied yet, every tick retries it"
            action: Action = KEPT_PROBE_ACTIONS.get(kind, "keep")
        else:
            if not self.converge(self.last_known_good, f"end trial {trial.id}: {outcome}"):
                reason += f"; v{self.last_known_good.version} could not be applied yet, every tick retries it"
            self.metrics.rollback()
            self._cooldown_until = self.window_index + self.policy.trial.cooldown_windows + 1
            action = "cut_short" if outcome == "cut_short" else "revert"
        over_plain = speculation_gain(kind, gain)
        if over_plain is not None:
            inputs["speculation_gain_over_plain"] = over_plain
        self.decide(action, reason, inputs, predicted_gain=trial.proposal.predicted_gain, measured_gain=gain,
                    config_version=self.current.version, trial_id=trial.id)

    def _measured(self, verdict: Verdict) -> bool:
        """Did the trial measure its gain, well enough to check a prediction against or to count as lost? At least a
        look's min_samples pairs: a trial the load left after 2 pairs "measured" 2.1x with an interval of [0, inf] in
        the controller bench, and a shrink learned from such figures is noise."""
        return verdict.pairs >= self.policy.judge.min_samples

    # -- what the operator's actions (controller.operate.actions) build on -----------------------------------------

    @property
    def trial_running(self) -> bool:
        return self._trial is not None

    def adopt(self, config: EngineConfig) -> None:
        """The engine now runs config (applied by the caller): it is current, and nothing is left to converge to."""
        self.current, self._wanted = config, None

    def forget_partial_window(self) -> None:
        """Drop the checks of the window so far: they measured a config that no longer runs."""
        self._parts = []

    def end_trial_for(self, outcome: TrialOutcome, revert: bool = False) -> int | None:
        """End the running trial because an action replaces it; revert: go back to the last known good too."""
        trial, self._trial = self._trial, None
        if trial is None:
            return None
        self.forget_partial_window()        # they measured the trial's experiment
        self.store.finish_trial(trial.id, outcome, None)
        self.metrics.trial(outcome)
        self.strategy.finished(trial.proposal, outcome, None, self.window_index)
        if revert:
            self.converge(self.last_known_good, f"trial {trial.id} ended ({outcome})")
        return trial.id

    def _evaluate_slo(self, window: Window) -> None:
        """Raise the built-in alert while the window breaks the SLO. It asks for a rollback only outside a trial and
        away from the last known good; otherwise it notifies, saying why (see _why_not_roll_back)."""
        if not self.policy.slo.builtin_evaluator or self.alerts is None:
            return
        breaches = slo_breaches(window, self.policy)
        if breaches and self._slo_alert is None:
            self._slo_alert = _iso(window.end)
            why_not = self._why_not_roll_back(window)
            if why_not is None:
                self.alerts.builtin("firing", self._slo_alert, "; ".join(breaches))
            else:
                self.alerts.builtin("firing", self._slo_alert, f"{'; '.join(breaches)} ({why_not})", action="notify")
        elif not breaches and self._slo_alert is not None:
            self.alerts.builtin("resolved", self._slo_alert, "latency back within the SLO")
            self._slo_alert = None

    def _why_not_roll_back(self, window: Window) -> str | None:
        """Why a rollback would not answer this breach, or None if it would."""
        if self._trial is not None:
            if incumbent_breaks_slo(window, self.policy):
                return "the incumbent's blocks break it too: the traffic's, not the trial's"
            return ("a trial runs: its guard cuts the candidate once the candidate's blocks are shown slower than the "
                    "incumbent's")
        if self.current.version == self.last_known_good.version:
            return "the last known good config runs: a rollback would change nothing"
        return None

    # -- plumbing ----------------------------------------------------------------------------------------------

    def state(self) -> dict:
        with self.lock:
            pin = self.store.pin()
            return {"policy": self.policy_name, "policy_kind": self.policy.kind,
                    "degraded_replicas": dict(self.client.degraded),
                    "converging_to": None if self._wanted is None else self._wanted.version,
                    "config": self.current.model_dump(), "last_known_good": self.last_known_good.model_dump(),
                    "pin": None if pin is None else pin.__dict__, "window_index": self.window_index,
                    "calibration": self.calibration.summary(),
                    "trial": None if self._trial is None else {"id": self._trial.id, "kind": self._trial.proposal.kind,
                                                               "reason": self._trial.proposal.reason}}

    def take_over(self) -> None:
        """Take charge of the engines from where the store leaves them (a standby that now holds the lease): the
        trial a dead leader left open is recorded as interrupted, and the pinned or last known good config comes
        back. The strategy starts afresh (an Optuna search fails the trial the dead leader left running)."""
        with self.lock:
            self.step_down()
            self.strategy = self.strategy_for(self.policy)
            self.current, self.last_known_good = self._resume()

    def step_down(self) -> None:
        """Forget what this process was doing as leader, writing nothing (its lease has moved on)."""
        with self.lock:
            self._trial, self._parts, self._wanted, self._no_data, self._slo_alert = None, [], None, False, None

    def observe(self) -> None:
        """A standby's view, refreshed: what the store says runs (the leader's pin or last known good)."""
        with self.lock:
            self.current, self.last_known_good = self._stored()

    def _stored(self) -> tuple[EngineConfig, EngineConfig]:
        pin, lkg = self.store.pin(), self.store.last_known_good()
        lkg = lkg or self.client.config()
        return (self.store.config(pin.config_version) if pin else lkg), lkg

    def _resume(self) -> tuple[EngineConfig, EngineConfig]:
        for trial in self.store.running_trials():
            self.store.finish_trial(trial, "interrupted", None)
        pin, lkg = self.store.pin(), self.store.last_known_good()
        if lkg is None:
            lkg = self.store.record_config(self.client.config(), "engine", "the engine's config at first start")
            if not self.apply(lkg, "first start"):  # the same knobs, under the store's version number
                self._wanted = lkg
            self.store.set_last_known_good(lkg)
            self.decide("start", "first start: the engine's config is the last known good", {},
                        config_version=lkg.version)
            return lkg, lkg
        current = self.store.config(pin.config_version) if pin else lkg
        if not self.apply(current, "restart"):
            self._wanted = current
        self.decide("resume", f"restart: resumed {'the pinned' if pin else 'the last known good'} config "
                    f"v{current.version}", {"pin": None if pin is None else pin.__dict__},
                    config_version=current.version)
        return current, lkg

    def apply(self, change: EngineConfig | Experiment, reason: str) -> bool:
        try:
            self.client.apply(change)
        except EngineClientError as error:
            config = change.candidate if isinstance(change, Experiment) else change
            self.decide("apply_failed", f"{reason}: {error}", {"config": config.model_dump()},
                        config_version=config.version)
            return False
        return True

    def converge(self, config: EngineConfig, reason: str) -> bool:
        """Apply config; `current` follows only if the engine took it, else every tick retries it."""
        if self.apply(config, reason):
            self.current, self._wanted = config, None
            return True
        self._wanted = config
        return False

    def _reconcile(self) -> None:
        """Level-based: every replica must serve the config the controller holds (or one it could not apply yet);
        re-apply it where one reports another version (a restarted replica, a write behind the controller's back).
        While a trial's Experiment runs, each replica serves one of its arms (current is the incumbent), so either
        arm's version is the intended one; a replica serving anything else ends the trial, as its blocks no longer
        compare the two arms, and gets current back."""
        target = self._wanted or self.current
        intended = {target.version} | ({self._trial.config.version} if self._trial is not None else set())
        try:
            versions = self.client.versions()
        except EngineClientError as error:
            log.warning("cannot read the engines' config versions: %s", error)
            return
        drifted = {where: version for where, version in versions.items() if version not in intended}
        if not drifted and self._wanted is None:
            return
        reason = ("drift: " + ", ".join(f"{where} serves v{version}" for where, version in drifted.items())
                  + f"; the controller holds v{target.version}, re-applied") if drifted \
            else f"re-applied v{target.version}, which an earlier apply could not take into use"
        ended = self.end_trial_for("abandoned")
        if self.converge(target, reason):
            self.decide("reapply", reason, {"drifted": drifted, "ended_trial": ended}, config_version=target.version)

    def decide(self, action: Action, reason: str, inputs: dict, **fields) -> int:
        """Recorded in one transaction with what it settles (an alert's outcome, a rollback row)."""
        decision = self.store.record_decision(action, reason, inputs, **fields)
        self.metrics.decision(action)
        log.info("decision %d %s: %s", decision, action, reason)
        self.on_decision(decision, action, reason)
        return decision

    def strategy_for(self, policy: Policy) -> Strategy:
        if policy.kind == "optuna":
            # optuna is heavy (it loads alembic and the samplers): imported only when a search runs
            from controller.decide.optuna_search import OptunaSearch
            return OptunaSearch(policy, self.store.url)
        return RulePolicy(policy, calibration=self.calibration)


def _iso(unix_seconds: float) -> str:
    return dt.datetime.fromtimestamp(unix_seconds, dt.timezone.utc).isoformat().replace("+00:00", "Z")
