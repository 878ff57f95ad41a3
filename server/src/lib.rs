//! The `radix-serve` server: the engine (radix prefix cache, KV page pool, scheduler, sampler)
//! and, to come, the HTTP API. The binary in `main.rs` is its command line.

pub mod api;
pub mod engine;
pub mod kv_budget;
