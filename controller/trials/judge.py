"""The switchback judge: decides a trial from per-block samples of decode throughput (tokens per second of the
block's steps that ran no prefill: a prefill costs the same under either config, yet one landing in a block swings
that block's tokens per busy second several-fold). When both arms deliver the same tokens (the same drafter, k by
batch size and capacity factor: a placement change, or an A/A trial), the tokens a step yields differ between blocks
only by the chance of which drafts were accepted, so the sample is sequences stepped per decode second instead: the
same ratio in expectation, without the acceptance noise that dominates tokens per second.

Blocks 2j and 2j + 1 of an Experiment ran back to back, one under each arm (ABBA order), so they saw the same
traffic; their log ratio (candidate over incumbent) cancels drift. What drift leaves between two adjacent blocks is
mostly a difference in batch size (a sequence joining or finishing), and throughput grows with batch size, so each
log ratio is adjusted by the Theil-Sen slope (scipy.stats.theilslopes) of the log ratios on the pairs' log batch-size
ratios: under identical arms that covariate is symmetric about zero, so the adjustment removes noise, not effect.
The test is the Wilcoxon signed-rank test of the adjusted log ratios (scipy.stats.wilcoxon: robust to the odd block
that a long prefill slowed down), with the Hodges-Lehmann estimate of the ratio and the interval of ratios the test
does not reject. Three outcomes:
- better: the interval's lower bound clears keep_gain (keep the candidate);
- worse: its upper bound is below keep_gain (the candidate cannot clear the bar: revert);
- no_difference: the interval lies within keep_gain x [1 / (1 + margin), 1 + margin] (stop, keep the incumbent);
otherwise the trial goes on, up to max_blocks, and then ends inconclusive (keep the incumbent). With
futility_confidence set, a look that is not the last also stops it as futile (keep the incumbent) when "ratio >=
keep_gain" is rejected at that lower one-sided confidence: a non-binding futility bound, which can only keep the
incumbent, so it spends none of the error rate of keeping a candidate.
Looks happen every min_samples pairs, K = max_blocks // (2 * min_samples) of them planned. Look k spends a share of
the error rate 1 - confidence in proportion to k, and the last look (max_blocks reached, or look K) spends whatever
the earlier looks left: the shares sum to 1 - confidence, so (by Bonferroni) stopping at the first decisive look
keeps the error rate within it however the trial ends, and the later looks, which have the most pairs, get the
larger shares. An early look whose pairs could not reach its share (n pairs give no one-sided p below 2^-n, the
exact test's smallest) is planned out before the trial starts: it spends nothing, and the looks left share its part;
it still checks futility, which spends none.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import stats

from controller.outcomes import JudgeOutcome
from policies import JudgePolicy
from seam import Block, EngineConfig

BETTER: JudgeOutcome = "better"
WORSE: JudgeOutcome = "worse"
NO_DIFFERENCE: JudgeOutcome = "no_difference"
FUTILE: JudgeOutcome = "futile"
INCONCLUSIVE: JudgeOutcome = "inconclusive"
EXACT_UP_TO = 25      # pairs up to which the signed-rank test uses its exact null distribution
MIN_PAIRS_TO_ADJUST = 8   # fewer pairs than this are not adjusted for batch size: a slope from them is mostly noise
MOVED_PAIRS = 8       # decoded pairs in a row that step alike: the load left the batch sizes a trial changes


def min_pairs_for_interval(confidence: float) -> int:
    """Fewer pairs than this get no interval at confidence: the exact signed-rank test's smallest one-sided p is
    2^-pairs (every pair agreeing), and while it is not below (1 - confidence) / 2 the test rejects no ratio on either
    side, so the interval is (0, inf) and says nothing. 6 pairs at 95 %, 8 at 99 %, 9 at 99.5 %."""
    return math.floor(math.log2(2 / (1 - confidence))) + 1


@dataclass(frozen=True)
class Comparison:
    """Candidate / incumbent decode throughput over paired blocks: the Hodges-Lehmann estimate of the ratio,
    its confidence interval, and the signed-rank p-value of "no difference"."""
    effect: float
    low: float
    high: float
    p_value: float


def paired_log_ratios(incumbent: Iterable[float], candidate: Iterable[float],
                      incumbent_batch: Iterable[float | None] = (),
                      candidate_batch: Iterable[float | None] = ()) -> tuple[np.ndarray, float]:
    """Per pair log(candidate / incumbent), adjusted for the pairs' batch sizes when every pair has them, and the
    slope the adjustment used (0.0 when not adjusted). Samples must be > 0 (ValueError otherwise)."""
    incumbent, candidate = np.asarray(list(incumbent), float), np.asarray(list(candidate), float)
    if (incumbent <= 0).any() or (candidate <= 0).any():
        raise ValueError("throughput samples must be > 0 to compare their logs")
    ratios = np.log(candidate) - np.log(incumbent)
    batches = list(zip(incumbent_batch, candidate_batch))
    if len(batches) != len(ratios) or len(ratios) < MIN_PAIRS_TO_ADJUST or any(None in pair for pair in batches):
        return ratios, 0.0
    covariate = np.log([c / i for i, c in batches])
    if np.ptp(covariate) == 0:
        return ratios, 0.0
    slope = float(stats.theilslopes(ratios, covariate).slope)
    return ratios - slope * covariate, slope


def compare(log_ratios: np.ndarray, confidence: float) -> Comparison | None:
    """Paired comparison by the Wilcoxon signed-rank test of the pairs' log(candidate / incumbent); the interval is the
    set of ratios that test does not reject (each side at (1 - confidence) / 2). None if it cannot be tested (fewer
    than 2 pairs, or every pair with the same ratio)."""
    log_ratios = np.asarray(log_ratios, float)
    if len(log_ratios) < 2 or np.ptp(log_ratios) == 0:
        return None
    walsh = np.add.outer(log_ratios, log_ratios)[np.triu_indices(len(log_ratios))] / 2
    alpha = (1 - confidence) / 2
    low = _bound(log_ratios, lambda shift: _p(log_ratios - shift, "greater") < alpha, rejected_below=True)
    high = _bound(log_ratios, lambda shift: _p(log_ratios - shift, "less") < alpha, rejected_below=False)
    return Comparison(math.exp(float(np.median(walsh))), math.exp(low), math.exp(high),
                      _p(log_ratios, "two-sided"))


def _bound(log_ratios: np.ndarray, rejected, rejected_below: bool, steps: int = 40) -> float:
    """Where the test stops rejecting a shift: the interval's lower end (shifts below it rejected) or upper end
    (shifts above it rejected), by bisection between the smallest and largest log ratio; +-inf if no shift there
    is rejected."""
    inside, outside = (log_ratios.max(), log_ratios.min() - 1e-9) if rejected_below else \
        (log_ratios.min(), log_ratios.max() + 1e-9)
    if not rejected(outside):
        return -math.inf if rejected_below else math.inf
    for _ in range(steps):
        middle = (inside + outside) / 2
        inside, outside = (inside, middle) if rejected(middle) else (middle, outside)
    return float(outside)


def _p(differences: np.ndarray, alternative: str) -> float:
    """The exact null distribution for small samples without ties or zeros, the normal approximation otherwise
    (scipy's own default would fall back to a slow permutation test on ties)."""
    if not differences.any():
        return 1.0
    magnitudes = np.abs(differences)
    exact = len(differences) <= EXACT_UP_TO and magnitudes.all() and len(np.unique(magnitudes)) == len(magnitudes)
    return float(stats.wilcoxon(differences, alternative=alternative, method="exact" if exact else "approx").pvalue)


def classify(log_ratios: np.ndarray, confidence: float, keep_gain: float, margin: float) -> str | None:
    """The outcome the signed-rank test decides at this confidence, or None if it decides nothing yet: better if
    "ratio <= keep_gain" is rejected, worse if "ratio >= keep_gain" is, no difference if both "ratio <= keep_gain /
    (1 + margin)" and "ratio >= keep_gain x (1 + margin)" are (two one-sided tests). The same as asking where
    compare()'s interval lies, without computing it."""
    log_ratios = np.asarray(log_ratios, float)
    if len(log_ratios) < 2:
        return None
    alpha, bar = (1 - confidence) / 2, math.log(keep_gain)
    if _p(log_ratios - bar, "greater") < alpha:
        return BETTER
    if _p(log_ratios - bar, "less") < alpha:
        return WORSE
    band = math.log(1 + margin)
    if _p(log_ratios - bar + band, "greater") < alpha and _p(log_ratios - bar - band, "less") < alpha:
        return NO_DIFFERENCE
    return None


def look_shares(looks: int, min_samples: int, alpha: float) -> list[float]:
    """The error rate each planned look spends (look k after k x min_samples pairs): shares in proportion to k over
    the looks that could use theirs, 0 for an early look whose smallest one-sided p (2^-pairs) is not below half its
    share. Dropping a look raises the others' shares, so the plan is redrawn until every early look left can use its
    share. The last look always stays."""
    kept = list(range(1, looks + 1))
    while True:
        shares = {k: alpha * k / sum(kept) for k in kept}
        powerless = [k for k in kept if k < looks and 2.0 ** -(k * min_samples) >= shares[k] / 2]
        if not powerless:
            return [shares.get(k, 0.0) for k in range(1, looks + 1)]
        kept = [k for k in kept if k not in powerless]


@dataclass
class Verdict:
    """What a look found; outcome None means the trial goes on."""
    outcome: JudgeOutcome | None
    reason: str
    pairs: int
    blocks: int
    look: int
    looks: int
    look_confidence: float
    keep_gain: float
    comparison: Comparison | None = None
    batch_slope: float = 0.0
    samples: dict = field(default_factory=dict)

    @property
    def decided(self) -> bool:
        return self.outcome is not None

    def evidence(self) -> dict:
        """The figures a decision records as its inputs."""
        out = {k: v for k, v in asdict(self).items() if k not in ("comparison", "reason")}
        out["comparison"] = None if self.comparison is None else self._comparison_evidence(self.comparison)
        out["test"] = ("Wilcoxon signed-rank test of paired log(candidate / incumbent) block ratios, adjusted by "
                       "batch_slope x log(candidate / incumbent mean decode batch size) (Theil-Sen) "
                       "(scipy.stats.wilcoxon); Hodges-Lehmann effect; interval by inverting the test")
        return out

    def _comparison_evidence(self, comparison: Comparison) -> dict:
        """A bound the test could not place (it rejects no ratio on that side: too few or too uneven pairs) is null,
        and interval_note says so; an infinite one would be no JSON."""
        unplaced = [side for side, bound in (("lower", comparison.low), ("upper", comparison.high))
                    if not 0 < bound < math.inf]
        evidence = {"effect": round(comparison.effect, 4),
                    "interval": [None if "lower" in unplaced else round(comparison.low, 4),
                                 None if "upper" in unplaced else round(comparison.high, 4)],
                    "p_value": comparison.p_value}
        if unplaced:
            evidence["interval_note"] = (f"{' and '.join(unplaced)} bound unknown: at {self.look_confidence:.2%} the "
                                         f"signed-rank test of {self.pairs} block pairs rejects no ratio beyond it")
        return evidence


def _bound_text(bound: float) -> str:
    return f"{bound:.3f}" if 0 < bound < math.inf else "unknown"


def same_tokens(incumbent: EngineConfig, candidate: EngineConfig) -> bool:
    """Do the two configs deliver the same tokens, step for step in distribution? Then only their speed differs."""
    def drafting(config: EngineConfig) -> tuple:
        if config.longest_draft_len == 0:
            return "off", config.capacity_factor
        return config.spec_method, config.draft_len_bands, config.ngram_min, config.ngram_max, config.capacity_factor
    return drafting(incumbent) == drafting(candidate)


def step_alike(incumbent: EngineConfig, candidate: EngineConfig, batch_size: int) -> bool:
    """Would a step of batch_size sequences run the same under both configs? (Schedules that differ only at other
    batch sizes: a pair of blocks at such batch sizes measures noise, not the change.)"""
    def step(config: EngineConfig) -> tuple:
        k = config.draft_len_for(batch_size)
        common = (config.capacity_factor, config.placement)
        return (config.spec_method, k, config.ngram_min, config.ngram_max, *common) if k else ("off", *common)
    return step(incumbent) == step(candidate)


class SwitchbackJudge:
    def __init__(self, settings: JudgePolicy, keep_gain: float, same_tokens: bool = False,
                 configs: tuple[EngineConfig, EngineConfig] | None = None):
        """same_tokens: both arms deliver the same tokens (see same_tokens()), and their blocks count the sequences
        they stepped: the sample is sequences stepped per decode second rather than tokens per decode second.
        configs: (incumbent, candidate); pairs whose blocks ran at batch sizes where the two step alike are left
        out (a schedule changed at 16 sequences is judged on the steps of 12-22 sequences only)."""
        self.settings, self.keep_gain, self.configs = settings, keep_gain, configs
        self.sample = "decode_sequence_steps_per_second" if same_tokens else "decode_tokens_per_second"
        self.looks = max(1, settings.max_blocks // (2 * settings.min_samples))
        self._shares = look_shares(self.looks, settings.min_samples, 1 - settings.confidence)
        self._blocks: dict[tuple[str, int], Block] = {}
        self._looked = 0
        self._alpha_spent = 0.0

    def add(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            self._blocks[(block.source, block.index)] = block

    def _closed_pairs(self) -> list[tuple[Block, Block]]:
        """(incumbent, candidate) blocks of each pair whose two blocks have both closed, in order."""
        out = []
        for (source, index), first in sorted(self._blocks.items()):
            second = self._blocks.get((source, index + 1))
            if index % 2 or second is None or first.arm == second.arm:
                continue
            out.append((first, second) if first.arm == "incumbent" else (second, first))
        return out

    def _complete_pairs(self) -> list[tuple[Block, Block]]:
        """The closed pairs that can tell the two configs apart."""
        return [pair for pair in self._closed_pairs() if not self._alike(*pair)]

    def load_moved(self) -> bool:
        """Did the last MOVED_PAIRS closed pairs all run where the two configs step alike, by the batch size of all
        their steps (prefills included: where prefills are frequent, as with long prompts at 6 sequences, pairs of
        decode-only blocks are rare, and waiting for 8 of them held a probe 21 s of a 10 s phase in the controller
        bench)? The load left the batch sizes the trial changes, and waiting for it to come back would hold every
        other trial up. MOVED_PAIRS rather than a look's min_samples: 16 pairs at 16 sequences took 10-30 s there,
        and a probe at 6-11 sequences held the one trial slot until the last second of the phase at 16."""
        last = [pair for pair in self._closed_pairs() if all(b.batch_size is not None for b in pair)][-MOVED_PAIRS:]
        return len(last) == MOVED_PAIRS and all(self._alike(*pair, by="batch_size") for pair in last)

    def _alike(self, *blocks: Block, by: str = "decode_batch_size") -> bool:
        """Did both arms' blocks run at batch sizes (the attribute by) where the two configs step alike?"""
        if self.configs is None:
            return False
        sizes = [round(getattr(b, by)) for b in blocks if getattr(b, by) is not None]
        return len(sizes) == len(blocks) and all(step_alike(*self.configs, size) for size in sizes)

    def pairs(self) -> list[tuple[Block, Block]]:
        """The pairs whose blocks both ran decode-only steps, an even number of them (AB and BA pairs alike, so a
        linear trend in the traffic cancels)."""
        out = [(incumbent, candidate) for incumbent, candidate in self._complete_pairs()
               if getattr(incumbent, self.sample) > 0 and getattr(candidate, self.sample) > 0]
        return out[:len(out) // 2 * 2]

    def slower_tokens(self) -> tuple[float, int]:
        """Is the candidate delivering tokens with longer gaps? The one-sided signed-rank p-value of "the candidate's
        block mean inter-token gap is not longer than its paired incumbent block's", and the pairs it used (p = 1.0
        below 2). A prefill that stalls every running sequence lands in either arm's block at random, so one block's
        gap says little; a config that slows delivery makes most of its blocks the slower of their pair."""
        gaps = [(i.inter_token_seconds, c.inter_token_seconds) for i, c in self._complete_pairs()
                if i.inter_token_seconds and c.inter_token_seconds]
        if len(gaps) < 2:
            return 1.0, len(gaps)
        return _p(np.log([c / i for i, c in gaps]), "greater"), len(gaps)

    def _look_alpha(self, final: bool) -> float:
        """The error rate this look may spend: a share growing with the look's number, or all that is left."""
        if final:
            return 1 - self.settings.confidence - self._alpha_spent
        return self._shares[self._looked - 1]

    def look(self) -> Verdict | None:
        """A verdict at each planned look (every min_samples pairs), None between looks. The last look (max_blocks
        reached, or the load moved away from the batch sizes the trial changes) always decides: inconclusive if the
        evidence is not decisive by then."""
        pairs, blocks = self.pairs(), len(self._blocks)
        moved = self.load_moved()
        exhausted = blocks >= self.settings.max_blocks or moved
        if not exhausted and len(pairs) < (self._looked + 1) * self.settings.min_samples:
            return None
        self._looked += 1
        final = exhausted or self._looked >= self.looks
        look_alpha = self._look_alpha(final)
        self._alpha_spent += look_alpha
        confidence = 1 - look_alpha
        incumbent = [getattr(i, self.sample) for i, _ in pairs]
        candidate = [getattr(c, self.sample) for _, c in pairs]
        ratios, slope = paired_log_ratios(incumbent, candidate, [i.decode_batch_size for i, _ in pairs],
                                          [c.decode_batch_size for _, c in pairs])
        outcome = classify(ratios, confidence, self.keep_gain, self.settings.margin) if look_alpha else None
        if outcome is None and not final and self._futile(ratios):
            outcome = FUTILE
        if outcome is None and not final:
            reason = "not decisive yet" if look_alpha else (
                f"look {self._looked} is planned out: {len(pairs)} pairs could not reach its share of the error "
                "rate (only futility is checked)")
            return Verdict(None, reason, len(pairs), blocks, self._looked, self.looks, confidence, self.keep_gain)
        outcome = outcome or INCONCLUSIVE
        shown = confidence if look_alpha else self.settings.futility_confidence   # futile at a planned-out look
        comparison = compare(ratios, shown) if len(pairs) >= min_pairs_for_interval(shown) else None
        reason = self._reason(outcome, comparison, shown, len(pairs), blocks)
        if moved and outcome == INCONCLUSIVE:
            reason += f" (the last {MOVED_PAIRS} pairs ran at batch sizes where both configs step alike)"
        return Verdict(outcome, reason, len(pairs), blocks,
                       self._looked, self.looks, confidence, self.keep_gain, comparison, slope,
                       {"sample": self.sample, "incumbent": [round(x, 2) for x in incumbent],
                        "candidate": [round(x, 2) for x in candidate],
                        "incumbent_decode_batch_size": [i.decode_batch_size for i, _ in pairs],
                        "candidate_decode_batch_size": [c.decode_batch_size for _, c in pairs],
                        "incumbent_inter_token_seconds": [i.inter_token_seconds for i, _ in pairs],
                        "candidate_inter_token_seconds": [c.inter_token_seconds for _, c in pairs]})

    def _futile(self, log_ratios: np.ndarray) -> bool:
        """Is "ratio >= keep_gain" rejected at futility_confidence (one-sided)?"""
        futility = self.settings.futility_confidence
        if futility is None or len(log_ratios) < 2:
            return False
        return _p(log_ratios - math.log(self.keep_gain), "less") < 1 - futility

    def _reason(self, outcome: JudgeOutcome, comparison: Comparison | None, confidence: float, pairs: int,
                blocks: int) -> str:
        if comparison is None:
            return (f"{pairs} block pairs that can be tested after {blocks} blocks (an interval at {confidence:.2%} "
                    f"needs {min_pairs_for_interval(confidence)}): "
                    f"{'not enough evidence, ' if outcome == INCONCLUSIVE else ''}{outcome}")
        measured = (f"candidate / incumbent {comparison.effect:.3f}x, {confidence:.2%} interval "
                    f"[{_bound_text(comparison.low)}, {_bound_text(comparison.high)}], p = {comparison.p_value:.3g}, "
                    f"{pairs} block pairs "
                    f"(look {self._looked} of {self.looks})")
        verdicts = {BETTER: f"lower bound clears {self.keep_gain:.3f}x",
                    WORSE: f"upper bound below {self.keep_gain:.3f}x",
                    NO_DIFFERENCE: f"within {self.keep_gain:.3f}x +/- {self.settings.margin:.0%}: no difference",
                    INCONCLUSIVE: f"not decisive after {blocks} blocks: inconclusive"}
        if outcome == FUTILE:
            return (f"{measured}: below {self.keep_gain:.3f}x at {self.settings.futility_confidence:.0%} one-sided "
                    "confidence: futile")
        return f"{measured}: {verdicts[outcome]}"
