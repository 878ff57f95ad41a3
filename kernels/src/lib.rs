//! Hot kernels over the paged KV pool (filled by the CPU-speed and GPU issues).
