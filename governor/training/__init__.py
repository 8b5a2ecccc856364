"""Training of the shipped byte-level default models (target MoE and its distilled draft)."""

import os

# Spinning OpenMP workers slow small CPU ops ~10x when other processes share the cores; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
