//! The engine thread and the handle the HTTP side talks to it through (DESIGN.md §1): the
//! engine never awaits network I/O, and the HTTP side never touches tensors.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::core::{EngineCore, EngineStats};
use super::request::{EngineEvent, GenerateRequest};

enum Command {
    Generate(GenerateRequest, UnboundedSender<EngineEvent>),
    FlushCache,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    stats: Arc<Mutex<EngineStats>>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(core: EngineCore) -> Self {
        let (commands, inbox) = channel();
        let stats = Arc::new(Mutex::new(core.stats()));
        let shared = Arc::clone(&stats);
        std::thread::Builder::new()
            .name("radix-engine".into())
            .spawn(move || run(core, inbox, shared))
            .expect("the engine thread starts");
        EngineHandle { commands, stats }
    }

    /// Submits a request; its events arrive on the returned receiver. Dropping the receiver
    /// aborts the request at the next step and frees its pages.
    pub fn submit(&self, request: GenerateRequest) -> UnboundedReceiver<EngineEvent> {
        let (events, receiver) = unbounded_channel();
        if self.commands.send(Command::Generate(request, events.clone())).is_err() {
            let _ = events.send(EngineEvent::Failed("the engine has stopped".into()));
        }
        receiver
    }

    /// Drops all cached prefixes once nothing is running.
    pub fn flush_cache(&self) {
        let _ = self.commands.send(Command::FlushCache);
    }

    /// The latest counts (updated after every step).
    pub fn stats(&self) -> EngineStats {
        *self.stats.lock().expect("stats lock is never poisoned")
    }
}

fn run(mut core: EngineCore, inbox: Receiver<Command>, stats: Arc<Mutex<EngineStats>>) {
    let mut flush_pending = false;
    loop {
        let mut handle = |command: Command, core: &mut EngineCore| match command {
            Command::Generate(request, events) => core.add(request, events),
            Command::FlushCache => flush_pending = true,
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
        core.step();
        if flush_pending && core.stats().running == 0 {
            core.flush_cache();
            flush_pending = false;
        }
        *stats.lock().expect("stats lock is never poisoned") = core.stats();
    }
}
