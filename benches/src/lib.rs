//! Benchmarks: `cache-bench` (agent-session replay against OpenAI-compatible servers, see
//! [`cache_bench`]) and the model micro-benchmarks in `src/bin`.

pub mod cache_bench;
