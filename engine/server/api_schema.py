"""OpenAI-compatible request bodies, validated at the edge, with the bounds the API enforces declared in the schema."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, WithJsonSchema,
                      create_model)

from seam import SamplingParams
from seam.http import Text, no_lone_surrogates

MAX_STOP_STRINGS = 4
MAX_MESSAGES = 256



def _one_or_list(value):
    return [value] if isinstance(value, str) else value


def _only_item(value):
    if isinstance(value, list):
        if len(value) != 1:
            raise ValueError("exactly one prompt string is served per request")
        return value[0]
    return value


def one_or_list(item_schema: dict, max_items: int) -> WithJsonSchema:
    """The schema of a field that takes one string or a list of them."""
    return WithJsonSchema({"anyOf": [item_schema, {"type": "array", "items": item_schema, "minItems": 1,
                                                   "maxItems": max_items}]})


StopText = Annotated[str, StringConstraints(min_length=1), AfterValidator(no_lone_surrogates)]
Stops = Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS), BeforeValidator(_one_or_list),
                  WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1},
                                            {"type": "array", "items": {"type": "string", "minLength": 1},
                                             "maxItems": MAX_STOP_STRINGS}, {"type": "null"}]})]


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    # Unknown OpenAI fields (user, logprobs, ...) are accepted and ignored, as OpenAI-compatible servers do; the
    # known ones take exactly the JSON types their schema says (strict: no "1" for 1, no 0 for false).
    model_config = ConfigDict(extra="ignore", strict=True)

    model: Text
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: Stops | None = Field(None, description=f"at most {MAX_STOP_STRINGS} non-empty stop strings")
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int = Field(1, ge=1, le=1, description="only one choice per request is served")
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens or default_max_tokens, temperature=self.temperature,
                              top_p=self.top_p, stop=tuple(self.stop or ()), seed=self.seed, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_GenerationRequest):
    prompt: Annotated[str, StringConstraints(min_length=1), AfterValidator(no_lone_surrogates),
                      BeforeValidator(_only_item), one_or_list({"type": "string", "minLength": 1}, 1)] = Field(
        description="one prompt string (or a list holding exactly one)")

    @property
    def prompt_chars(self) -> int:
        return len(self.prompt)


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)
    role: Literal["system", "user", "assistant"]
    content: Text


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return super().sampling_params(self.max_completion_tokens or default_max_tokens)

    @property
    def prompt_chars(self) -> int:
        return sum(len(m.content) for m in self.messages)


def served_requests(model: str, max_prompt_chars: int, max_model_len: int
                    ) -> tuple[type[CompletionRequest], type[ChatCompletionRequest]]:
    """The two request bodies with this server's bounds in their schema: the model it serves, prompts of at most
    max_prompt_chars characters (checked before tokenizing), at most max_model_len new tokens."""
    tokens = Annotated[int | None, Field(ge=1, le=max_model_len)]
    prompt = Annotated[str, StringConstraints(min_length=1, max_length=max_prompt_chars),
                       AfterValidator(no_lone_surrogates), BeforeValidator(_only_item),
                       one_or_list({"type": "string", "minLength": 1, "maxLength": max_prompt_chars}, 1)]
    model_field = (Text, Field(json_schema_extra={"enum": [model]}, description="the model this server serves"))
    completion = create_model(
        "CompletionRequest", __base__=CompletionRequest, model=model_field, max_tokens=(tokens, None),
        prompt=(prompt, Field(description="one prompt string (or a list holding exactly one)")))
    message = create_model("ChatMessage", __base__=ChatMessage,
                           content=(Annotated[str, StringConstraints(max_length=max_prompt_chars),
                                                   AfterValidator(no_lone_surrogates)], ...))
    chat = create_model(
        "ChatCompletionRequest", __base__=ChatCompletionRequest, model=model_field, max_tokens=(tokens, None),
        max_completion_tokens=(tokens, None),
        messages=(list[message], Field(min_length=1, max_length=MAX_MESSAGES, description=(
            f"the messages' contents hold at most {max_prompt_chars} characters in all"))))
    return completion, chat
