"""Drive an Engine to completion in tests; read a Prometheus exposition."""
from prometheus_client.parser import text_string_to_metric_families

from engine.engine import Engine
from engine.runtime.limits import EngineLimits
from seam import EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def make_engine(models, config: EngineConfig, limits: EngineLimits = EngineLimits(kv_cache_tokens=8192)) -> Engine:
    return Engine(models.target, models.tokenizer, models.draft, config, limits)


def generate(engine: Engine, prompts: list[list[int]], params=GREEDY, batch_size: int | None = None) -> list[list[int]]:
    """Output token ids per prompt, submitting batch_size requests at a time (all at once by default)."""
    batch_size = batch_size or len(prompts)
    outputs: dict[str, list[int]] = {}
    for first in range(0, len(prompts), batch_size):
        for i in range(first, min(first + batch_size, len(prompts))):
            engine.add_request(str(i), prompts[i], params)
        while engine.has_work:
            for emission in engine.step():
                outputs.setdefault(emission.request_id, []).extend(emission.token_ids)
    return [outputs.get(str(i), []) for i in range(len(prompts))]


def code_prompts(tokenizer, n: int, max_bytes: int = 200, seed: int = 0) -> list[list[int]]:
    from governor.loadgen import prompt_set

    return [tokenizer.encode(p.text) for p in prompt_set("code", n, seed=seed, max_bytes=max_bytes)]


def metric_value(exposition: str, name: str, **labels: str) -> float | None:
    """The value of the sample name{labels} in a Prometheus text exposition, or None if there is none."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None
