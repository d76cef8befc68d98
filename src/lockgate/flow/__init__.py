"""Flow control for LLM providers: shared rate limits, pauses, adaptive concurrency,
circuit breakers and fallback, SLA-weighted fair share and time windows (docs/flow.md)."""
