"""The goodput model's what-if for k, on windows from a known cost law: a step costs a fixed part plus a price per
token the target verifies, the drafter costs a price per drafted token, and prompt lookup drafts on only some steps."""
import dataclasses

import pytest

from controller.decide.goodput import GoodputModel
from seam import LatencySummary, Window, batch_band, decode_cost_terms
from tests.controller.windows import decoding

EMPTY = LatencySummary.of([])
FIXED, PER_TOKEN, PER_DRAFT, OVERHEAD = 0.020, 0.004, 0.001, 0.002     # seconds


def _window(k: int, batch: int, drafting: float = 1.0, accepted: float = 0.8, steps: int = 100) -> Window:
    """steps steps at k and batch: a share `drafting` of sequence-steps draft all k positions, each accepted through
    position j with probability accepted ** (j + 1)."""
    drafted = [round(steps * batch * drafting)] * k
    kept = [round(d * accepted ** (j + 1)) for j, d in enumerate(drafted)]
    verified = batch + sum(drafted) / steps
    target = steps * (FIXED + PER_TOKEN * verified)
    draft = PER_DRAFT * sum(drafted)
    return decoding(Window(
        start=0.0, end=1.0, config_version=1, spec_method="ngram" if k else "off", draft_len=k, steps=steps,
        num_drafts=drafted[0] if k else 0, drafted_tokens=sum(drafted), accepted_tokens=sum(kept),
        drafted_per_position=drafted, accepted_per_position=kept, emitted_tokens=steps * batch + sum(kept),
        prefill_tokens=0, finished_requests=1, target_forward_seconds=target, draft_forward_seconds=draft,
        step_seconds=target + draft + steps * OVERHEAD, ttft_seconds=EMPTY, inter_token_seconds=EMPTY,
        e2e_seconds=EMPTY, batch_size_mean=float(batch), batch_size_max=batch, queue_depth_mean=0.0,
        queue_depth_max=0, expert_tokens=None))


def _true_tokens_per_second(k: int, batch: int, drafting: float, accepted: float) -> float:
    """What the cost law and acceptance above give, per sequence."""
    tokens = 1 + drafting * sum(accepted ** (j + 1) for j in range(k))
    seconds = FIXED + PER_TOKEN * batch * (1 + drafting * k) + PER_DRAFT * batch * drafting * k + OVERHEAD
    return tokens / seconds


@pytest.mark.parametrize("drafting", [1.0, 0.4])
def test_with_one_k_measured_a_larger_k_costs_the_tokens_it_adds_to_verify(drafting):
    model = GoodputModel()
    for batch in (1, 4, 16):                       # the load moved through three bands at k = 4
        model.observe(_window(4, batch, drafting))
    band = batch_band(1)
    assert model.measured_ks(band) == [4] and model.seconds_per_verified_token() == pytest.approx(PER_TOKEN)
    for k in (2, 6, 8):
        truth = _true_tokens_per_second(k, 1, drafting, 0.8) / _true_tokens_per_second(4, 1, drafting, 0.8)
        assert model.gain(k, 4, band) == pytest.approx(truth, rel=0.02)


def test_a_step_cost_measured_once_is_held_flat_until_the_price_per_token_is_known():
    model = GoodputModel()
    for _ in range(5):                             # the same batch and k: nothing tells fixed from per-token cost
        model.observe(_window(4, 1))
    assert model.seconds_per_verified_token() is None
    flat = model.predict(6, 0)
    assert flat.seconds_per_step - model.predict(4, 0).seconds_per_step == pytest.approx(
        PER_DRAFT * 2, rel=0.01)                   # only the drafter's two more positions


def test_prompt_lookup_that_drafts_on_few_steps_yields_tokens_on_those_steps_only():
    model = GoodputModel()
    model.observe(_window(4, 2, drafting=0.25, accepted=0.5))
    assert model.drafting(batch_band(2)) == pytest.approx([0.25] * 4)
    assert model.expected_tokens(4, batch_band(2)) == pytest.approx(
        1 + 0.25 * sum(0.5 ** (j + 1) for j in range(4)), rel=0.01)


def test_positions_only_a_larger_k_reaches_are_shared_over_the_steps_that_could_draft_them():
    model = GoodputModel()
    for k in (4, 8, 4):
        model.observe(_window(k, 1, drafting=0.5))
    assert model.drafting(batch_band(1)) == pytest.approx([0.5] * 8)


