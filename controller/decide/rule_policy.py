"""The rule policy: what to try next, from the measured Window and the goodput models. Each proposal becomes a
switchback trial the loop judges; predicted gains are calibrated against what earlier trials measured."""
from __future__ import annotations

from dataclasses import dataclass, field

from controller.decide.calibration import Calibration
from controller.decide.expert_rules import PlacementMemory, capacity_factor_change, re_placement
from controller.decide.goodput import MIN_FIT_STEPS, GoodputModel
from controller.decide.schedule import MAX_BAND, learned, schedule_text, with_bands, with_schedule
from controller.outcomes import TrialOutcome
from controller.strategy import PROBES, UNMEASURED, Proposal
from controller.trials.judge import INCONCLUSIVE
from controller.window_stats import tokens_per_busy_second
from policies import Policy
from seam import DraftLenSchedule, EngineConfig, Window, batch_band

DRAFTERS = ("draft_model", "ngram")
LIGHT_BAND = 1           # batch sizes up to 2: where an untried drafter is tried (see RulePolicy._untried_drafter)
SETTLED_SHARE = 2 / 3    # of a window's steps in its median step's batch band: the load sits in that band


@dataclass
class RuleState:
    """What the rules remember between windows."""
    models: dict[str, GoodputModel] = field(default_factory=lambda: {
        m: GoodputModel(shadowed=m == "ngram") for m in DRAFTERS})
    last_mode_probe: int = 0                             # window index of the last speculation on/off probe
    probes_lost: dict[str, dict[int, int]] = field(default_factory=lambda: {kind: {} for kind in PROBES})
                                    # probe kind -> band -> its probes in a row that the probed mode lost there
    last_drafter_probe: int | None = None                # window index of the last try of the other drafter
    rejected: dict[tuple, int] = field(default_factory=dict)   # (kind, value) -> window index it was reverted
    placement: PlacementMemory = field(default_factory=PlacementMemory)
    spec_method: str = "draft_model"                     # the method to re-enable speculation with
    draft_len_bands: DraftLenSchedule | None = None      # ... and the draft_len by batch size it last ran with
    band_draft_len: dict[int, int] = field(default_factory=dict)   # band -> the draft_len it drafted when plain
                                                                    # decoding was probed
    unavailable: set[str] = field(default_factory=set)   # drafters the engine refused (e.g. no draft model)
    tried_blind: set[str] = field(default_factory=set)   # drafters tried before their model was ready, once judged


