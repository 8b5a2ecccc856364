"""Training of the shipped byte-level default models (target MoE and its distilled draft)."""
