//! `--record-requests FILE`: every chat request body as it arrived, one JSON line each, so an
//! agent's real traffic can be replayed later (`cache-bench --recorded FILE`) against this or
//! another server, with other flags or another model.
//!
//! The bodies hold the prompts verbatim, so this is off unless asked for, and the file is
//! created readable by its owner only.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value as Json;

/// Appends request bodies to a file, one JSON object per line:
/// `{"route": "/v1/chat/completions", "unix_ms": 1764000000000, "body": {...}}`.
pub struct RequestRecorder {
    path: PathBuf,
    file: Mutex<File>,
    /// A write failed once already (logged once, then quietly skipped).
    failed: AtomicBool,
}

impl RequestRecorder {
    /// Opens `path` for appending, creating it (mode 0600 on Unix) if needed.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(path)?;
        Ok(RequestRecorder { path: path.to_owned(), file: Mutex::new(file), failed: AtomicBool::new(false) })
    }

    /// Records `body` (the request's JSON, as sent) for `route`. A body that is not JSON is
    /// not recorded: the request fails anyway. Never fails the request: a write error is
    /// logged once.
    pub fn record(&self, route: &str, body: &[u8]) {
        let Ok(body) = serde_json::from_slice::<Json>(body) else { return };
        let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let Ok(mut line) = serde_json::to_string(&RecordedRequest { route, unix_ms, body: &body }) else { return };
        line.push('\n');
        let written = match self.file.lock() {
            Ok(mut file) => file.write_all(line.as_bytes()),
            Err(_) => Err(std::io::Error::other("a writer panicked")),
        };
        if let Err(e) = written
            && !self.failed.swap(true, Ordering::Relaxed)
        {
            eprintln!("radix-serve: --record-requests {}: cannot write ({e}); recording stops", self.path.display());
        }
    }
}

/// One line of the record: the route, when, and the body as the client sent it.
#[derive(Serialize)]
struct RecordedRequest<'a> {
    route: &'a str,
    unix_ms: u64,
    body: &'a Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_json_body_becomes_one_line_and_other_bodies_none() {
        let dir = std::env::temp_dir().join(format!("radix-recorder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("requests.jsonl");
        let recorder = RequestRecorder::open(&path).unwrap();
        recorder.record("/v1/chat/completions", br#"{"messages": [{"role": "user", "content": "hi\nthere"}]}"#);
        recorder.record("/v1/chat/completions", b"not json");
        recorder.record("/v1/chat/completions", br#"{"messages": []}"#);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Json> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["body"]["messages"][0]["content"], "hi\nthere");
        assert_eq!(lines[1]["route"], "/v1/chat/completions");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