class RulePolicy:
    """A Strategy: rules over the goodput models (one per drafter), mode probes, drafter choice, capacity factor
    from drops, placement from heat."""
    name = "rules"

    def __init__(self, policy: Policy, state: RuleState | None = None, calibration: Calibration | None = None):
        self.policy, self.state = policy, state or RuleState()
        self.calibration = calibration or Calibration()

    def observe(self, window: Window) -> None:
        """A window of plain decoding measures the target's cost at k = 0, which every drafter's model shares."""
        for method, model in self.state.models.items():
            if window.spec_method in (method, "off"):
                model.observe(window)

    def finished(self, proposal: Proposal, outcome: TrialOutcome, window: Window | None, window_index: int,
                 measured_gain: float | None = None) -> None:
        if outcome == "failed" and proposal.kind == "spec_method":
            self.state.unavailable.add(proposal.config.spec_method)
        if proposal.kind == "spec_method" and proposal.raw_gain is None and outcome not in ("failed", UNMEASURED):
            self.state.tried_blind.add(proposal.config.spec_method)
        if outcome != "kept":
            self.state.rejected[(proposal.kind, _value(proposal))] = window_index
        if proposal.kind == "placement":
            self.state.placement.finished(outcome)
        if proposal.kind in PROBES and outcome != UNMEASURED:
            lost, band = self.state.probes_lost, proposal.inputs["band"]
            if outcome == "kept":           # the probe measured the mode it replaced losing: once, for its next probe
                lost[proposal.kind][band] = 0
                lost[next(kind for kind in PROBES if kind != proposal.kind)][band] = 1
            elif not _ahead_undecided(proposal, outcome, measured_gain):
                lost[proposal.kind][band] = lost[proposal.kind].get(band, 0) + 1

    def released(self, config: EngineConfig) -> None:
        """An operator's pin ended: probe the other speculation mode at the next window rather than after
        reprobe_windows (a pin that turned speculation off should not keep it off once lifted)."""
        self.state.last_mode_probe = -self.policy.speculation.reprobe_windows
        self.state.tried_blind.clear()
        self.state.placement.held = None
        for lost in self.state.probes_lost.values():
            lost.clear()
        for probe in [key for key in self.state.rejected if key[0] == "speculation_probe"]:
            del self.state.rejected[probe]

    def propose(self, current: EngineConfig, baseline: Window, window_index: int) -> Proposal | None:
        if current.spec_method != "off":
            self.state.spec_method = current.spec_method
        if current.longest_draft_len > 0:
            self.state.draft_len_bands = current.draft_len_bands
        rules = (self._mode_probe, self._untried_drafter, self._draft_len, self._drafter, self._capacity_factor,
                 self._placement)
        if not _settled(baseline):          # the trials of one band's k or mode wait for the load to settle
            rules = tuple(rule for rule in rules if rule not in (self._mode_probe, self._draft_len))
        for rule in rules:
            proposal = rule(current, baseline, window_index)
            if proposal is not None and not self._recently_rejected(proposal, window_index):
                return proposal
        return None

    def _recently_rejected(self, proposal: Proposal, window_index: int) -> bool:
        at = self.state.rejected.get((proposal.kind, _value(proposal)))
        return at is not None and window_index - at < self.policy.trial.retry_windows

    # -- speculation on/off, by probing the other mode ------------------------------------------------------------

    def _mode_probe(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        """Probe the other speculation mode at the batch band the load is in: plain decoding there while this band
        speculates (the other bands keep their k: speculation that stops paying at 16 sequences still pays at 1),
        speculation while it does not. No probe of plain decoding where the goodput model already answers it."""
        spec, state = self.policy.speculation, self.state
        k_now = current.draft_len_for(_batch(baseline))
        band, speculating = _band(baseline), k_now > 0
        if index - state.last_mode_probe < self.reprobe_wait(speculating, band):
            return None
        if speculating and self._plain_answered(current.spec_method, band, k_now):
            return None
        if not speculating and self._speculation_answered(band, baseline):
            return None
        state.last_mode_probe = index
        inputs = self._inputs(current, baseline)
        if speculating:
            state.band_draft_len[band] = k_now
            candidate = _plain_at(current, band)
            where = "" if candidate.spec_method == "off" else f" at batch band {band}"
            what_if = self._what_if(current.spec_method, 0, k_now, band)
            return Proposal(candidate, "fallback_probe", f"probe plain decoding{where}: speculation stays only while "
                            f"it beats it by {spec.min_gain}x{_predicted_text(what_if)} ({schedule_text(candidate)})",
                            keep_gain=1 / spec.min_gain, inputs=inputs, **what_if)
        if current.spec_method == "off":
            candidate = with_schedule(current.changed(spec_method=state.spec_method), self._schedule_to_resume(
                current, baseline))
        else:                                            # this band fell back; the others speculate
            k = state.band_draft_len.get(band) or self._best_k(
                current.spec_method, band, current.longest_draft_len or EngineConfig().draft_len)
            candidate = with_bands(current, {band: k})
        threshold = spec.min_gain + spec.hysteresis
        what_if = self._what_if(state.spec_method, candidate.draft_len_for(_batch(baseline)), 0, band)
        return Proposal(candidate, "speculation_probe", f"probe speculation at {schedule_text(candidate)}: re-enabled "
                        f"only if it beats plain decoding by {threshold:.3f}x (min_gain + hysteresis)"
                        f"{_predicted_text(what_if)}", keep_gain=threshold, inputs=inputs, **what_if)

    def _what_if(self, method: str, k: int, k_now: int, band: int) -> dict:
        """A probe's predicted gain, raw and calibrated as a draft_len change at band, where method's goodput model
        predicts both modes there: the probe's measurement then checks it, and what plain decoding won or lost at a
        band corrects the model's later k proposals and answers there."""
        model = self._model(method)
        if not (model.ready(band) and model.predicts_plain(band)):
            return {}
        raw = model.gain(k, k_now, band)
        return {"raw_gain": raw, "predicted_gain": self.calibration.corrected("draft_len", raw, band)}

    def _plain_answered(self, method: str, band: int, k: int) -> bool:
        """Has the goodput model answered what a probe of plain decoding at band would ask? Once it predicts plain
        decoding's cost there (measured, or moved from speculation's by the tokens it would no longer verify) and
        predicts, calibrated, that k beats it by min_gain + hysteresis (the bar speculation must clear to come back),
        the probe would only spend blocks on a config known to lose: in the controller bench, probes at 1 sequence of
        copying measured 0.39-0.45x and took a phase's last seconds from the k trial there. A drop in acceptance at
        this band is the model's to see (the gain falls below the bar, and the probe runs)."""
        model = self._model(method)
        if not (model.ready(band) and model.predicts_plain(band)):
            return False
        return self._clears_reenable_bar(model, k, band)

    def _speculation_answered(self, band: int, baseline: Window) -> bool:
        """Has the goodput model answered what a probe of speculation at band would ask? Prompt lookup's acceptance is
        measured in the shadow of plain decoding: once its model has measured the costs of speculating at band, and
        this window's shadow lookups are in its acceptance, it predicts what the probe would measure. A calibrated
        gain below min_gain + hysteresis (the bar the probe would have to clear) answers it; above, the probe runs."""
        model = self._model(self.state.spec_method)
        if not (model.shadowed and baseline.shadow_lookups and model.ready(band) and model.measured_plain(band)):
            return False
        return not self._clears_reenable_bar(model, model.best(self._reachable(model, band), band).k, band)

    def _clears_reenable_bar(self, model: GoodputModel, k: int, band: int) -> bool:
        """Does model predict, calibrated, that k beats plain decoding at band by min_gain + hysteresis?"""
        spec = self.policy.speculation
        return self.calibration.corrected("draft_len", model.gain(k, 0, band), band) >= spec.min_gain + spec.hysteresis

    def _schedule_to_resume(self, current: EngineConfig, baseline: Window) -> DraftLenSchedule:
        """What speculation last ran with (judged, unlike the model's best), else the model's best k at this band."""
        if self.state.draft_len_bands is not None:
            return self.state.draft_len_bands
        return ((1, self._best_k(self.state.spec_method, _band(baseline),
                                 current.draft_len or EngineConfig().draft_len)),)

    def _best_k(self, method: str, band: int, otherwise: int) -> int:
        """The k > 0 the goodput model of method predicts best at band, or otherwise before it measured the band."""
        model = self._model(method)
        return model.best(self._reachable(model, band), band).k if model.ready(band) else otherwise

    def reprobe_wait(self, speculating: bool, band: int) -> int:
        """Windows between probes of the other mode at band: reprobe_windows, doubled for each probe of that mode in a
        row that lost at band, up to reprobe_backoff_max times. A kept probe counts as one loss for the next probe of
        the mode it replaced (it measured that mode losing). A load that moves to another band is probed there on its
        own count; a released pin starts every band again; a probe the load left before it measured anything is no loss
        (in the controller bench, one started in prose-hot's last second ended unmeasured in the copy phase after it,
        and a doubled wait kept the next pass's prose-hot drafting k 4), nor one that ended undecided with its estimate
        past its bar (_ahead_undecided). Probes of speculation back off too: in the controller bench, each one at 12-22
        sequences of prose-hot ran 7-10 s at 0.72-0.77x plain decoding while the shadow's model, 1.56x there, kept
        clearing the re-enable bar; a shift in content that makes speculation pay again waits at most
        reprobe_backoff_max x reprobe_windows."""
        spec = self.policy.speculation
        lost = self.state.probes_lost["fallback_probe" if speculating else "speculation_probe"].get(band, 0)
        return spec.reprobe_windows * min(2 ** lost, spec.reprobe_backoff_max)

    # -- k by batch band, from the goodput model ------------------------------------------------------------------

    def _model(self, method: str) -> GoodputModel:
        return self.state.models[method if method in DRAFTERS else self.state.spec_method]

    def _reachable(self, model: GoodputModel, band: int) -> list[int]:
        """k values a trial may try: measured costs extrapolate only k_step past the largest k measured, and while the
        model prices no draft token at band, only once the band ran the decode steps a price is fitted on (a k 4 -> 8
        trial 4 s into the controller bench's copy phase, its cost held at k 4's, was predicted 1.86-1.97x and
        measured 0.70-1.33x). Until then, only the k measured; after, a draft model (whose draft tokens move with the
        batch size alone, and fit no price) tries a k at the cost held flat, the most it could gain."""
        measured = model.measured_ks(band)
        if model.price_per_draft_token(band) is None and model.decode_steps(band) < MIN_FIT_STEPS:
            return measured
        spec = self.policy.speculation
        return list(range(1, min(spec.k_max, max(measured, default=0) + spec.k_step) + 1))

    def _draft_len(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        """Set the k of the batch band the traffic is in (and of the bands never measured) to the model's best;
        the bands learned already keep theirs, so the schedule fills in as the load visits each band. k = 0 (plain
        decoding at this band's batch sizes only) is a candidate once plain decoding was measured at the band. A band
        decoding plainly is left to the probes of speculation, with their re-enable bar and backoff: in the controller
        bench, a k 0 -> 4 trial at 12-22 sequences (calibrated 1.06x) followed a probe of speculation there that had
        measured 0.72x."""
        model, band = self._model(current.spec_method), _band(baseline)
        k_now = current.draft_len_for(_batch(baseline))
        if k_now == 0 or not model.ready(band):
            return None
        reachable = self._reachable(model, band)
        if model.measured_plain(band):
            reachable = [0, *reachable]
        best = model.best(reachable, band)
        if best.k == k_now:
            return None
        return self._predicted(
            learned(current, band, best.k, model.measured_bands()), "draft_len", model.gain(best.k, k_now, band),
            f"batch band {band}: k {k_now} -> {best.k}", current, baseline)

    # -- which drafter: the draft model or prompt lookup ----------------------------------------------------------

    def _drafter(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        """Switch drafter when the other drafter's model, having measured this band, predicts a gain."""
        other, band = self._other_drafter(current), _band(baseline)
        if other is None:
            return None
        mine, theirs = self._model(current.spec_method), self._model(other)
        if not (mine.ready(band) and theirs.ready(band)):
            return None
        best = theirs.best(self._reachable(theirs, band), band)
        raw = best.tokens_per_second / mine.predict(current.draft_len_for(_batch(baseline)), band).tokens_per_second
        candidate = learned(current.changed(spec_method=other), band, best.k, theirs.measured_bands())
        return self._predicted(candidate, "spec_method", raw, f"drafter {current.spec_method} -> {other} at "
                               f"batch band {band}, k {best.k}", current, baseline)

    def _untried_drafter(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        """Under light load (batch band <= LIGHT_BAND), try a drafter never measured under light load every
        reprobe_windows, so both models learn; before any k trial there, so k is not tuned for a drafter about to be
        replaced and the try, which can run at a fraction of the incumbent's speed (SmolLM2's own first 20 layers
        drafting measured 0.07-0.11x in copy), lands in the load's first visit rather than a later one. Once, not at
        each light band: tried again at 2 sequences after losing 12x at 1, it was cut short for breaking the SLO, and
        the informed switch (_drafter) takes over where both models measured. Not under heavy load: a drafter that
        loses there slows every running sequence (tried blind at 16 sequences, it halved a 20 s phase's goodput), and
        speculation pays least there anyway. Once a try measured it (the judge's verdict, whatever it was), not again
        until a pin is released, even if its short trial left its model unready: tried again at each return of light
        load, it ran at 0.03-0.10x for 3-4 s of a 30 s copy phase, twice in one pass."""
        other, band = self._other_drafter(current), _band(baseline)
        if other is None or other in self.state.tried_blind or band > LIGHT_BAND \
                or any(self._model(other).ready(b) for b in range(LIGHT_BAND + 1)):
            return None
        last = self.state.last_drafter_probe
        if last is not None and index - last < self.policy.speculation.reprobe_windows:
            return None
        self.state.last_drafter_probe = index
        return Proposal(current.changed(spec_method=other), "spec_method",
                        f"try drafter {other} at batch band {band} (never measured there): kept only if it beats "
                        f"{current.spec_method}", keep_gain=self.policy.trial.keep_gain,
                        inputs=self._inputs(current, baseline))

    def _other_drafter(self, current: EngineConfig) -> str | None:
        """The drafter current does not use, if current speculates with one and the engine has the other."""
        if current.spec_method not in DRAFTERS:
            return None
        other = next(m for m in DRAFTERS if m != current.spec_method)
        return None if other in self.state.unavailable else other

    def _predicted(self, candidate: EngineConfig, kind: str, raw: float, what: str, current: EngineConfig,
                   baseline: Window) -> Proposal | None:
        """A proposal only if the calibrated prediction (for kind at the band the load is in) clears
        min_predicted_gain."""
        gain = self.calibration.corrected(kind, raw, _band(baseline))
        if gain < self.policy.trial.min_predicted_gain:
            return None
        return Proposal(candidate, kind, f"{what}: goodput model predicts {raw:.3f}x, calibrated {gain:.3f}x "
                        f"({schedule_text(candidate)})", keep_gain=self.policy.trial.keep_gain, predicted_gain=gain,
                        raw_gain=raw, inputs=self._inputs(current, baseline))

    # -- capacity factor and placement (MoE targets only): controller.decide.expert_rules ----------------------------

    def _capacity_factor(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        return capacity_factor_change(current, baseline, self.policy.capacity, self.policy.trial.keep_gain,
                                      lambda: self._inputs(current, baseline))

    def _placement(self, current: EngineConfig, baseline: Window, index: int) -> Proposal | None:
        return re_placement(current, baseline, index, self.policy.placement, self.state.placement, self.calibration,
                            self.policy.trial.keep_gain, lambda: self._inputs(current, baseline))

    def _inputs(self, current: EngineConfig, baseline: Window) -> dict:
        band, model = _band(baseline), self._model(current.spec_method)
        predictions = {} if not model.ready(band) else {
            k: {"tokens_per_step": round(p.tokens_per_step, 4), "seconds_per_step": round(p.seconds_per_step, 6)}
            for k in self._reachable(model, band) for p in [model.predict(k, band)]}
        return {"band": band, "baseline_tokens_per_busy_second": round(tokens_per_busy_second(baseline), 2),
                "model": model.describe(band), "predictions": predictions, "calibration": self.calibration.summary()}


def _plain_at(config: EngineConfig, band: int) -> EngineConfig:
    """config decoding plainly at band's batch sizes and every larger one, measured or not (speculation pays less as
    the batch grows: where plain decoding wins, it wins at larger batches too; in the controller bench, prose-hot's
    12-22 sequences fell back while the 23 and more at its start, measured at k 4 in an earlier phase, kept drafting
    k 4); speculation off when no band would draft any more."""
    candidate = with_bands(config, {b: 0 for b in range(band, MAX_BAND + 1)})
    return candidate if candidate.longest_draft_len > 0 else config.changed(spec_method="off")


def _ahead_undecided(proposal: Proposal, outcome: TrialOutcome, measured_gain: float | None) -> bool:
    """Did a trial end undecided with its estimate past its bar? A probe that did measured the probed mode ahead, not
    losing, and is no loss for the backoff: in the controller bench, probes of speculation at 6-11 sequences of the
    mixed phase ended undecided at 1.12-1.25x (bar 1.10x) as the phase ended, and the doubled wait that followed
    held the next pass's probe there until 7 s into mixed's 10 s, which it spent decoding plainly."""
    return outcome == INCONCLUSIVE and measured_gain is not None and measured_gain >= proposal.keep_gain


def _predicted_text(what_if: dict) -> str:
    if not what_if:
        return ""
    return f"; goodput model predicts {what_if['raw_gain']:.3f}x, calibrated {what_if['predicted_gain']:.3f}x"


def _band(window: Window) -> int:
    return batch_band(window.batch_size_median)


def _settled(window: Window) -> bool:
    """Does the load sit in one batch band (SETTLED_SHARE of the window's steps in its median step's band)? A trial of
    one band's k or speculation mode measures only the steps in that band, and one started while the load crossed
    bands ran on with nothing to measure: in the controller bench, a probe of plain decoding at 23 or more sequences,
    started while prose-hot's batch hovered at 22-23, held the one trial slot 17 s with 0 testable pairs."""
    if not window.by_band or window.steps == 0:
        return True
    part = window.by_band.get(_band(window))
    return part is not None and part.steps >= SETTLED_SHARE * window.steps


def _batch(window: Window) -> int:
    return window.batch_size_median


def _value(proposal: Proposal) -> object:
    """What a reverted proposal is remembered by: a drafter by itself, whatever its k (its model's best k moves from
    window to window, and a switch to it at k 6, 5, 8 and 4 in turn measured the same 1.05-1.11x); a probe of the
    other speculation mode by its batch band (plain decoding that lost at 6 sequences says nothing of 16, and
    remembered by kind alone it held off the probe at 16 sequences for a whole phase of the controller bench)."""
    config = proposal.config
    return {"draft_len": config.draft_len_bands, "spec_method": config.spec_method,
            "capacity_factor": config.capacity_factor, "fallback_probe": proposal.inputs.get("band"),
            "speculation_probe": proposal.inputs.get("band")}.get(proposal.kind, proposal.kind)
