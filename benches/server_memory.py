"""Peak memory of radix-serve and llama-server on one GGUF, server to server: each started alone
with the same threads, context and one slot, sent one `/completion` of PROMPT token ids (greedy,
32 tokens), then read from /proc: `VmHWM` (peak RSS), `RssAnon`, and the resident pages of the
model file's own mappings (`/proc/PID/smaps`). Prints one JSON line per (server, round) and
writes them all to OUTDIR/mem-NAME.json. Not a test.

    python3 benches/server_memory.py MODEL.gguf NAME OUTDIR [ROUNDS]

Environment: RADIX_SERVE (our binary), LLAMA_BIN (llama.cpp's bin directory, from
scripts/build-llama-cpp.sh), THREADS=2, CTX=8192, PROMPT=2048, VOCAB=100000 (ids are drawn
below it).
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_http import free_port, post, stop, wait_healthy  # noqa: E402


def status(pid):
    """The memory lines of /proc/PID/status, in KiB."""
    d = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            d[k] = int(v.split()[0])
    return d


def file_rss(pid, model):
    """KiB of the model file's pages resident in this process's mappings."""
    rss, cur = 0, False
    real = os.path.realpath(model)
    for line in open(f"/proc/{pid}/smaps"):
        parts = line.split()
        if len(parts) >= 5 and "-" in parts[0] and len(parts[1]) == 4 and not parts[0].endswith(":"):
            cur = len(parts) >= 6 and parts[5] == real
        elif parts and parts[0] == "Rss:" and cur:
            rss += int(parts[1])
    return rss


def main():
    model, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    threads, ctx = os.environ.get("THREADS", "2"), os.environ.get("CTX", "8192")
    ntok, vocab = int(os.environ.get("PROMPT", "2048")), int(os.environ.get("VOCAB", "100000"))
    servers = {
        "radix-serve": [os.environ["RADIX_SERVE"], "-m", model, "-t", threads, "-c", ctx, "--parallel", "1"],
        "llama-server": [os.environ["LLAMA_BIN"] + "/llama-server", "-m", model, "-t", threads, "-c", ctx, "-np", "1"],
    }
    mib = lambda kib: kib / 1024  # noqa: E731
    os.makedirs(out, exist_ok=True)
    rows = []
    for r in range(rounds):
        for srv, cmd in servers.items():
            port = free_port()
            log = open(f"{out}/mem-{name}-{srv}-{r}.log", "w")
            p = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=log)
            base = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(base, srv, p)
                time.sleep(1)
                s0, f0 = status(p.pid), file_rss(p.pid, model)
                t = time.monotonic()
                prompt = [(i * 31 + 7 + r) % vocab for i in range(ntok)]
                res = post(base, "/completion", {"prompt": prompt, "n_predict": 32, "temperature": 0})
                wall = time.monotonic() - t
                time.sleep(0.5)
                s1, f1 = status(p.pid), file_rss(p.pid, model)
                timings = res.get("timings", {})
                row = dict(model=name, server=srv, round=r, file_mib=os.path.getsize(model) / 1048576,
                           start_rss=mib(s0["VmRSS"]), start_file_rss=mib(f0), peak=mib(s1["VmHWM"]),
                           rss=mib(s1["VmRSS"]), anon=mib(s1["RssAnon"]), rssfile=mib(s1["RssFile"]),
                           model_file_rss=mib(f1), wall=wall, n_prompt=timings.get("prompt_n"),
                           prompt_ms=timings.get("prompt_ms"))
                rows.append(row)
                print(json.dumps(row), flush=True)
            finally:
                stop(p)
    json.dump(rows, open(f"{out}/mem-{name}.json", "w"), indent=1)


if __name__ == "__main__":
    main()