def _shadowed(window: Window, accepted: float, lookups: int = 400, positions: int = 8) -> Window:
    """window with prompt lookup shadowing its plain decoding: lookups drafts of positions tokens, each accepted
    through position j with probability accepted ** (j + 1)."""
    return dataclasses.replace(window, shadow_lookups=lookups, shadow_drafted_per_position=[lookups] * positions,
                               shadow_accepted_per_position=[round(lookups * accepted ** (j + 1))
                                                            for j in range(positions)])


def test_prompt_lookups_model_takes_its_acceptance_from_the_shadow_of_plain_decoding_and_the_draft_models_does_not():
    lookup, draft = GoodputModel(shadowed=True), GoodputModel()
    for model in (lookup, draft):
        model.observe(_window(4, batch=1, accepted=0.9))
        model.observe(_shadowed(_window(0, batch=1), accepted=0.2))
        model.observe(_shadowed(_window(0, batch=1), accepted=0.2))
    band = batch_band(1)
    assert draft.survival(band)[0] == pytest.approx(0.9)                   # plain decoding says nothing of its drafts
    assert lookup.survival(band)[0] < 0.4 and len(lookup.survival(band)) == 8  # mostly the last windows' shadow
    assert lookup.expected_tokens(4, band) < draft.expected_tokens(4, band)


def test_each_batch_band_predicts_from_the_acceptance_measured_there():
    """Copying at 1 sequence, then prose at 16: the band of 16 sequences does not borrow the copying's acceptance."""
    model = GoodputModel()
    for _ in range(3):
        model.observe(_window(4, 1, accepted=0.9))
    model.observe(_window(4, 16, accepted=0.2))
    light, heavy = batch_band(1), batch_band(16)
    assert model.survival(light)[0] == pytest.approx(0.9) and model.survival(heavy)[0] == pytest.approx(0.2)
    assert model.gain(6, 4, light) > 1 > model.gain(6, 4, heavy)
    assert model.survival(batch_band(4)) == [] and not model.ready(batch_band(4))


def test_below_the_ks_measured_the_target_costs_the_tokens_it_no_longer_verifies():
    model = GoodputModel()
    for k, batch in ((4, 1), (8, 1), (4, 16)):
        model.observe(_window(k, batch))
    band = batch_band(1)
    assert model.measured_ks(band) == [4, 8] and not model.measured_plain(band)
    plain = model.predict(0, band).seconds_per_step
    assert plain == pytest.approx(FIXED + PER_TOKEN + OVERHEAD, rel=0.02)    # one token verified, nothing drafted


