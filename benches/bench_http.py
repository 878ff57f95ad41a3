"""HTTP helpers the benchmark scripts share (`import bench_http` with `benches/` on sys.path):
a free loopback port, a JSON POST, waiting for a server's `/health` to say ok, and stopping it."""

import json
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, path, body, timeout=3600):
    """POSTs `body` as JSON to `base + path` and returns the decoded JSON answer."""
    request = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.load(r)


def wait_healthy(base, what, proc=None, seconds=600):
    """Waits until `base/health` answers status ok; exits naming `what` if `proc` (a Popen)
    exits first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"{what} exited with status {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if json.load(r).get("status") == "ok":
                    return
        except Exception:
            pass  # not listening yet, or 503 while the model loads
        time.sleep(0.5)
    sys.exit(f"{what} was not healthy after {seconds} s")


def stop(proc, seconds=20):
    """Stops a server started by a benchmark: SIGTERM, then SIGKILL after `seconds`."""
    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
