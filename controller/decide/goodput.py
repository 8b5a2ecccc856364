"""Expected goodput as a function of draft length k, from what the live engine measured.

Per sequence-step, k drafts yield E(k) = 1 + q_0 s_0 + ... + q_{k-1} s_{k-1} tokens: q_j is the share of
sequence-steps that drafted a token at position j (1 for a draft model; prompt lookup drafts only where the text
matches) and s_j the share of those drafts accepted through position j. Positions never measured extrapolate
geometrically from the last measured ratio. Both are counted per batch-size band: what the traffic asks for moves
with its load (a few long edits at once, many chats at once), and one acceptance for all bands proposed a larger k
for 16 sequences of prose from the copying measured at 6 sequences a few seconds before (1.07-1.12x predicted,
0.94-0.98x measured in the controller bench). Prompt lookup's model counts instead the lookups the engine makes in
the shadow of the decoding in use, plain decoding's or its own at any k (what k 8 would have drafted, against the
tokens then generated): its acceptance follows the traffic while no draft is verified, at every k up to 8 from one
kind of count, read as the drafts' tiling of the text (see _per_sequence_step).
A step costs verify(k) + draft(k) seconds: draft is its drafter's, verify all the rest (the target's forward, and
sampling the tokens it verifies: at 16 sequences of sampled prose, 13 ms a step besides the forward at k 4, 5 ms at
plain decoding). Both are measured on decode steps alone, as the judge's samples are: a prefill costs the same under
any config, and its seconds diluted every predicted gain (26-40 % of the steps' time at 6 sequences of the mixed
phase). Costs are measured per batch-size band (powers of two of each step's batch size: a Window carries each band's
steps apart) and per k, because verification costs more as k and the batch grow. A cost is the median of the last few
windows' figures (their lowest, the window that drafted least, put k 4 at 2 sequences of code 8 % below its mean).
The verify cost at a k not measured in a band moves from the k0 > 0 measured there nearest in tokens drafted (from
k0 = 0 where only plain decoding was) by the price of a verified draft token times the tokens k adds or removes,
batch x (D(k) - D(k0)) with D(k) the tokens drafted per sequence-step; before a price is known, it is a line through
the k measured (slope >= 0), the one cost where one was. The drafter's cost is such a line, or from one k0 scales by
D(k) / D(k0). The price is the band's own where its decode steps tell it: the least-squares fit of their
verify seconds on their batch size and draft tokens (prompt lookup drafts on some steps and not others). It differs
by band: measured on 2 cores with SmolLM2, 2.9 ms at 1 sequence and 1.0 ms at 16, and one price for all bands (the
Theil-Sen slope of verify seconds per step on tokens verified per step, over recent windows of every band) predicted
1.5-1.9x for k 4 -> 8 at 1 sequence of copying (1.3-1.5x measured) and 1.4-3.3x for plain decoding at 16 sequences
of prose (1.2-1.3x measured). A band without a fit of its own yet takes the power law of price on batch size through
the bands with theirs; the one price stands in where no band has a fit (a draft model drafts k for every sequence, so
its draft tokens do not vary apart from the batch size; plain decoding drafts none). Plain decoding's verify cost
where speculation runs is, once enough of them ran, that of the steps that drafted nothing: they run as its steps do.
Predicted tokens per busy second at k, relative to the current k: E(k) / E(k0) * cost(k0) / cost(k).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from controller.window_stats import sum_arrays
from seam import Window, batch_band

RECENT_WINDOWS = 5
SLOPE_WINDOWS = 40       # recent windows a price of a verified token is fitted on
MIN_SLOPE_WINDOWS = 3
MIN_TOKEN_SPREAD = 1.5   # ... once the most tokens verified per step is this many times the fewest
MIN_FIT_STEPS = 30       # a band's price of a draft token is fitted on its decode steps once this many ran,
MIN_DRAFT_SPREAD = 0.5   # ... their draft tokens varied by this standard deviation apart from their batch size,
MAX_PRICE_ERROR = 0.25   # ... and its standard error is at most this share of it
MIN_PLAIN_STEPS = 10     # decode steps that verified no draft token (and as many that verified some) before a band
                         # speculating takes plain decoding's cost from them


@dataclass
class _Costs:
    """Measured seconds per decode step at each k: the median of the last RECENT_WINDOWS windows at that k."""
    recent: dict[int, deque] = field(default_factory=dict)

    def observe(self, k: int, seconds: float) -> None:
        self.recent.setdefault(k, deque(maxlen=RECENT_WINDOWS)).append(seconds)

    @property
    def per_k(self) -> dict[int, float]:
        return {k: float(np.median(values)) for k, values in self.recent.items()}

    def at(self, k: int, one_point=None) -> float | None:
        """The cost at k: measured, on the line through the k measured, or (one k measured, or k below those
        measured) one_point(k0, cost) from the smallest k0 measured."""
        per_k = self.per_k
        if not per_k:
            return None
        if k in per_k:
            return per_k[k]
        ks = sorted(per_k)
        if len(ks) == 1 or k < ks[0]:
            return per_k[ks[0]] if one_point is None else one_point(ks[0], per_k[ks[0]])
        slope, intercept = np.polyfit(ks, [per_k[x] for x in ks], 1)
        if slope < 0:
            return per_k[max(x for x in ks if x <= k)]
        return float(intercept + slope * k)


@dataclass
class _Acceptance:
    """Counts per draft position, each window's added to the older ones decayed by (1 - memory)."""
    drafted: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    eligible: list[float] = field(default_factory=list)    # sequence-steps that could draft at each position (j < k)

    def add(self, drafted: list, accepted: list, eligible: list, memory: float) -> None:
        for j in range(len(eligible)):
            if j >= len(self.drafted):
                self.drafted.append(0.0)
                self.accepted.append(0.0)
                self.eligible.append(0.0)
            self.drafted[j] = (1 - memory) * self.drafted[j] + (drafted[j] if j < len(drafted) else 0)
            self.accepted[j] = (1 - memory) * self.accepted[j] + (accepted[j] if j < len(accepted) else 0)
            self.eligible[j] = (1 - memory) * self.eligible[j] + eligible[j]

    def survival(self) -> list[float]:
        return [a / d for d, a in zip(self.drafted, self.accepted) if d > 0]

    def reached(self) -> list[float]:
        """Per position j: the share of drafts that matched more than j tokens (never rising with j)."""
        shares = [min(a / e, 1.0) for d, a, e in zip(self.drafted, self.accepted, self.eligible) if d > 0]
        return np.minimum.accumulate(shares).tolist() if shares else []

    def drafting(self) -> list[float]:
        return [min(d / e, 1.0) for d, e in zip(self.drafted, self.eligible) if d > 0]


