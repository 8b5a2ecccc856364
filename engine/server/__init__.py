"""Serving over HTTP: the OpenAI-compatible API and its schemas, the OpenAPI document, the edge middleware (token
guard, admission, body limit), health, serving metrics, request tracing, and the service thread that owns the
engine."""
