"""Prompt sets built from text every Python installation carries: stdlib sources and pydoc topics."""

from __future__ import annotations

import functools
import os
import pydoc_data.topics
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path

KINDS: tuple[str, ...] = ("code", "prose", "chat")
DEFAULT_MAX_BYTES = 300

_SKIPPED_DIRS = {
    "test", "tests", "idle_test", "idlelib", "lib2to3", "turtledemo", "ensurepip",
    "encodings", "pydoc_data", "site-packages", "dist-packages", "lib-dynload", "__pycache__",
}
_DEFINITION = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+\w", re.MULTILINE)
_RULE = re.compile(r"^[*=\-+ ]+$")
_EMPHASIS = re.compile(r"\*{1,2}([^*\s][^*]*?)\*{1,2}")
_CHAT_TEMPLATES = (
    "Explain this passage about {title} from the Python documentation in simple words.\n\n{text}",
    "Summarize in one sentence what this says about {title}.\n\n{text}",
    "What does a Python programmer need to know about {title}? Start from this:\n\n{text}",
    "Give a short example that illustrates this rule about {title}.\n\n{text}",
)


@dataclass(frozen=True)
class Prompt:
    kind: str
    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()

    @property
    def endpoint(self) -> str:
        return "/v1/chat/completions" if self.messages else "/v1/completions"

    def body(self) -> dict:
        if self.messages:
            return {"messages": [{"role": role, "content": content} for role, content in self.messages]}
        return {"prompt": self.text}

    @property
    def size_bytes(self) -> int:
        if self.messages:
            return sum(len(content.encode()) for _, content in self.messages)
        return len(self.text.encode())


def prompt_set(kind: str, n: int, seed: int = 0, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Prompt]:
    """n prompts of one kind, each at most max_bytes of UTF-8, the same list for the same arguments."""
    if kind not in KINDS:
        raise ValueError(f"prompt kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if max_bytes < 32:
        raise ValueError(f"max_bytes must be >= 32, got {max_bytes}")
    rng = random.Random(f"{kind}:{seed}")
    make = {"code": _code_prompt, "prose": _prose_prompt, "chat": _chat_prompt}[kind]
    return [make(rng, max_bytes) for _ in range(n)]


def _code_prompt(rng: random.Random, max_bytes: int) -> Prompt:
    sources = _stdlib_sources()
    while True:
        text = sources[rng.randrange(len(sources))].read_text(encoding="utf-8", errors="replace")
        starts = [m.start() for m in _DEFINITION.finditer(text)]
        if not starts:
            continue
        snippet = _first_lines(text[rng.choice(starts):], max_bytes)
        if snippet.count("\n") >= 2:
            return Prompt("code", snippet)


def _first_lines(text: str, max_bytes: int) -> str:
    lines = textwrap.dedent(text[: max_bytes * 4]).splitlines(keepends=True)
    kept, size = [], 0
    for line in lines:
        size += len(line.encode())
        if size > max_bytes or not line.endswith("\n"):
            break
        kept.append(line)
    return "".join(kept).rstrip() + "\n"


def _prose_prompt(rng: random.Random, max_bytes: int) -> Prompt:
    _, paragraph = rng.choice(_paragraphs())
    return Prompt("prose", _clip(paragraph, max_bytes))


def _chat_prompt(rng: random.Random, max_bytes: int) -> Prompt:
    title, paragraph = rng.choice(_paragraphs())
    template = rng.choice(_CHAT_TEMPLATES)
    room = max_bytes - len(template.format(title=title, text="").encode())
    content = template.format(title=title, text=_clip(paragraph, room)) if room >= 40 else _clip(paragraph, max_bytes)
    return Prompt("chat", messages=(("user", content),))


def _clip(text: str, max_bytes: int) -> str:
    if len(text.encode()) <= max_bytes:
        return text
    head = text.encode()[:max_bytes].decode(errors="ignore")
    sentence_end = head.rfind(". ")
    if sentence_end >= len(head) // 2:
        return head[: sentence_end + 1]
    return head[: head.rfind(" ")] if " " in head else head


@functools.lru_cache(maxsize=1)
def _stdlib_sources() -> tuple[Path, ...]:
    found = []
    for folder, subfolders, files in os.walk(sysconfig.get_paths()["stdlib"]):
        subfolders[:] = sorted(d for d in subfolders if d not in _SKIPPED_DIRS and not d.startswith("config-"))
        found += [Path(folder, f) for f in sorted(files) if f.endswith(".py") and not f.startswith("test_")]
    if not found:
        raise RuntimeError("no Python standard library sources found for code prompts")
    return tuple(found)


@functools.lru_cache(maxsize=1)
def _paragraphs() -> tuple[tuple[str, str], ...]:
    found = []
    for text in pydoc_data.topics.topics.values():
        title = text.splitlines()[0].strip()
        title = title[0].lower() + title[1:] if title[1:2].islower() else title
        for block in text.split("\n\n"):
            paragraph = _clean_paragraph(block)
            if paragraph:
                found.append((title, paragraph))
    return tuple(found)


def _clean_paragraph(block: str) -> str | None:
    lines = block.strip("\n").splitlines()
    if not lines or any(line[:1].isspace() or _RULE.match(line) for line in lines):
        return None
    text = _EMPHASIS.sub(r"\1", " ".join(line.strip() for line in lines))
    text = re.sub(r"\s+", " ", text)
    if len(text) < 80 or not text[0].isupper() or not text.endswith("."):
        return None
    if any(mark in text for mark in ("::=", ">>>", "|", "*", "See also")):
        return None
    plain = sum(c.isalpha() or c.isspace() for c in text)
    return text if plain / len(text) >= 0.85 else None
