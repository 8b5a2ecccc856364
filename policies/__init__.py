"""Declarative controller policies (YAML) and their schema."""
from policies.schema import (
    AlertAction,
    JudgePolicy,
    Policy,
    PolicyError,
    SearchSpace,
    TrialPolicy,
    load_policy,
    parse_policy,
    resolve_policy_path,
    shipped_policies,
)

__all__ = ["AlertAction", "JudgePolicy", "Policy", "PolicyError", "SearchSpace", "TrialPolicy", "load_policy",
           "parse_policy", "resolve_policy_path", "shipped_policies"]
