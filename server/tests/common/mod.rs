//! What the engine tests share: a greedy request, running requests to the end, and a
//! temporary directory for the disk tier.
#![allow(dead_code)] // Not every test file uses every helper.

pub mod hybrid;

use std::path::PathBuf;

use radix_serve::engine::{EngineCore, EngineEvent, GenerateRequest, SamplingParams, TokenLogprobs};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// A greedy request of `prompt` for `max_tokens` tokens.
pub fn request(prompt: Vec<u32>, max_tokens: usize, use_cache: bool) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        max_tokens,
        stop_tokens: vec![],
        stop_strings: vec![],
        use_cache,
        constraint: None,
        tenant: Default::default(),
        cache_namespace: Default::default(),
        snapshot_points: Vec::new(),
        expected_points: Vec::new(),
        branch_points: Vec::new(),
        draft_max: None,
    }
}

/// What one request heard: its cached prompt tokens, its generated tokens and (when asked for)
/// their log-probabilities.
pub struct Outcome {
    pub cached: usize,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprobs>,
}

/// Runs the requests to the end, checking the engine's invariants after every step.
pub fn run(engine: &mut EngineCore, requests: Vec<GenerateRequest>) -> Vec<Outcome> {
    let mut receivers: Vec<UnboundedReceiver<EngineEvent>> = Vec::new();
    for r in requests {
        let (tx, rx) = unbounded_channel();
        engine.add(r, tx);
        receivers.push(rx);
    }
    let mut steps = 0;
    while !engine.idle() {
        engine.step();
        engine.check_invariants().unwrap();
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    receivers
        .into_iter()
        .map(|mut rx| {
            let mut outcome = Outcome { cached: 0, tokens: Vec::new(), logprobs: Vec::new() };
            while let Ok(event) = rx.try_recv() {
                match event {
                    EngineEvent::Started { cached_tokens, .. } => outcome.cached = cached_tokens,
                    EngineEvent::Token { id, .. } => outcome.tokens.push(id),
                    EngineEvent::Logprobs(l) => outcome.logprobs.push(l),
                    EngineEvent::Finished { .. } => {}
                    EngineEvent::Failed(m) => panic!("request failed: {m}"),
                }
            }
            outcome
        })
        .collect()
}

/// A directory of its own for one test (a disk tier's), removed at the end.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// An empty directory named after `name` and this process.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("radix-engine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Every file in its model subdirectories whose name ends with `.{extension}`, sorted.
    pub fn files(&self, extension: &str) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for model in std::fs::read_dir(&self.0).unwrap() {
            for file in std::fs::read_dir(model.unwrap().path()).unwrap() {
                let path = file.unwrap().path();
                if path.extension().is_some_and(|e| e == extension) {
                    files.push(path);
                }
            }
        }
        files.sort();
        files
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
