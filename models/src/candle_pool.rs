//! candle's own CPU thread pool, which runs the quantized matmuls our kernels do not (types
//! without a kernel of ours: Q2_K, Q3_K, IQ*).

/// candle runs quantized matmuls on its own spinning pool, sized once from `CANDLE_NUM_THREADS`
/// (else every physical core) when it is first used; size it from the model's thread count so
/// the process has one. Measured under load (benches/README.md), a pool larger than the free
/// cores collapses decode speed. Its idle workers also spin 25,000 times before parking; with a
/// core taken by another process that spinning starves the matmul (SmolLM2 decode fell to
/// 15-57 tok/s from 100 idle), and even on idle cores it takes turns badly with the model's own
/// pool (the Qwen3-0.6B-shaped Q4_K_M decodes 39 tok/s at depth 512 and 20 at 2048 with it,
/// 45 and 28 with 2,000 spins; benches/README.md, "Threads"). Values the user set are kept.
///
/// Call it before any thread that could read the environment exists (first thing in `main`):
/// it sets environment variables.
pub fn configure_candle_pool(threads: usize) {
    for (name, value) in
        [("CANDLE_NUM_THREADS", threads.to_string()), ("CANDLE_BARRIER_POOL_SPIN_LIMIT", "2000".into())]
    {
        if std::env::var_os(name).is_none() {
            // SAFETY: the caller runs this before other threads exist (documented above), so
            // nothing reads the environment concurrently.
            unsafe { std::env::set_var(name, value) };
        }
    }
}
