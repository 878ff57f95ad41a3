//! The engine thread and the handle the HTTP side talks to it through (ARCHITECTURE.md §1): the
//! engine never awaits network I/O, and the HTTP side never touches tensors.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::cache_report::RecentPrefix;
use super::core::EngineCore;
use super::metrics::EngineMetrics;
use super::request::{EngineEvent, GenerateRequest};
use super::stats::EngineStats;

enum Command {
    // Boxed: a request is several times larger than the other commands.
    Generate(Box<GenerateRequest>, UnboundedSender<EngineEvent>),
    FlushCache,
    RecentPrefixes(tokio::sync::oneshot::Sender<Vec<RecentPrefix>>),
    /// Answer once the disk tier has written everything queued.
    FlushDisk(Sender<()>),
}

/// What the engine thread publishes after every step.
struct Shared {
    stats: Mutex<EngineStats>,
    metrics: Mutex<EngineMetrics>,
    /// Requests sent but not yet taken in by the engine thread (it is busy with a step).
    in_flight: AtomicUsize,
    /// The engine thread runs (false once it has ended, however).
    alive: AtomicBool,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    shared: Arc<Shared>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(core: EngineCore) -> Self {
        let (commands, inbox) = channel();
        let shared = Arc::new(Shared {
            stats: Mutex::new(core.stats()),
            metrics: Mutex::new(core.metrics()),
            in_flight: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
        });
        let published = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("radix-engine".into())
            .spawn(move || run(core, inbox, published))
            .expect("the engine thread starts");
        EngineHandle { commands, shared }
    }

    /// Submits a request; its events arrive on the returned receiver. Dropping the receiver
    /// aborts the request at the next step and frees its pages.
    pub fn submit(&self, request: GenerateRequest) -> UnboundedReceiver<EngineEvent> {
        let (events, receiver) = unbounded_channel();
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        if self.commands.send(Command::Generate(Box::new(request), events.clone())).is_err() {
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            let _ = events.send(EngineEvent::Failed("the engine has stopped".into()));
        }
        receiver
    }

    /// Whether the engine thread still runs; `/health` answers 503 once it does not.
    pub fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::Relaxed)
    }

    /// Drops all cached prefixes once nothing is running.
    pub fn flush_cache(&self) {
        let _ = self.commands.send(Command::FlushCache);
    }

    /// The latest counts (updated after every step).
    pub fn stats(&self) -> EngineStats {
        *self.shared.stats.lock().expect("stats lock is never poisoned")
    }

    /// Requests waiting for admission, including those sent while the engine was busy with a
    /// step (`stats().waiting` only counts those it has taken in).
    pub fn queued(&self) -> usize {
        self.stats().waiting + self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Counters and histograms since start-up (updated after every step).
    pub fn metrics(&self) -> EngineMetrics {
        self.shared.metrics.lock().expect("metrics lock is never poisoned").clone()
    }

    /// Waits until the disk tier (`--cache-dir`) has written everything queued: a graceful
    /// shutdown calls it once the HTTP server has answered its last request. Returns at once if
    /// the engine thread has ended.
    pub fn flush_disk(&self) {
        let (done, wait) = channel();
        if self.commands.send(Command::FlushDisk(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Recently computed sequences, most reused first; `None` if the engine has stopped.
    pub async fn recent_prefixes(&self) -> Option<Vec<RecentPrefix>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.commands.send(Command::RecentPrefixes(reply)).ok()?;
        answer.await.ok()
    }
}

fn run(mut core: EngineCore, inbox: Receiver<Command>, shared: Arc<Shared>) {
    // Marks the engine dead however this thread ends, so that /health stops saying "ok".
    struct Alive<'a>(&'a AtomicBool);
    impl Drop for Alive<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Relaxed);
        }
    }
    let _alive = Alive(&shared.alive);
    let mut flush_pending = false;
    loop {
        let mut handle = |command: Command, core: &mut EngineCore| match command {
            Command::Generate(request, events) => {
                core.add(*request, events);
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            }
            Command::FlushCache => flush_pending = true,
            Command::RecentPrefixes(reply) => {
                let _ = reply.send(core.recent_prefixes());
            }
            Command::FlushDisk(done) => {
                core.flush_disk();
                let _ = done.send(());
            }
        };
        if core.idle() {
            match inbox.recv() {
                Ok(command) => handle(command, &mut core),
                Err(_) => return,
            }
        }
        while let Ok(command) = inbox.try_recv() {
            handle(command, &mut core);
        }
        let publish = |core: &EngineCore| *shared.stats.lock().expect("stats lock is never poisoned") = core.stats();
        // A panic in a step (a bug, a device failure) fails the sequences of that batch; the
        // engine goes on with a fresh cache instead of stopping for good.
        let step = || {
            let scheduled = core.schedule_step();
            publish(&core);
            if let Some(scheduled) = scheduled {
                core.run_step(scheduled);
            }
        };
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
            let cause = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            eprintln!("radix-serve: an engine step failed ({cause}); its sequences failed, the prefix cache was reset");
            core.recover(&format!("the engine failed while computing this request: {cause}"));
        }
        if flush_pending && core.stats().running == 0 {
            core.flush_cache();
            flush_pending = false;
        }
        publish(&core);
        *shared.metrics.lock().expect("metrics lock is never poisoned") = core.metrics();
    }
}
