"""Running requests on the model: sequences and their states, the scheduler (continuous batching over the paged KV
cache, preemption), sampling, the engine's limits, and the switchback blocks a trial alternates."""
