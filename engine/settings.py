"""Service settings: environment (GOVERNOR_*) first, command-line flags override."""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.models import DEFAULT_MODEL


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GOVERNOR_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    model: str = DEFAULT_MODEL
    draft: str | None = Field(None, description="name, path, self:N (target's first N layers) or none")
    admin_token: str | None = None
    demo_traffic: bool = False
    kv_cache_tokens: int = Field(16384, ge=64)
    max_num_seqs: int = Field(32, ge=1)
    max_batch_tokens: int = Field(512, ge=16)
    default_max_tokens: int = Field(64, ge=1)
    max_waiting_requests: int = Field(64, ge=1, description="requests admitted and not yet started; past it, 429")
    max_waiting_tokens: int = Field(32768, ge=1, description="prompt tokens of those requests; past it, 429")
    retry_after_seconds: int = Field(1, ge=1, le=3600, description="the Retry-After a 429 carries")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="a larger request body gets 413, unread")
    max_prompt_chars: int = Field(1 << 17, ge=1, description="a longer prompt gets 400, untokenized")
    max_sse_clients: int = Field(32, ge=1, description="dashboard event streams open at once; past it, 429")
    retention_days: float = Field(30.0, ge=0, description="decisions, trials and windows older than this are "
                                  "pruned (never the config history rollback needs); 0 keeps everything")
    ep: int = Field(1, ge=1, le=64, description="expert-parallel ranks (processes) serving the MoE target")
    redundant_experts: int = Field(0, ge=0, le=256, description="spare expert slots for replicas, over all ranks")
    controller: bool = Field(True, description="run the controller loop in-process (off: expose the raw seam)")
    policy: str = Field("default", description="policy YAML file, or the name of a shipped policy")
    db: str = Field("sqlite:///governor.db", description="SQLAlchemy URL of the controller's store")
