//! Headless Chromium driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`:
//! JSON messages ended by a NUL byte on file descriptors 3 and 4), so the browser test needs no
//! WebDriver, no websocket client and no npm package: only the browser, from Debian's packages.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

/// The browser: `RADIX_CHROMIUM`, else the first of Debian's and other usual names on `PATH`.
pub fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RADIX_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// A running headless browser with an empty profile, killed (and its profile removed) when
/// dropped.
pub struct Browser {
    child: Child,
    to_browser: File,
    from_browser: Receiver<Json>,
    next_id: u64,
    /// Events received while waiting for answers, oldest first.
    pub events: Vec<Json>,
    profile: PathBuf,
}

/// Two pipes the child gets as descriptors 3 (it reads) and 4 (it writes).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    #[cfg(target_os = "linux")]
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    // macOS has no pipe2: close-on-exec is set just after, so a child another test thread starts
    // in between could inherit the descriptors (it would only delay the browser seeing EOF).
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    #[cfg(not(target_os = "linux"))]
    let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    #[cfg(not(target_os = "linux"))]
    for fd in fds {
        // SAFETY: `fd` was just opened by pipe.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        assert_eq!(rc, 0, "fcntl(FD_CLOEXEC): {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts `binary` headless with the flags CI uses and `extra` ones, on an empty profile
    /// under `scratch`.
    pub fn launch(binary: &Path, scratch: &Path, extra: &[&str]) -> Browser {
        let profile = scratch.join(format!("chromium-profile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).expect("the profile directory can be made");
        let (child_reads, parent_writes) = pipe();
        let (parent_reads, child_writes) = pipe();
        let (r, w) = (std::os::fd::AsRawFd::as_raw_fd(&child_reads), std::os::fd::AsRawFd::as_raw_fd(&child_writes));
        let mut command = Command::new(binary);
        command
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
            .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
            .args(["--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The ends
        // are first moved above 9 so that putting one on 3 cannot close the other.
        unsafe {
            command.pre_exec(move || {
                let r = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let w = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if r < 0 || w < 0 || libc::dup2(r, 3) < 0 || libc::dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("{} does not start: {e}", binary.display()));
        drop((child_reads, child_writes));
        let (tx, rx) = channel();
        // A thread reads, so that the browser never blocks on a full pipe between calls.
        std::thread::spawn(move || {
            let mut reader = BufReader::new(File::from(parent_reads));
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop_if(|b| *b == 0);
                if let Ok(json) = serde_json::from_slice::<Json>(&message)
                    && tx.send(json).is_err()
                {
                    return;
                }
                message.clear();
            }
        });
        Browser {
            child,
            to_browser: File::from(parent_writes),
            from_browser: rx,
            next_id: 1,
            events: Vec::new(),
            profile,
        }
    }

    /// Sends `method` (to a page's `session`, or to the browser) and waits for its result (30 s).
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Json) -> Json {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to_browser.write_all(&bytes).expect("the browser reads its pipe");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from_browser.recv_timeout(left) {
                Ok(answer) if answer["id"] == id => {
                    assert!(answer.get("error").is_none(), "{method}: {}", answer["error"]);
                    return answer["result"].clone();
                }
                Ok(event) => self.events.push(event),
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no answer from the browser in 30 s"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: the browser has gone"),
            }
        }
    }

    /// Takes in the events that arrived since the last call.
    pub fn pump(&mut self) {
        while let Ok(event) = self.from_browser.try_recv() {
            self.events.push(event);
        }
    }

    /// A new tab, with the page, runtime and log domains on.
    pub fn open_tab(&mut self) -> String {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let attached =
            self.call(None, "Target.attachToTarget", json!({"targetId": target["targetId"], "flatten": true}));
        let session = attached["sessionId"].as_str().expect("a session id").to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            self.call(Some(&session), domain, json!({}));
        }
        session
    }

    /// Loads `url` in the tab and waits for its load event (30 s).
    pub fn navigate(&mut self, session: &str, url: &str) {
        self.events.clear();
        self.call(Some(session), "Page.navigate", json!({"url": url}));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.events.iter().any(|e| e["method"] == "Page.loadEventFired" && e["sessionId"] == session) {
            assert!(Instant::now() < deadline, "{url} did not load within 30 s");
            match self.from_browser.recv_timeout(Duration::from_millis(100)) {
                Ok(event) => self.events.push(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => panic!("the browser has gone"),
            }
        }
    }

    /// The value of a JavaScript expression in the tab (promises awaited).
    pub fn eval(&mut self, session: &str, expression: &str) -> Json {
        let result = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(result.get("exceptionDetails").is_none(), "{expression}: {}", result["exceptionDetails"]);
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is true in the tab (`seconds` at most).
    pub fn wait_for(&mut self, session: &str, expression: &str, seconds: u64) {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while self.eval(session, expression) != json!(true) {
            let why = self.eval(session, "String(window.radixUi && window.radixUi.lastError)");
            assert!(Instant::now() < deadline, "never true within {seconds} s: {expression} (last error: {why})");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the whole page at `width` CSS pixels.
    pub fn screenshot(&mut self, session: &str, width: u32) -> Vec<u8> {
        self.call(
            Some(session),
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": 800, "deviceScaleFactor": 1, "mobile": false}),
        );
        let height = self.eval(session, "Math.ceil(document.documentElement.scrollHeight)").as_u64().unwrap_or(800);
        let shot = self.call(
            Some(session),
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true,
                   "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}}),
        );
        base64_decode(shot["data"].as_str().expect("screenshot data"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Standard base64 (the screenshot's encoding).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(value(c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode("YWJj"), b"abc");
}
