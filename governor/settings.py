"""Service settings: environment (GOVERNOR_*) first, command-line flags override. Every default of the service
lives here or in what it names (the model registry, EngineLimits)."""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.runtime.limits import EngineLimits
from governor.registry import DEFAULT_MODEL

LIMITS = EngineLimits()
DEFAULT_DB = "sqlite:///governor.db"
DEFAULT_POLICY = "default"
DEFAULT_RETENTION_DAYS = 30.0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GOVERNOR_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    model: str = DEFAULT_MODEL
    draft: str | None = Field(None, description="name, path, self:N (target's first N layers) or none")
    admin_token: str | None = None
    demo_traffic: bool = False
    kv_cache_tokens: int = Field(LIMITS.kv_cache_tokens, ge=64)
    max_num_seqs: int = Field(LIMITS.max_num_seqs, ge=1)
    max_batch_tokens: int = Field(LIMITS.max_batch_tokens, ge=16)
    default_max_tokens: int = Field(64, ge=1)
    max_waiting_requests: int = Field(64, ge=1, description="requests admitted and not yet started; past it, 429")
    max_waiting_tokens: int = Field(32768, ge=1, description="prompt tokens of those requests; past it, 429")
    max_waiting_seconds: float | None = Field(None, gt=0, le=3600, description="lower max_waiting_requests to the "
                                              "measured start rate times this (Little's law); unset: fixed bound")
    retry_after_seconds: int = Field(1, ge=1, le=3600, description="the Retry-After a 429 carries")
    refusal_delay_seconds: float = Field(0.0, ge=0, le=60, description="hold a 429 for a full queue this long "
                                         "before sending it, so that clients retrying at once ask less often")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="a larger request body gets 413, unread")
    max_prompt_chars: int = Field(1 << 17, ge=1, description="a longer prompt gets 400, untokenized")
    max_sse_clients: int = Field(32, ge=1, description="dashboard event streams open at once; past it, 429")
    max_connections: int = Field(2048, ge=8, description="open HTTP connections, and requests in flight; a request "
                                 "past it gets 503 from the HTTP server (a backstop behind the queue bounds)")
    retention_days: float = Field(DEFAULT_RETENTION_DAYS, ge=0, description="decisions, trials and windows older than this are "
                                  "pruned (never the config history rollback needs); 0 keeps everything")
    ep: int = Field(1, ge=1, le=64, description="expert-parallel ranks (processes) serving the MoE target")
    redundant_experts: int = Field(0, ge=0, le=256, description="spare expert slots for replicas, over all ranks")
    controller: bool = Field(True, description="run the controller loop in-process (off: expose the raw seam)")
    policy: str = Field(DEFAULT_POLICY, description="policy YAML file, or the name of a shipped policy")
    db: str = Field(DEFAULT_DB, description="SQLAlchemy URL of the controller's store")

    def limits(self) -> EngineLimits:
        return EngineLimits(kv_cache_tokens=self.kv_cache_tokens, max_num_seqs=self.max_num_seqs,
                            max_batch_tokens=self.max_batch_tokens)