@dataclass
class _Band:
    acceptance: _Acceptance = field(default_factory=_Acceptance)
    verify: _Costs = field(default_factory=_Costs)
    draft: _Costs = field(default_factory=_Costs)
    batch: deque = field(default_factory=lambda: deque(maxlen=RECENT_WINDOWS))
    decode_costs: deque = field(default_factory=lambda: deque(maxlen=SLOPE_WINDOWS))   # Window.decode_cost_sums

    def fitted_price(self) -> float | None:
        """Verify seconds per draft token verified, batch size held: the least-squares fit of decode steps' verify
        seconds s on their batch size b and draft tokens d, over the recent windows (the coefficient of d is the fit of
        s on d once both are taken net of b). None until those steps are many enough, their draft tokens vary apart
        from their batch size (a draft model's move with it alone), and the fit's standard error is small enough."""
        sums = sum_arrays(list(self.decode_costs))
        if not sums or sums[0] < MIN_FIT_STEPS:
            return None
        n, b, d, s, bb, bd, dd, bs, ds, ss = sums[:10]
        on_batch = np.linalg.pinv(np.array([[n, b], [b, bb]]))     # pinv: steps all of one batch size are singular
        d_net, s_net = np.array([d, bd]), np.array([s, bs])
        d_spread = dd - d_net @ on_batch @ d_net                     # sum of squares of d net of b
        if d_spread < n * MIN_DRAFT_SPREAD ** 2:
            return None
        price = (ds - d_net @ on_batch @ s_net) / d_spread
        residual = max(ss - s_net @ on_batch @ s_net - price ** 2 * d_spread, 0.0) / (n - 3)
        if price <= 0 or (residual / d_spread) ** 0.5 > MAX_PRICE_ERROR * price:
            return None
        return float(price)

    def plain_seconds(self, batch: float) -> float | None:
        """Verify seconds of a step of batch sequences that verifies no draft token, from the recent decode steps that
        drafted nothing (prompt lookup's where no sequence's text recurred: they run as plain decoding's steps do):
        the least-squares fit of their seconds s on b, d and z = [d = 0], at d = 0. The price's line, fitted mostly on
        steps that drafted, misses what a step that verifies drafts costs apart from their number: at 2 sequences of
        code with prompt lookup at k 4, it put plain decoding at 30.2 ms a step (28.7 ms measured), this fit at 26.8
        ms (27.0 ms measured in another run). None until MIN_PLAIN_STEPS of each kind ran."""
        sums = sum_arrays(list(self.decode_costs))
        if len(sums) < 14:
            return None
        n, b, d, s, bb, bd, dd, bs, ds, _, _, z, zb, zs = sums[:14]
        if min(z, n - z) < MIN_PLAIN_STEPS:
            return None
        gram = np.array([[n, b, d, z], [b, bb, bd, zb], [d, bd, dd, 0.0], [z, zb, 0.0, z]])
        intercept, per_sequence, _, undrafted = np.linalg.pinv(gram) @ np.array([s, bs, ds, zs])
        return float(intercept + per_sequence * batch + undrafted)


