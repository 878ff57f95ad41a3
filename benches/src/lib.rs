//! Benchmarks against OpenAI-compatible endpoints (filled by the cache-bench issue).
