"""The engine: continuous batching with speculative decoding over a paged KV cache, one step at a time.

Not thread-safe except apply() and snapshot(); engine.server.service drives it from one thread.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable

import torch

from engine.model.batch import SequenceChunk, build_forward_batch
from engine.model.kv_cache import BlockAllocator, KVCache
from engine.model.moe_layer import LOCAL
from engine.model.tokenizer import Tokenizer
from engine.model.transformer import Transformer
from engine.moe.ep import ExpertParallel
from engine.moe.experts import ExpertRuntime, StepCounts, drop_logical_experts, expert_topology
from engine.runtime.delivery import Emission, Failure, append_tokens, emission_of
from engine.runtime.limits import EngineLimits
from engine.runtime.scheduler import Scheduled, Scheduler
from engine.runtime.sequence import Sequence
from engine.runtime.switchback import ORDER, Switchback
from engine.speculative.drafters import Drafter, Drafts, ModelDrafter, NgramDrafter, shadow_lookups
from engine.speculative.verify import verify
from engine.telemetry.recorder import StepRecord, Telemetry, TelemetrySink
from seam import EngineConfig, Experiment, SamplingParams, Window
from seam.placement import PlacementError, Topology, check_placement, identity_placement, tokens_per_device

SHADOW_DRAFT_LEN = 8     # positions of prompt lookup's acceptance measured in the shadow of the decoding in use


class RequestError(ValueError):
    """A request the engine cannot serve; the message names the field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class Engine:
    """ep: the expert-parallel group whose rank 0 this engine is (None: one process, every expert here).
    topology: where expert slots live (default: one slot per expert on each of the group's ranks)."""

    def __init__(self, target: Transformer, tokenizer: Tokenizer, draft: Transformer | None = None,
                 config: EngineConfig = EngineConfig(), limits: EngineLimits = EngineLimits(),
                 sinks: Iterable[TelemetrySink] = (), ep: ExpertParallel | None = None,
                 topology: Topology | None = None):
        if draft is not None and draft.spec.vocab_size != target.spec.vocab_size:
            raise ValueError(f"draft vocab_size {draft.spec.vocab_size} != target vocab_size {target.spec.vocab_size}")
        if ep is not None and draft is not None and set(draft.moe_blocks) & set(target.moe_blocks):
            raise ValueError("an expert-parallel target cannot draft with its own MoE layers (self:N); "
                             "use a separate draft model or prompt lookup")
        self.target, self.tokenizer, self.limits = target, tokenizer, limits
        self.device = next(target.parameters()).device
        dtype = next(target.parameters()).dtype
        self.allocator = BlockAllocator(limits.num_blocks, limits.block_size)
        num_slots = self.allocator.num_blocks * limits.block_size
        self.cache = KVCache(target.spec, num_slots, dtype, self.device)
        self.max_model_len = min([target.spec.max_position] + ([draft.spec.max_position] if draft else []))
        self.scheduler = Scheduler(self.allocator, limits.max_num_seqs, limits.max_batch_tokens, self.max_model_len)
        self.model_drafter = (ModelDrafter(draft, KVCache(draft.spec, num_slots, dtype, self.device), limits.block_size)
                              if draft is not None else None)
        self.telemetry = Telemetry(sinks)
        self.ep = ep
        self.experts = None
        if target.moe_blocks:
            topology = ep.topology if ep is not None else topology or expert_topology(target.spec.num_experts, 1)
            self.experts = ExpertRuntime(target, topology, ep.exchange if ep is not None else LOCAL)
        self._config_lock = threading.Lock()
        self._check(config)
        self._pending: EngineConfig | Experiment | None = None
        self.switchback: Switchback | None = None
        self._take(config)

    # -- the seam ---------------------------------------------------------------------------------

    def apply(self, change: EngineConfig | Experiment) -> None:
        """Take a config into use between two steps, or start alternating an Experiment's two configs in blocks
        (a later config ends it); requests in flight continue."""
        for config in (change.incumbent, change.candidate) if isinstance(change, Experiment) else (change,):
            self._check(config)
        with self._config_lock:
            self._pending = change

    def snapshot(self, reader: str = "default") -> Window:
        """What the engine measured since reader's previous snapshot; other readers' windows are untouched."""
        return self.telemetry.snapshot(self.desired_config, reader)

    def peek(self, reader: str = "default") -> Window:
        """reader's window so far, without closing it."""
        return self.telemetry.peek(self.desired_config, reader)

    @property
    def desired_config(self) -> EngineConfig:
        """The config the engine serves from its next step on: the one applied last (an Experiment not yet begun: the
        arm of its first block; one running: the arm in use). Not the config of the last step: between an apply and
        the next step, which can take seconds, that is one the controller has already replaced."""
        with self._config_lock:
            pending = self._pending
        if isinstance(pending, Experiment):
            return getattr(pending, ORDER[0])
        return pending or self.config

    def check(self, config: EngineConfig) -> None:
        """Raise RequestError if this engine cannot serve config; changes nothing."""
        self._check(config)

    # -- requests ---------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        self.check_request(prompt_ids, params)
        seq = Sequence(request_id, list(prompt_ids), params)
        self.scheduler.add(seq)
        return seq

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestError if the engine could never serve this request; reads only constants (thread-safe)."""
        if not prompt_ids:
            raise RequestError("prompt", "must not be empty")
        if not all(0 <= t < self.target.spec.vocab_size for t in prompt_ids):
            raise RequestError("prompt", f"token ids must be in 0..{self.target.spec.vocab_size - 1}")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise RequestError("max_tokens", f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) "
                               f"exceeds the model's context of {self.max_model_len} tokens")
        if self.allocator.blocks_for(len(prompt_ids) + params.max_tokens) > self.allocator.num_blocks:
            raise RequestError("max_tokens", "the request would not fit in the whole KV cache")

    def abort(self, request_id: str) -> bool:
        seq = self.scheduler.find(request_id)
        if seq is None:
            return False
        seq.finish_reason = "abort"
        self.scheduler.remove(seq)
        return True

    def fail_all(self, failure: Failure) -> list[Emission]:
        """End every request after an error inside a step, returning all their blocks."""
        failed = [*self.scheduler.running, *self.scheduler.waiting]
        for seq in failed:
            seq.finish_reason = "error"
            self.scheduler.remove(seq)
        return [dataclasses.replace(emission_of(seq), failure=failure) for seq in failed]

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # -- one step ---------------------------------------------------------------------------------

    def step(self) -> list[Emission]:
        self._adopt_pending_config()
        queue_depth = len(self.scheduler.waiting)
        draft_len = self.config.draft_len_for(self.scheduler.next_batch_size)
        plan = self.scheduler.schedule(draft_len)
        if not plan:
            return []
        started = time.perf_counter()
        sampling = [item for item in plan if item.samples]
        drafting = [item for item in sampling if item.draft_len > 0]
        drafts, draft_seconds = self._draft(drafting)
        chunks = [self._chunk(item) for item in plan]
        target_started = time.perf_counter()
        if self.ep is not None:
            self.ep.forward(chunks, self.config.capacity_factor)
        logits = self.target(build_forward_batch(chunks, self.limits.block_size, self.device), self.cache,
                             self.experts)
        _synchronize(self.device)
        target_seconds = time.perf_counter() - target_started
        expert_counts = self.experts.take_counts() if self.experts is not None else None
        self._verify(sampling, drafts, logits)

        now = time.perf_counter()
        emissions = []
        for item in plan:
            if not item.samples:
                item.seq.num_computed += item.num_new
        for item in sampling:
            seq = item.seq
            drafted_from = len(seq.tokens)
            seq.num_computed += item.num_new + item.accepted
            if item.proposed:
                self.drafter.accepted(seq, drafted_from, item.accepted)
            emissions.append(self._deliver(seq, item.proposed[:item.accepted] + [item.next_token], now))
        shadows = self._shadow_lookups(sampling)
        self.telemetry.record_step(self._step_record(plan, drafting, shadows, queue_depth,
                                                     time.perf_counter() - started, target_seconds, draft_seconds,
                                                     expert_counts))
        if self.switchback is not None:
            self.switchback.stepped()
        return emissions

    def _drafter_for(self, config: EngineConfig) -> Drafter | None:
        if config.spec_method == "draft_model":
            return self.model_drafter
        if config.spec_method == "ngram":
            return NgramDrafter(config.ngram_min, config.ngram_max, self.device)
        return None

    def _draft(self, drafting: list[Scheduled]) -> tuple[Drafts | None, float]:
        """Propose drafts for the drafting items, noting each one's tokens and row on the item."""
        if not drafting:
            return None, 0.0
        started = time.perf_counter()
        drafts = self.drafter.propose([item.seq for item in drafting], [item.draft_len for item in drafting])
        _synchronize(self.device)
        seconds = time.perf_counter() - started
        tokens, counts = drafts.tokens.tolist(), drafts.num_drafts.tolist()
        for row, item in enumerate(drafting):
            item.proposed, item.draft_row = tokens[row][:counts[row]], row
        return drafts, seconds

    @staticmethod
    def _chunk(item: Scheduled) -> SequenceChunk:
        seq = item.seq
        fed = seq.tokens[seq.num_computed:seq.num_computed + item.num_new] + item.proposed
        return SequenceChunk(fed, seq.num_computed, seq.block_table,
                             item.num_new - 1 if item.samples else len(fed))

    def _verify(self, sampling: list[Scheduled], drafts: Drafts | None, logits: torch.Tensor) -> None:
        verify(sampling, drafts, logits, self.device)

    # -- delivering tokens ------------------------------------------------------------------------

    def _deliver(self, seq: Sequence, tokens: list[int], now: float) -> Emission:
        start = seq.num_output
        append_tokens(seq, tokens, self.tokenizer, self.max_model_len)
        delivered = seq.num_output - start
        if delivered:
            ttft = now - seq.arrival if seq.first_token_at is None else None
            gap = None if ttft is not None else now - seq.last_token_at
            self.telemetry.record_tokens(count=delivered, ttft=ttft, gap=gap)
            seq.first_token_at = seq.first_token_at or now
            seq.last_token_at = now
        if seq.finished:
            self.scheduler.remove(seq)
            self.telemetry.record_finished(now - seq.arrival)
        emission = emission_of(seq)
        emission.token_ids = seq.output_ids[start:]
        return emission

    # -- bookkeeping ------------------------------------------------------------------------------

    def _shadow_lookups(self, sampling: list[Scheduled]) -> list[tuple[int, int]]:
        """(drafted, accepted) of each shadow draft of prompt lookup that the sequences resolved, in the steps whose
        windows prompt lookup's model learns from (plain decoding's and its own, at any k): its acceptance at every k
        up to SHADOW_DRAFT_LEN, from one kind of count (the controller bench's k 4 -> 8 trials had predicted
        1.23-1.40x from positions 5-8 extrapolated, and measured 1.46-1.62x). None beside the draft model (prompt
        lookup's model does not read its windows), and a sequence stepped there starts its shadow afresh when next
        shadowed (rather than from where it broke off, many tokens back)."""
        if self.config.spec_method not in ("off", "ngram"):
            for item in sampling:
                item.seq.shadow_at = 0
            return []
        return [shadow for item in sampling for shadow in shadow_lookups(
            item.seq, SHADOW_DRAFT_LEN, self.config.ngram_min, self.config.ngram_max)]

    def _step_record(self, plan: list[Scheduled], drafting: list[Scheduled], shadows: list[tuple[int, int]],
                     queue_depth: int, step_seconds: float, target_seconds: float, draft_seconds: float,
                     expert_counts: StepCounts | None) -> StepRecord:
        proposed = [len(item.proposed) for item in drafting]
        accepted = [item.accepted for item in drafting]
        k = max(proposed, default=0)
        return StepRecord(
            batch_size=len(plan), queue_depth=queue_depth, step_seconds=step_seconds,
            target_seconds=target_seconds, draft_seconds=draft_seconds,
            drafted_per_position=_reaching(proposed, k), accepted_per_position=_reaching(accepted, k),
            num_drafts=sum(p > 0 for p in proposed),
            prefill_tokens=sum(item.num_new for item in plan if item.prefill),
            shadow_lookups=len(shadows),
            shadow_drafted_per_position=_reaching([d for d, _ in shadows], SHADOW_DRAFT_LEN),
            shadow_accepted_per_position=_reaching([a for _, a in shadows], SHADOW_DRAFT_LEN),
            **self._moe_figures(expert_counts))

    def _moe_figures(self, counts: StepCounts | None) -> dict:
        if counts is None:
            return {}
        return {"expert_tokens": counts.expert_tokens, "slot_tokens": counts.slot_tokens,
                "rank_tokens": torch.from_numpy(tokens_per_device(counts.slot_tokens.numpy(), self.experts.topology)),
                "dropped_per_layer": counts.dropped_per_layer, "all_to_all_seconds": counts.all_to_all_seconds}

    def _adopt_pending_config(self) -> None:
        """A config that fails to take is dropped (the engine keeps the one in use, and reports its version)."""
        with self._config_lock:
            change = self._pending
        if change is not None:
            try:
                self._adopt(change)
            finally:
                with self._config_lock:
                    if self._pending is change:
                        self._pending = None
        block = self.switchback.due() if self.switchback is not None else None
        if block is not None:
            self.telemetry.begin_block(block.index, block.arm, block.config)
            if block.config != self.config:
                self._take(block.config)

    def _adopt(self, change: EngineConfig | Experiment) -> None:
        """Any change ends a running experiment; an Experiment starts alternating its arms with the next step."""
        if self.switchback is not None:
            self.switchback = None
            self.telemetry.end_experiment()
        if isinstance(change, Experiment):
            self.switchback = Switchback(change)
        else:
            self._take(change)

    def _take(self, config: EngineConfig) -> None:
        if self.experts is not None:
            placement = self._placement_of(config)
            if placement != self.experts.placement:
                self._replace_experts(placement)
            self.experts.capacity_factor = config.capacity_factor
        self.config = config
        self.drafter = self._drafter_for(config)
        self.telemetry.record_config(config)

    def _placement_of(self, config: EngineConfig) -> list[list[int]]:
        if config.placement is None:
            return identity_placement(len(self.target.moe_blocks), self.target.spec.num_experts,
                                      self.experts.topology)
        return [list(phy2log) for phy2log in config.placement]

    def _replace_experts(self, placement: list[list[int]]) -> None:
        """Move expert weights between ranks; the steps wait meanwhile, and the stall is measured."""
        started = time.perf_counter()
        if self.ep is not None:
            self.ep.replace(placement)
        self.experts.replace(placement)
        _synchronize(self.device)
        self.telemetry.record_replacement(time.perf_counter() - started)

    def attach_group(self, group: ExpertParallel) -> None:
        """Serve with a freshly spawned expert-parallel group (its ranks at the identity placement, the target's
        logical expert weights loaded), then take the config in use back: placement and capacity factor."""
        self.ep = group
        self.experts = ExpertRuntime(self.target, group.topology, group.exchange)
        drop_logical_experts(self.target)
        self._take(self.config)

    def close(self) -> None:
        """Stop the expert-parallel workers, if any."""
        if self.ep is not None:
            self.ep.close()

    def _check(self, config: EngineConfig) -> None:
        if config.spec_method == "draft_model" and config.longest_draft_len > 0 and self.model_drafter is None:
            raise RequestError("spec_method", "'draft_model' needs a draft model; this engine has none "
                               "(allowed here: 'off', 'ngram')")
        if config.placement is not None:
            if self.experts is None:
                raise RequestError("placement", "the target has no MoE layers")
            try:
                check_placement(config.placement, self.experts.topology, len(self.target.moe_blocks),
                                self.target.spec.num_experts)
            except PlacementError as error:
                raise RequestError("placement", str(error)) from error


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reaching(lengths: list[int], positions: int) -> list[int]:
    """Per draft position j < positions, how many of the drafts (or accepted runs) of these lengths reach it."""
    return [sum(length > j for length in lengths) for j in range(positions)]