@dataclass
class Prediction:
    k: int
    tokens_per_step: float
    seconds_per_step: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.seconds_per_step


class GoodputModel:
    def __init__(self, memory: float = 0.2, shadowed: bool = False):
        self.memory = memory                 # each window decays a band's acceptance counts by (1 - memory): with
        # 0.1-0.3, E(4) predicted the next three windows' within 8-10 % (median) over two passes of the controller
        # bench's phases at k 4; with 0.5, within 11 % (a window of a few requests says little of the next ones)
        self.shadowed = shadowed             # prompt lookup's model: its acceptance is that of the shadow lookups
        self.bands: dict[int, _Band] = {}
        self.verified: deque = deque(maxlen=SLOPE_WINDOWS)    # (tokens verified per step, verify seconds per step)

    def observe(self, window: Window) -> None:
        """Each batch band's steps teach that band: a window that spans a change in load (16 sequences of prose
        finishing while a copy request starts) teaches both, rather than one band the mixture of the two."""
        for band, part in (window.by_band or {batch_band(window.batch_size_median): window}).items():
            self._observe(band, part)

    def _observe(self, band_index: int, window: Window) -> None:
        if window.steps == 0:
            return
        k, band = window.draft_len, self.bands.setdefault(band_index, _Band())
        band.batch.append(window.batch_size_mean)
        sums = window.decode_cost_sums
        if sums and sums[0] > 0:
            (steps, batch, draft_tokens, verify), draft = sums[:4], sums[10]
            band.verify.observe(k, verify / steps)
            if k > 0:
                band.draft.observe(k, draft / steps)
            band.decode_costs.append(sums)
            self.verified.append(((batch + draft_tokens) / steps, verify / steps))
        if self.shadowed and window.shadow_lookups:
            drafted, accepted = window.shadow_drafted_per_position, window.shadow_accepted_per_position
            eligible = [window.shadow_lookups] * len(drafted)
        else:
            drafted, accepted = window.drafted_per_position, window.accepted_per_position
            eligible = [window.batch_size_mean * window.steps] * max(k, len(drafted))
        band.acceptance.add(list(drafted), list(accepted), eligible, self.memory)

    def ready(self, band: int) -> bool:
        costs = self.bands.get(band)
        return costs is not None and bool(costs.verify.per_k) and bool(costs.draft.per_k) and bool(self.survival(band))

    def measured_bands(self) -> set[int]:
        return {band for band in self.bands if self.ready(band)}

    def measured_plain(self, band: int) -> bool:
        """Has a window of plain decoding measured the cost at k = 0 in band?"""
        return band in self.bands and 0 in self.bands[band].verify.per_k

    def predicts_plain(self, band: int) -> bool:
        """Can the model predict plain decoding's cost at band: measured there (by windows of plain decoding, or by the
        steps of speculation that drafted nothing), or moved from a k measured there by the price of a draft token?"""
        return self.measured_plain(band) or (self.ready(band) and (
            self.bands[band].plain_seconds(self._batch(band)) is not None
            or self.price_per_draft_token(band) is not None))

    def decode_steps(self, band: int) -> float:
        """Decode steps in band's recent windows: those its price of a draft token is fitted on."""
        return sum(sums[0] for sums in self.bands[band].decode_costs) if band in self.bands else 0.0

    def measured_ks(self, band: int) -> list[int]:
        return sorted(self.bands[band].draft.per_k) if band in self.bands else []

    def survival(self, band: int) -> list[float]:
        """s_j at band: share of drafts accepted through position j, for the positions measured."""
        return self.bands[band].acceptance.survival() if band in self.bands else []

    def drafting(self, band: int) -> list[float]:
        """q_j at band: share of sequence-steps that drafted a token at position j (of those whose k allowed one), for
        the positions measured."""
        return self.bands[band].acceptance.drafting() if band in self.bands else []

    def expected_tokens(self, k: int, band: int) -> float:
        """E(k): tokens per sequence-step at k."""
        return self._per_sequence_step(k, band)[0]

    def drafted_tokens(self, k: int, band: int) -> float:
        """D(k): tokens drafted per sequence-step at k."""
        return self._per_sequence_step(k, band)[1]

    def _per_sequence_step(self, k: int, band: int) -> tuple[float, float]:
        """(E(k), D(k)): 1 + the sum over positions j < k of q_j s_j, and q_0 + ... + q_{k-1}, positions past those
        measured extrapolated. Prompt lookup's below the positions its shadow measured: a lookup copies on from the
        span it found, so a shadow draft that matched a tokens (and verification's one more) takes ceil((a + 1) /
        (k + 1)) steps at k, each after the first drafting k. Counted per shadow draft instead, copying weighs as
        much as prose that matches nothing, while it runs fewer steps (at k 4 in the controller bench's mixed phase:
        1.43 tokens per sequence-step that way, 1.56 this way, 1.63-1.67 measured; this way within 3 % of the
        drafts' own count over the same steps of copy, code and mixed)."""
        drafting = self.drafting(band)
        reached = self.bands[band].acceptance.reached() if band in self.bands else []
        if not self.shadowed or k >= len(reached):
            shares = _extended(drafting, k)
            return 1.0 + sum(q * s for q, s in zip(shares, _extended(self.survival(band), k))), sum(shares)
        ends = [1.0, *reached, 0.0]
        matched = [ends[a] - ends[a + 1] for a in range(len(reached) + 1)]     # share of drafts matching a tokens
        steps = sum(share * math.ceil((a + 1) / (k + 1)) for a, share in enumerate(matched))
        tokens = sum(share * (a + 1) for a, share in enumerate(matched))
        return tokens / steps, (sum(drafting[:k]) + k * (steps - 1)) / steps

    def seconds_per_verified_token(self) -> float | None:
        """The marginal verify cost of one more token in a step, >= 0; None until recent windows verified
        numbers of tokens per step far enough apart (a batch or a k that changed) for a slope to stand out of the
        noise."""
        if len(self.verified) < MIN_SLOPE_WINDOWS:
            return None
        tokens, seconds = zip(*self.verified)
        if max(tokens) < MIN_TOKEN_SPREAD * min(tokens):
            return None
        return max(float(stats.theilslopes(seconds, tokens).slope), 0.0)

    def price_per_draft_token(self, band: int) -> float | None:
        """The verify seconds per draft token verified at band: the band's own fit where its decode steps tell it;
        else, from the bands whose own fits are known, the power law of price on batch size through them (the one
        band's price if one); else the seconds per verified token of every band's windows. In the controller bench
        a probe of plain decoding 5 s into 16 sequences of prose, before 30 decode steps had run there, took that
        last price (set by 1 sequence of copying) and predicted 4.0x; it measured 1.26x."""
        prices = {b: price for b, costs in self.bands.items() if (price := costs.fitted_price()) is not None}
        if band in prices:
            return prices[band]
        if not prices:
            return self.seconds_per_verified_token()
        if len(prices) == 1:
            return next(iter(prices.values()))
        slope, intercept = np.polyfit([np.log(self._batch(b)) for b in prices], np.log(list(prices.values())), 1)
        return float(np.exp(intercept + slope * np.log(self._batch(band))))

    def _batch(self, band: int) -> float:
        """The mean batch size of band's recent windows (the band's middle if none)."""
        batch = self.bands[band].batch if band in self.bands else ()
        return float(np.mean(batch)) if batch else 2.0 ** band

    def predict(self, k: int, band: int) -> Prediction:
        costs = self.bands[band]
        verify = self._verify_seconds(k, band)
        draft = 0.0 if k == 0 else costs.draft.at(k, lambda k0, cost: self._draft_scaled(cost, k0, k, band))
        return Prediction(k, self.expected_tokens(k, band) if k > 0 else 1.0, max(verify + draft, 1e-9))

    def _verify_seconds(self, k: int, band: int) -> float:
        """The verify cost at k: measured; else, once a draft token has a price, moved from the k0 > 0 measured nearest
        in draft tokens; else the line through the k measured. A line in k through k 0 cuts under the cost of the k
        between: prompt lookup's tokens drafted per step are concave in k (its matches end), and a step that verifies
        any draft costs more than their number says. At 6 sequences of the controller bench's mixed phase, with k 0
        and 8 measured, the line put k 2 at 63.4 ms a step and k 8 -> 2 at 1.08x; moved from k 8, 66.0 ms and 1.04x;
        measured 67.1 ms and 1.01x. In the bench, k 8 -> 2 and k 4 -> 1 there were predicted 1.13-1.33x and measured
        0.84-0.90x. Never below plain decoding's cost at the band where that is known: a step that verifies drafts
        costs at least what one that verifies none does, while a move can overshoot it when the cost at k0 and the
        tokens drafted come from different windows (in the bench, k 8 measured over 2 s as prose-hot began and moved
        to k 1 at 19 sequences put k 1 15 % below plain decoding and predicted 1.25x; 0.94-1.06x measured)."""
        measured = self.bands[band].verify.per_k
        if k in measured:
            return measured[k]
        drafting = [k0 for k0 in measured if k0 > 0]
        if k > 0 and drafting and self.price_per_draft_token(band) is not None:
            drafted = self.drafted_tokens(k, band)
            k0 = min(drafting, key=lambda measured_k: abs(self.drafted_tokens(measured_k, band) - drafted))
            cost = self._verify_moved(measured[k0], k0, k, band)
        else:
            cost = self.bands[band].verify.at(k, lambda k0, cost: self._verify_moved(cost, k0, k, band))
        if k == 0:
            return cost
        plain = measured[0] if 0 in measured else self.bands[band].plain_seconds(self._batch(band))
        return cost if plain is None else max(cost, plain)

    def _verify_moved(self, cost: float, k0: int, k: int, band: int) -> float:
        """The verify cost at k from its cost at k0: the verified tokens k adds (or removes), at the price of a draft
        token (unchanged while that is not measured yet); plain decoding's, where enough steps of k0 drafted nothing,
        theirs."""
        if k == 0 and (plain := self.bands[band].plain_seconds(self._batch(band))) is not None:
            return plain
        per_token = self.price_per_draft_token(band)
        if per_token is None:
            return cost
        added = self.drafted_tokens(k, band) - self.drafted_tokens(k0, band)
        return max(cost + per_token * self._batch(band) * added, 0.0)

    def _draft_scaled(self, cost: float, k0: int, k: int, band: int) -> float:
        """The drafter's cost at k from its cost at k0: in proportion to the positions drafted."""
        drafted = self.drafted_tokens(k0, band)
        return cost * self.drafted_tokens(k, band) / drafted if drafted > 0 else cost

    def gain(self, candidate: int, current: int, band: int) -> float:
        """Predicted tokens per busy second at candidate over current."""
        return self.predict(candidate, band).tokens_per_second / self.predict(current, band).tokens_per_second

    def best(self, ks: range, band: int) -> Prediction:
        return max((self.predict(k, band) for k in ks), key=lambda p: p.tokens_per_second)

    def describe(self, band: int) -> dict:
        costs = self.bands.get(band, _Band())
        per_token = self.price_per_draft_token(band)
        return {"survival": [round(s, 4) for s in self.survival(band)],
                "drafting": [round(q, 4) for q in self.drafting(band)],
                "batch_band": band,
                "seconds_per_draft_token": None if per_token is None else round(per_token, 7),
                "verify_seconds_per_step": {k: round(v, 6) for k, v in sorted(costs.verify.per_k.items())},
                "draft_seconds_per_step": {k: round(v, 6) for k, v in sorted(costs.draft.per_k.items())}}


def _extended(shares: list[float], k: int) -> list[float]:
    """The first k shares, positions past those measured extrapolated geometrically from the last measured ratio."""
    if k <= len(shares) or not shares:
        return shares[:k]
    ratio = shares[-1] / shares[-2] if len(shares) >= 2 and shares[-2] > 0 else shares[-1]
    ratio = min(max(ratio, 0.0), 1.0)
    return shares + [shares[-1] * ratio ** (j + 1) for j in range(k - len(shares))]
