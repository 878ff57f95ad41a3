//! What llama-server did with its context checkpoints during a run, counted from its log.
//!
//! On hybrid (recurrent) models llama-server cannot roll its memory back to an arbitrary prefix:
//! a cached prefix is reusable only down to a saved "context checkpoint" of the recurrent state,
//! or not at all. Its hit ratio alone does not say why a request prefilled more than the ideal;
//! these counts do. The lines come from llama.cpp 0.3.36's `tools/server/server-context.cpp`
//! (`create_checkpoint` and the prompt-cache lookup in `update_slots`), all at trace verbosity
//! (`-lv 4`) except "erasing old context checkpoint", a warning printed at any verbosity:
//!
//! - `created context checkpoint N of M (...)`: a checkpoint saved while prefilling;
//! - `erased invalidated context checkpoint (...)`: dropped because the new prompt diverged
//!   before its end (`pos_max > pos_next`);
//! - `erasing old context checkpoint (...)`: the oldest one dropped to make room (the slot holds
//!   `--ctx-checkpoints`, 32 by default);
//! - `erasing context checkpoint too close to an earlier one (...)`: dropped for spacing
//!   (`--checkpoint-min-step`) when the list is full;
//! - `restored context checkpoint (...)`: a cached prefix resumed from one;
//! - `forcing full prompt re-processing due to lack of cache data (...)`: a prefix matched, but
//!   no checkpoint covered it, so the whole prompt was prefilled again.
//!
//! The start-up line `context checkpoints enabled, max = ...` is printed for every model, dense
//! ones included, so it is not counted: a run with no counted line had no checkpoint activity.

use std::path::Path;

use serde::Serialize;

/// Checkpoint events of one llama-server run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CheckpointCounts {
    /// Checkpoints saved.
    pub created: usize,
    /// Checkpoints dropped because the prompt diverged before them.
    pub erased_invalidated: usize,
    /// Checkpoints dropped to make room for a new one.
    pub erased_old: usize,
    /// Checkpoints dropped for being too close to an earlier one.
    pub erased_too_close: usize,
    /// Cached prefixes resumed from a checkpoint.
    pub restored: usize,
    /// Prompts prefilled from scratch for want of a checkpoint.
    pub full_reprocessing: usize,
}

/// Which count of [`CheckpointCounts`] a line adds to.
type Field = fn(&mut CheckpointCounts) -> &mut usize;

/// Each counted line's fixed text (from the format strings, up to their first `%`) and the
/// count it adds to. Matched anywhere in a line: the prefix (`0.06.882.867 I slot create_check: id
/// 3 | task 0 | `: time, level, function, slot, task) varies with llama-server's log flags.
const EVENTS: [(&str, Field); 6] = [
    ("created context checkpoint ", |c| &mut c.created),
    ("erased invalidated context checkpoint (", |c| &mut c.erased_invalidated),
    ("erasing old context checkpoint (", |c| &mut c.erased_old),
    ("erasing context checkpoint too close to an earlier one (", |c| &mut c.erased_too_close),
    ("restored context checkpoint (", |c| &mut c.restored),
    ("forcing full prompt re-processing due to lack of cache data", |c| &mut c.full_reprocessing),
];

impl CheckpointCounts {
    /// Counts the events in a llama-server log.
    pub fn from_log(log: &str) -> Self {
        let mut counts = CheckpointCounts::default();
        for line in log.lines() {
            if let Some((_, field)) = EVENTS.iter().find(|(text, _)| line.contains(text)) {
                *field(&mut counts) += 1;
            }
        }
        counts
    }

    /// Reads and counts the log at `path`; `None` (said on stderr) when it cannot be read, so a
    /// missing log costs the table, not the run's results.
    pub fn from_log_file(path: &Path) -> Option<Self> {
        match std::fs::read(path) {
            // Lossy: a log may hold model output that is not valid UTF-8.
            Ok(bytes) => Some(Self::from_log(&String::from_utf8_lossy(&bytes))),
            Err(e) => {
                eprintln!("no checkpoint counts from {}: {e}", path.display());
                None
            }
        }
    }

    /// Whether the log had any checkpoint event at all (dense models' runs have none).
    pub fn any(&self) -> bool {
        *self != CheckpointCounts::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as llama-server prints them (the format strings of server-context.cpp with made-up
    /// numbers; the `SLT_*` prefix with `__func__` cut to 12 characters; the time and level
    /// prefix it writes to a file by default).
    const LOG: &str = "\
0.06.012.345 I srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192
0.06.024.690 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 16384, n_keep = 0, task.n_tokens = 3012
0.06.037.035 I slot create_check: id  0 | task 0 | created context checkpoint 1 of 32 (pos_min = 2495, pos_max = 2495, n_tokens = 2496, size = 19.266 MiB)
0.06.049.380 I slot create_check: id  0 | task 0 | created context checkpoint 2 of 32 (pos_min = 3007, pos_max = 3007, n_tokens = 3008, size = 19.266 MiB)
0.06.061.725 I slot   operator(): id  0 | task 4 | checking checkpoint with [3007, 3007] against 3100...
0.06.074.070 I slot   operator(): id  0 | task 4 | restored context checkpoint (pos_min = 3007, pos_max = 3007, n_tokens = 3008, n_past = 3008, size = 19.266 MiB)
0.06.086.415 I slot   operator(): id  0 | task 9 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
0.06.098.760 I slot   operator(): id  0 | task 9 | erased invalidated context checkpoint (pos_min = 2495, pos_max = 2495, n_tokens = 2496, n_swa = 0, pos_next = 0, size = 19.266 MiB)
0.06.111.105 I slot   operator(): id  0 | task 9 | erased invalidated context checkpoint (pos_min = 3007, pos_max = 3007, n_tokens = 3008, n_swa = 0, pos_next = 0, size = 19.266 MiB)
0.06.123.450 I slot create_check: id  0 | task 30 | erasing context checkpoint too close to an earlier one (pos_min = 4100, pos_max = 4100, n_tokens = 4101, size = 19.266 MiB)
0.06.135.795 W slot create_check: id  0 | task 30 | erasing old context checkpoint (pos_min = 511, pos_max = 511, n_tokens = 512, size = 19.266 MiB)
0.06.148.140 I slot create_check: id  0 | task 30 | superseding context checkpoint at n_tokens = 6000
0.06.160.485 I srv  log_server_r: done request: POST /v1/chat/completions 127.0.0.1 200
";

    #[test]
    fn counts_each_kind_of_line() {
        let c = CheckpointCounts::from_log(LOG);
        assert_eq!(
            c,
            CheckpointCounts {
                created: 2,
                erased_invalidated: 2,
                erased_old: 1,
                erased_too_close: 1,
                restored: 1,
                full_reprocessing: 1,
            }
        );
        assert!(c.any());
    }

    #[test]
    fn a_dense_models_log_has_no_events() {
        // The start-up line names checkpoints for every model; it is not an event.
        let c = CheckpointCounts::from_log(
            "srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192\n\
             slot   operator(): id  3 | task 12 | cached n_tokens = 3200, memory_seq_rm [3200, end)\n",
        );
        assert_eq!(c, CheckpointCounts::default());
        assert!(!c.any());
    }
}
