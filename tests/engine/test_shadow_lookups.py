"""Prompt lookup in the shadow of the decoding in use: the acceptance it would have had at k 8, measured without
verifying."""
from engine.engine import SHADOW_DRAFT_LEN
from engine.runtime.sequence import Sequence
from engine.speculative.drafters import shadow_lookups
from seam import EngineConfig, SamplingParams
from tests.engine.helpers import code_prompts, generate, make_engine

PROMPT = list(range(10, 30))          # 20 distinct tokens


def test_a_shadow_draft_is_counted_once_length_tokens_follow_it_and_the_next_starts_after_its_bonus_token():
    seq = Sequence("r", PROMPT, SamplingParams(max_tokens=64))
    seq.tokens += [10, 11, 12, 13]
    assert shadow_lookups(seq, 4, 1, 4) == []                # 3 tokens follow the first draft's start: not yet
    seq.tokens += [99]
    # drafted after "10": 11 12 13 14; generated 11 12 13 99: three accepted; next after 99 (the bonus token)
    assert shadow_lookups(seq, 4, 1, 4) == [(4, 3)]
    seq.tokens += [15, 16, 17, 18]
    # after "... 13 99": no earlier 99, so no draft; then after "99 15": drafts 16 17 18 19, 16 17 18 generated so far
    assert shadow_lookups(seq, 4, 1, 4) == [(0, 0)]
    assert shadow_lookups(seq, 4, 1, 4) == []                # nothing new: nothing counted twice
    seq.tokens += [19]
    assert shadow_lookups(seq, 4, 1, 4) == [(4, 4)]


def test_plain_decodings_shadow_measures_the_acceptance_prompt_lookup_then_has(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 8)
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain = make_engine(moe_models, EngineConfig(spec_method="off", draft_len=0))
    generate(plain, prompts, params, batch_size=4)
    shadow = plain.snapshot()
    speculating = make_engine(moe_models, EngineConfig(spec_method="ngram", draft_len=SHADOW_DRAFT_LEN))
    generate(speculating, prompts, params, batch_size=4)
    real = speculating.snapshot()
    assert shadow.drafted_tokens == 0 and shadow.shadow_lookups > 0
    assert len(shadow.shadow_drafted_per_position) == SHADOW_DRAFT_LEN
    shadow_rates = [a / d for a, d in zip(shadow.shadow_accepted_per_position, shadow.shadow_drafted_per_position)]
    real_rates = [a / d for a, d in zip(real.accepted_per_position, real.drafted_per_position)]
    # greedy: the same tokens, and the shadow drafts where speculation did; only requests' last tokens differ
    assert all(abs(s - r) <= 0.05 for s, r in zip(shadow_rates, real_rates)), (shadow_rates, real_rates)
    # prompt lookup drafting k 8 is shadowed too (its model learns from one kind of count), and the shadow agrees
    own_rates = [a / d for a, d in zip(real.shadow_accepted_per_position, real.shadow_drafted_per_position)]
    assert real.shadow_lookups > 0 and all(abs(s - r) <= 0.05 for s, r in zip(own_rates, real_rates)), own_rates



def test_a_shorter_ks_shadow_measures_the_positions_it_does_not_draft(moe_models):
    prompts = code_prompts(moe_models.tokenizer, 8)
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain = make_engine(moe_models, EngineConfig(spec_method="off", draft_len=0))
    generate(plain, prompts, params, batch_size=4)
    short = make_engine(moe_models, EngineConfig(spec_method="ngram", draft_len=2))
    generate(short, prompts, params, batch_size=4)
    shadow, window = plain.snapshot(), short.snapshot()
    assert len(window.drafted_per_position) == 2 and window.shadow_lookups > 0
    assert len(window.shadow_drafted_per_position) == SHADOW_DRAFT_LEN and sum(window.shadow_accepted_per_position[2:])
    # greedy: the same tokens as plain decoding, so the same shadow drafts but for the requests' last tokens
    rates = [[a / d for a, d in zip(w.shadow_accepted_per_position, w.shadow_drafted_per_position)]
             for w in (shadow, window)]
    assert all(abs(p - s) <= 0.05 for p, s in zip(*rates)), rates
