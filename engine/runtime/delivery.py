"""Delivering tokens to a request: appending them until end of sequence, a stop string or the length limit, and the
text an emission carries (held back where it could still grow into a stop string)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.model.tokenizer import Tokenizer
from engine.runtime.sequence import Sequence


@dataclass(frozen=True)
class Failure:
    """Why the engine could not finish a request: cause is a short label (counted in /metrics), message the detail."""
    cause: str
    message: str
    retryable: bool = False     # the service recovers by itself; the client may retry (503, not 500)


@dataclass
class Emission:
    """What one step produced for one request."""
    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None
    prompt_tokens: int
    output_tokens: int
    failure: Failure | None = None


def append_tokens(seq: Sequence, tokens: list[int], tokenizer: Tokenizer, max_model_len: int) -> None:
    """Append tokens to seq, stopping at end of sequence (unless ignored), a stop string, max_tokens or the model's
    length; seq.finish_reason says which."""
    params, eos = seq.params, tokenizer.eos_token_ids
    for token in tokens:
        if token in eos and not params.ignore_eos:
            seq.finish_reason = "stop"
            break
        seq.tokens.append(token)
        if params.stop and _hit_stop_string(seq, tokenizer):
            break
        if seq.num_output >= params.max_tokens or len(seq.tokens) >= max_model_len:
            seq.finish_reason = "length"
            break
    if not params.stop:
        seq.text = tokenizer.decode(seq.output_ids)


def emission_of(seq: Sequence) -> Emission:
    """seq's text not yet emitted, without a trailing partial character or a tail that may become a stop string."""
    text = seq.text[seq.emitted_chars:]
    if not seq.finished:
        text = text.rstrip("\ufffd")
        text = text[:len(text) - _partial_stop_length(text, seq.params.stop)]
    seq.emitted_chars += len(text)
    return Emission(seq.request_id, [], text, seq.finish_reason, len(seq.prompt_ids), seq.num_output)


def _hit_stop_string(seq: Sequence, tokenizer: Tokenizer) -> bool:
    text = tokenizer.decode(seq.output_ids)
    lookback = max(len(s) for s in seq.params.stop) + 8
    found = [i for s in seq.params.stop if (i := text.find(s, max(0, len(seq.text) - lookback))) >= 0]
    seq.text = text[:min(found)] if found else text
    if found:
        seq.finish_reason = "stop"
    return bool(found)


def _partial_stop_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of text that could still grow into a stop string; it is held back."""
    return max((n for stop in stops for n in range(min(len(stop) - 1, len(text)), 0, -1)
                if stop.startswith(text[-n:])), default=0)
