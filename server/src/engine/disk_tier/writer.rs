//! The disk tier's writer thread: every file operation but reading runs here, in the order the
//! engine queued it (a file's deletion after its write), so the engine thread never waits for a
//! sync unless the queue is full or it asks for a flush.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::thread::JoinHandle;
use std::time::SystemTime;

/// Jobs the queue holds before the engine thread waits: with files of at most
/// [`super::MAX_FILE_BYTES`], a bound on the memory of pages waiting to be written.
const QUEUE: usize = 16;

/// One file operation.
pub(crate) enum Job {
    /// Write `data` as `name` (under a temporary name, synced, then renamed).
    Write { name: String, data: Arc<Vec<u8>> },
    /// Delete `name`.
    Delete { name: String },
    /// Set `name`'s modification time to now: the least recently used order after a restart.
    Touch { name: String },
    /// Answer once everything queued before is done.
    Flush(Sender<()>),
}

/// What the writer thread has done, shared with the engine thread.
#[derive(Debug, Default)]
pub(crate) struct WriterCounters {
    /// Writes queued and not yet done.
    pub queued: AtomicUsize,
    /// Files written.
    pub files_written: AtomicU64,
    /// Bytes of those files.
    pub bytes_written: AtomicU64,
    /// Writes that failed (the file is then missing; a read of it recomputes).
    pub write_errors: AtomicU64,
}

/// The writer thread and its queue.
pub(crate) struct Writer {
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Shared with the thread.
    pub counters: Arc<WriterCounters>,
}

impl Writer {
    /// Starts a writer for the files of `dir`.
    pub fn start(dir: PathBuf) -> std::io::Result<Self> {
        let (jobs, inbox) = sync_channel(QUEUE);
        let counters = Arc::new(WriterCounters::default());
        let shared = Arc::clone(&counters);
        let thread =
            std::thread::Builder::new().name("radix-disk-writer".into()).spawn(move || run(&dir, inbox, &shared))?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread), counters })
    }

    /// Queues a job (waits while the queue is full).
    pub fn send(&self, job: Job) {
        if matches!(job, Job::Write { .. }) {
            self.counters.queued.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(jobs) = &self.jobs
            && jobs.send(job).is_err()
        {
            eprintln!("radix-serve: warning: the disk cache's writer thread has stopped; nothing more is written");
        }
    }

    /// Waits until everything queued so far is on disk.
    pub fn flush(&self) {
        let (done, wait) = channel();
        self.send(Job::Flush(done));
        let _ = wait.recv();
    }
}

impl Drop for Writer {
    /// Finishes the queue: an engine dropped (a test's restart) leaves every file written.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(dir: &Path, inbox: Receiver<Job>, counters: &WriterCounters) {
    for job in inbox {
        match job {
            Job::Write { name, data } => {
                match write_atomically(dir, &name, &data) {
                    Ok(()) => {
                        counters.files_written.fetch_add(1, Ordering::Relaxed);
                        counters.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        counters.write_errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("radix-serve: warning: disk cache: cannot write {}: {e}", dir.join(&name).display());
                    }
                }
                // The engine reads the pages from `data` until this last reference is gone.
                drop(data);
                counters.queued.fetch_sub(1, Ordering::Relaxed);
            }
            Job::Delete { name } => {
                if let Err(e) = std::fs::remove_file(dir.join(&name))
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    eprintln!("radix-serve: warning: disk cache: cannot remove {}: {e}", dir.join(&name).display());
                }
            }
            Job::Touch { name } => {
                let _ =
                    File::options().write(true).open(dir.join(name)).and_then(|f| f.set_modified(SystemTime::now()));
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Writes `data` to `dir/name.tmp`, syncs it, renames it to `dir/name` and syncs the
/// directory: after a crash the file is whole or absent.
fn write_atomically(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