def test_plain_decodings_cost_where_speculation_runs_is_that_of_its_steps_that_drafted_nothing():
    """A step that verifies drafts costs more than their tokens' price (sampling them, the forward's shape): 40 of
    100 steps of prompt lookup at 2 sequences drafted nothing and ran as plain decoding's steps run, so they price it;
    the price's line through all the steps puts it 1.3 ms higher. Too few such steps, and the line stands in."""
    price, verifying, band = 0.004, 0.010, batch_band(2)

    def window(undrafted: int) -> Window:
        per_step = [0] * undrafted + [4, 8] * ((100 - undrafted) // 2)
        sums = [sum(terms) for terms in zip(*(decode_cost_terms(
            2, d, FIXED + price * (2 + d) + verifying * (d > 0) + OVERHEAD, PER_DRAFT * d) for d in per_step))]
        return dataclasses.replace(_window(4, 2, drafting=sum(per_step) / 800), decode_cost_sums=sums)

    model, sparse = GoodputModel(shadowed=True), GoodputModel(shadowed=True)
    for _ in range(2):
        model.observe(window(40))
        sparse.observe(window(4))
    assert model.predicts_plain(band)
    assert model.predict(0, band).seconds_per_step == pytest.approx(FIXED + price * 2 + OVERHEAD)
    assert sparse.bands[band].plain_seconds(2.0) is None and sparse.predict(0, band).seconds_per_step == \
        pytest.approx(sparse.predict(4, band).seconds_per_step - PER_DRAFT * 2 * sparse.drafted_tokens(4, band)
                      - sparse.price_per_draft_token(band) * 2 * sparse.drafted_tokens(4, band))


def test_between_the_ks_measured_a_k_costs_its_tokens_from_the_nearest_that_drafted_not_a_line_through_k_0():
    """Prompt lookup drafts fewer tokens at each later position (its matches end), so the tokens drafted per step are
    concave in k: k 2 drafts more than a quarter of k 8's. With plain decoding and k 8 measured at 6 sequences, k 2
    costs k 8 less the tokens it no longer drafts; a line in k through k 0 and k 8 puts it lower and predicts too much
    for k 8 -> 2."""
    price, batch, steps = 0.002, 6, 100
    shares = [0.5 * 0.8 ** j for j in range(8)]            # q_j: the share of sequence-steps drafting position j

    def window(k: int) -> Window:
        drafted = [round(steps * batch * q) for q in shares[:k]]
        per_step = [sum(drafted) // 50 + (i < sum(drafted) % 50) for i in range(50)] + [0] * 50
        sums = [sum(terms) for terms in zip(*(decode_cost_terms(
            batch, d, FIXED + price * (batch + d) + OVERHEAD, PER_DRAFT * d) for d in per_step))]
        return dataclasses.replace(
            _window(k, batch, steps=steps), drafted_per_position=drafted, accepted_per_position=drafted,
            num_drafts=drafted[0] if k else 0, drafted_tokens=sum(drafted), decode_cost_sums=sums)

    model, band = GoodputModel(), batch_band(batch)
    for k in (0, 0, 8, 8):
        model.observe(window(k))
    assert model.measured_ks(band) == [8] and model.price_per_draft_token(band) == pytest.approx(price)
    drafted = batch * model.drafted_tokens(2, band)
    assert drafted > batch * model.drafted_tokens(8, band) / 4
    assert model.predict(2, band).seconds_per_step == pytest.approx(
        FIXED + price * (batch + drafted) + OVERHEAD + PER_DRAFT * drafted)


def test_a_k_that_drafts_never_costs_less_than_plain_decoding_at_its_band():
    """k 8's cost measured on steps that drafted far less than the tokens drafted per step the model counts (in the
    bench: a 2 s probe's cost, later windows' drafts): moved down to k 1 by the price, its cost would fall below plain
    decoding's; a step that verifies drafts costs at least as much."""
    price, batch = 0.002, 16
    plain = dataclasses.replace(_window(0, batch), decode_cost_sums=[100 * term for term in decode_cost_terms(
        batch, 0, FIXED + price * batch + OVERHEAD, 0.0)])
    per_step = [0, 16] * 50                                    # 8 draft tokens a step, where D(8) says 128
    sums = [sum(terms) for terms in zip(*(decode_cost_terms(
        batch, d, FIXED + price * (batch + d) + OVERHEAD, 0.0) for d in per_step))]    # a drafter that costs nothing
    drafting = dataclasses.replace(_window(8, batch), decode_cost_sums=sums)
    model, band = GoodputModel(), batch_band(batch)
    for window in (plain, plain, drafting, drafting):
        model.observe(window)
    assert model.price_per_draft_token(band) == pytest.approx(price)
    assert model.predict(8, band).seconds_per_step < model.predict(0, band).seconds_per_step + \
        price * batch * (model.drafted_tokens(8, band) - model.drafted_tokens(1, band))
    assert model.predict(1, band).seconds_per_step == pytest.approx(model.predict(0, band).seconds_per_step)


def _looked_up(k: int, batch: int, price: float, drafting: float = 0.5, accepted: float = 0.8,
               steps: int = 100, per_sequence: float = 0.0) -> Window:
    """steps decode steps of prompt lookup at k and batch: on a share `drafting` of the steps every sequence finds a
    match and drafts k tokens, on the others none; a step's target costs FIXED + price per token it verifies (+
    per_sequence per sequence: attention over its context)."""
    drafting_steps = round(steps * drafting)
    window = _window(k, batch, drafting, accepted, steps)
    per_step = [(batch, batch * k if i < drafting_steps else 0) for i in range(steps)]
    costs = [(FIXED + per_sequence * b + price * (b + d), PER_DRAFT * d) for b, d in per_step]
    sums = [sum(terms) for terms in zip(*(decode_cost_terms(b, d, target + OVERHEAD, draft)
                                          for (b, d), (target, draft) in zip(per_step, costs)))]
    return dataclasses.replace(window, target_forward_seconds=sums[3] - steps * OVERHEAD,
                               draft_forward_seconds=sums[10], decode_cost_sums=sums, step_seconds=sums[3] + sums[10])


def _truth(k: int, batch: int, price: float, drafting: float = 0.5, accepted: float = 0.8) -> float:
    tokens = 1 + drafting * sum(accepted ** (j + 1) for j in range(k))
    return tokens / (FIXED + price * batch * (1 + drafting * k) + PER_DRAFT * batch * drafting * k + OVERHEAD)


def test_each_band_prices_a_draft_token_from_its_own_decode_steps():
    """A verified token costs more at 1 sequence than at 16 (2.9 ms and 1.0 ms with SmolLM2 on 2 cores): one price
    for both bands would over-predict a larger k at 1 sequence and plain decoding at 16."""
    model = GoodputModel(shadowed=True)
    light_price, heavy_price = 0.004, 0.0005
    for _ in range(2):
        model.observe(_looked_up(4, 1, light_price))
        model.observe(_looked_up(4, 16, heavy_price))
    light, heavy = batch_band(1), batch_band(16)
    assert model.price_per_draft_token(light) == pytest.approx(light_price)
    assert model.price_per_draft_token(heavy) == pytest.approx(heavy_price)
    assert model.gain(8, 4, light) == pytest.approx(_truth(8, 1, light_price) / _truth(4, 1, light_price), rel=0.02)
    assert model.gain(0, 4, heavy) == pytest.approx(_truth(0, 16, heavy_price) / _truth(4, 16, heavy_price),
                                                    rel=0.02)


def test_draft_tokens_that_move_only_with_the_batch_size_leave_the_price_to_every_bands_windows():
    """A draft model drafts k for every sequence: within a band, tokens drafted per step tell nothing the batch size
    does not, so the band's price is not fitted and the one fitted across bands' windows stands in."""
    model = GoodputModel()
    for batch in (1, 4, 16):
        model.observe(_looked_up(4, batch, PER_TOKEN, drafting=1.0))
    band = batch_band(16)
    assert model.bands[band].fitted_price() is None
    assert model.price_per_draft_token(band) == model.seconds_per_verified_token() == pytest.approx(PER_TOKEN)


def test_a_band_without_a_fit_of_its_own_takes_the_power_law_through_the_bands_with_theirs():
    """16 sequences of prose just started (too few decode steps to fit there): the price at 1 and 4 sequences sets
    it, not the price over every band's windows (which a sequence's own cost, apart from its tokens, inflates)."""
    model = GoodputModel(shadowed=True)
    for _ in range(2):
        model.observe(_looked_up(4, 1, 0.004, per_sequence=0.01))
        model.observe(_looked_up(4, 4, 0.002, per_sequence=0.01))
    model.observe(_looked_up(4, 16, 0.001, steps=10, per_sequence=0.01))
    heavy = batch_band(16)
    assert model.bands[heavy].fitted_price() is None
    assert model.price_per_draft_token(heavy) == pytest.approx(0.001)          # 0.004 x (16 / 1) ^ -0.5
    assert model.seconds_per_verified_token() > 0.003


def test_a_cost_is_the_median_of_its_windows_decode_steps_and_counts_what_a_step_spends_besides_the_forward():
    """Prefills cost the same under any config and the judge leaves them out; sampling what a step verifies costs more
    at k 4 than at plain decoding, so it is measured per k, not shared across them."""
    model, band = GoodputModel(), batch_band(16)
    for seconds in (0.06, 0.05, 0.07):                          # 100 decode steps of `seconds` each, and a prefill
        decode = [100 * term for term in decode_cost_terms(16, 0, seconds, 0.0)]
        model.observe(dataclasses.replace(_window(0, 16), steps=101, step_seconds=100 * seconds + 2.0,
                                          target_forward_seconds=100 * seconds + 2.0, decode_cost_sums=decode))
    spec = _window(4, 16)
    spec = decoding(dataclasses.replace(spec, step_seconds=spec.step_seconds + 100 * 0.010))   # 10 ms a step more
    model.observe(spec)
    assert model.predict(0, band).seconds_per_step == pytest.approx(0.06)       # the median; not 0.05, nor 0.08
    assert model.predict(4, band).seconds_per_step == pytest.approx(spec.step_seconds / 100)


def test_prompt_lookups_tokens_per_step_below_the_positions_shadowed_count_the_steps_a_match_takes_at_k():
    """Half the shadow drafts match all 8 positions, half none: at k 4 the first take two steps for their 9 tokens,
    so 5 tokens come in 1.5 steps (3.33 per step); counted per draft, 1 + 0.5 x 4 = 3. A draft model's drafts are
    counted per step as they are."""
    lookup, draft = GoodputModel(shadowed=True), GoodputModel()
    half = dataclasses.replace(_window(4, 1), shadow_lookups=400, shadow_drafted_per_position=[200] * 8,
                               shadow_accepted_per_position=[200] * 8)
    lookup.observe(half)
    assert lookup.expected_tokens(4, 0) == pytest.approx(5 / 1.5)
    assert lookup.expected_tokens(8, 0) == pytest.approx(5)
    assert lookup.drafted_tokens(4, 0) == pytest.approx((0.5 * 4 + 4 * 0.5) / 1.5)   # the second step drafts 4 too
    draft.observe(_window(8, 1, drafting=0.5, accepted=1.0))
    assert draft.expected_tokens(4, 0) == pytest.approx(3)
