"""The embedded inference engine. Knows nothing of the controller: it meets it only in the seam's EngineConfig and
Window.

Sub-packages, each importing only those below it (import-linter keeps it so):

- server/: the OpenAI-compatible HTTP API, its schemas and OpenAPI document, the edge (token guard, admission,
  body limit), health, request tracing, and the service thread that drives the engine;
- factory, respawn: building an engine from loaded models, and bringing an expert-parallel group back after a rank
  dies;
- engine.py: the Engine, which steps a batch: drafts, verifies, delivers, and adopts configs between steps;
- speculative/, moe/, telemetry/: drafters; expert slots and expert parallelism; the engine's own measurements
  (Windows, Prometheus metrics, the live view);
- runtime/: sequences, the scheduler, sampling, limits, switchback blocks;
- model/: model specs, loaders (HF folder, GGUF), the transformer and its MoE layer, the paged KV cache, tokenizers.
"""
