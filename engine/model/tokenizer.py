"""Tokenizers: byte-level for the shipped Governor models, Hugging Face tokenizers for everything else."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from engine.model.model_spec import ModelFolderError

BYTE_BOS, BYTE_EOS, BYTE_VOCAB = 256, 257, 260
_BYTE_CHAT_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (e.g. roles in an order it does not take)."""


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def render_chat(self, messages: list[dict[str, str]]) -> str: ...


class ByteTokenizer:
    """Ids 0..255 are raw UTF-8 bytes; 256 is <bos>, 257 is <eos>."""
    eos_token_ids = (BYTE_EOS,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        turns = "".join(f"### {_BYTE_CHAT_ROLES[m['role']]}:\n{m['content']}\n" for m in messages)
        return turns + "### Assistant:\n"


class HFTokenizer:
    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(folder))
        self.eos_token_ids = tuple(i for i in [self._tok.eos_token_id] if i is not None)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        from jinja2 import TemplateError

        try:
            return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except (TemplateError, ValueError, TypeError, KeyError) as error:
            raise ChatTemplateError(str(error) or type(error).__name__) from error


def load_tokenizer(folder: Path) -> Tokenizer:
    marker = folder / "governor.json"
    if marker.is_file() and json.loads(marker.read_text()).get("tokenizer") == "bytes":
        return ByteTokenizer()
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        return HFTokenizer(folder)
    raise ModelFolderError(f"{folder}: no tokenizer (tokenizer.json, or governor.json with tokenizer 'bytes')")
