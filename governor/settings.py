"""Service settings: environment (GOVERNOR_*) first, command-line flags override. Every default of the service
lives here or in what it names (the model registry, EngineLimits)."""
from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.limits import EngineLimits
from governor.registry import DEFAULT_MODEL

LIMITS = EngineLimits()
DEFAULT_DB = "sqlite:///governor.db"
DEFAULT_POLICY = "default"


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
    ep: int = Field(1, ge=1, le=64, description="expert-parallel ranks (processes) serving the MoE target")
    redundant_experts: int = Field(0, ge=0, le=256, description="spare expert slots for replicas, over all ranks")
    controller: bool = Field(True, description="run the controller loop in-process (off: expose the raw seam)")
    policy: str = Field(DEFAULT_POLICY, description="policy YAML file, or the name of a shipped policy")
    db: str = Field(DEFAULT_DB, description="SQLAlchemy URL of the controller's store")

    def limits(self) -> EngineLimits:
        return EngineLimits(kv_cache_tokens=self.kv_cache_tokens, max_num_seqs=self.max_num_seqs,
                            max_batch_tokens=self.max_batch_tokens)
