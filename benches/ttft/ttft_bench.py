#!/usr/bin/env python3
"""Time to first token of agent-shaped conversations: radix-serve against llama-server.

Python 3.11, standard library only. Starts each server itself (fresh process per scenario, one
server at a time, never both at once), sends streamed greedy chat requests, and writes per-request
records (JSON) and Markdown tables. benches/ttft/run.sh builds/locates everything and calls this.

Scenarios (all text is generated here, deterministically; nothing third-party):
  agent        one session: a ~2,000-token system prompt and 3 tools (~600 tokens) in `tools`,
               a user task, then 5 turns; after each reply the session appends the model's own
               reply (as an assistant message carrying a tool call) and a 100-300-token tool result.
  interleaved  two sessions, A and B, with the same system prompt and tools but different tasks
               and tool results, sent A1 B1 A2 B2 A3 B3.

TTFT: from sending the request to the first SSE chunk whose delta carries content (text, reasoning
or a tool call); where a reply carries none, the first chunk after the role chunk.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

MAX_TOKENS = 16

# ---------------------------------------------------------------------------------------------
# Workload text

_AREAS = ["the parser", "the scheduler", "the cache layer", "the HTTP handlers", "the CLI",
          "the storage backend", "the config loader", "the test harness", "the build scripts",
          "the logging module", "the metrics exporter", "the retry policy", "the auth middleware",
          "the migration tool", "the job queue", "the template renderer"]
_SITUATIONS = ["a test fails only on the second run", "a function has more than one caller",
               "the user asks for a quick fix", "a file is larger than a thousand lines",
               "two modules define the same helper", "an error message is vague",
               "a dependency is pinned to an old version", "a change touches public API",
               "the build prints a new warning", "a benchmark regresses", "the task is ambiguous",
               "a comment contradicts the code", "an environment variable changes behaviour",
               "a loop allocates on every iteration", "a lock is held across an await point",
               "a path is built from user input", "a retry hides the first error",
               "a test sleeps instead of waiting on a condition"]
_ACTIONS = ["read the surrounding code before editing", "write down the smallest failing case",
            "prefer the narrowest change that fixes the cause", "state the assumption you are making",
            "keep the existing naming and layout", "run the focused tests first",
            "check every caller with a search", "explain the trade-off in one sentence",
            "leave the public signature unchanged", "add a regression test next to the fix",
            "measure before and after", "quote the exact error text", "ask one precise question",
            "remove dead code you created", "keep the diff free of unrelated formatting"]
_FOLLOWUPS = ["report what you verified", "mention what you did not check",
              "list the files you touched", "note any follow-up work", "say how to reproduce it",
              "point to the line that mattered", "summarise the outcome in two lines",
              "flag anything that needs a human decision"]


def system_prompt() -> str:
    rng = random.Random(20261129)
    parts = [
        "You are Forge, a coding agent working inside a user's repository through tools. You read "
        "files, run commands and search code; you never guess at the contents of a file you have "
        "not read. Work in small verified steps and keep the user informed with short messages.",
        "",
        "# Principles",
        "Correctness comes first, then clarity, then speed. A change that is not tested is not "
        "finished. When the repository has a convention, follow it even where you would choose "
        "differently. Do not add dependencies without saying why. Never rewrite history, never "
        "delete files the user did not mention, and never print secrets found in the environment.",
        "",
    ]
    for section in range(1, 6):
        area = _AREAS[(section * 5) % len(_AREAS)]
        parts.append(f"# Working on {area}")
        parts.append(f"These rules apply whenever the task involves {area}.")
        for n in range(1, 10):
            parts.append(
                f"{section}.{n} When {rng.choice(_SITUATIONS)} in {rng.choice(_AREAS)}, "
                f"{rng.choice(_ACTIONS)}, then {rng.choice(_ACTIONS)}, and {rng.choice(_FOLLOWUPS)}."
            )
        parts.append("")
    parts += [
        "# Tool use",
        "Call one tool at a time and wait for its result. Read a file before editing it. Prefer "
        "search_code over listing directories. Commands run in the repository root with a time "
        "limit of two minutes; long builds should be split. Tool results may be truncated; when "
        "they are, narrow the request instead of repeating it.",
        "",
        "# Answer format",
        "Keep messages short. Use code blocks for code and commands. When the task is done, give "
        "a summary of the change, the tests you ran and their result, and anything left open.",
    ]
    return "\n".join(parts)


def tools() -> list[dict]:
    return [
        {"type": "function", "function": {
            "name": "read_file",
            "description": "Read a text file from the repository. Returns the requested lines with "
                           "line numbers. Large files are truncated to the requested window; ask for "
                           "a narrower range instead of reading the whole file again. Use it before "
                           "every edit: the file may have changed since the last read, and edits made "
                           "from a stale copy are rejected.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "Path relative to the repository root."},
                "start_line": {"type": "integer", "description": "First line to return, 1-based."},
                "end_line": {"type": "integer", "description": "Last line to return, inclusive."},
            }, "required": ["path"]}}},
        {"type": "function", "function": {
            "name": "run_command",
            "description": "Run a shell command in the repository root and return its exit status, "
                           "standard output and standard error. Commands are killed after the timeout. "
                           "Do not start servers or interactive programs. Output longer than 200 lines is "
                           "cut in the middle; pipe through tail or grep to keep what matters.",
            "parameters": {"type": "object", "properties": {
                "command": {"type": "string", "description": "The command line, run with bash -c."},
                "timeout_s": {"type": "integer", "description": "Seconds before the command is killed (at most 120)."},
                "env": {"type": "object", "description": "Extra environment variables.",
                        "additionalProperties": {"type": "string"}},
            }, "required": ["command"]}}},
        {"type": "function", "function": {
            "name": "search_code",
            "description": "Search the repository for a regular expression and return matching lines "
                           "with file paths and line numbers, grouped by file. Binary files and ignored "
                           "paths are skipped. Results stop after max_results matches. Prefer this tool "
                           "to find callers and definitions before reading whole files.",
            "parameters": {"type": "object", "properties": {
                "pattern": {"type": "string", "description": "A regular expression (Rust regex syntax)."},
                "path_glob": {"type": "string", "description": "Only search files matching this glob, e.g. src/**/*.rs."},
                "max_results": {"type": "integer", "description": "Most matches to return (default 50)."},
                "case_sensitive": {"type": "boolean", "description": "Match case exactly (default true)."},
            }, "required": ["pattern"]}}},
    ]


_IDENTS = ["parse_header", "flush_pending", "retry_after", "load_config", "schedule_next",
           "evict_oldest", "render_row", "open_session", "close_session", "apply_patch",
           "encode_frame", "decode_frame", "check_quota", "merge_ranges", "split_batch"]


def tool_call_and_result(session: str, turn: int, target_tokens: int) -> tuple[dict, str]:
    """The tool call an agent would have made after `turn`, and a result of ~target_tokens tokens."""
    rng = random.Random(f"{session}-{turn}")
    kind = ["read_file", "run_command", "search_code"][(turn + len(session)) % 3]
    area = rng.choice(["core", "net", "store", "cli", "jobs"])
    lines: list[str] = []
    budget = int(target_tokens * 2.3)  # ~2.3 characters per token for this code-like text (SmolLM2)
    if kind == "read_file":
        path = f"src/{area}/{rng.choice(_IDENTS)}.py"
        args = {"path": path, "start_line": 1, "end_line": 60}
        n = 1
        while sum(len(s) + 1 for s in lines) < budget:
            f = rng.choice(_IDENTS)
            lines.append(f"{n:4d}  def {f}(self, value, limit={rng.randint(2, 64)}):")
            lines.append(f"{n + 1:4d}      if value is None or len(value) > limit:")
            lines.append(f"{n + 2:4d}          raise ValueError(\"{f}: bad value\")")
            lines.append(f"{n + 3:4d}      return self._{rng.choice(_IDENTS)}(value)[:limit]")
            n += 4
    elif kind == "run_command":
        args = {"command": f"python -m pytest tests/{area} -x -q", "timeout_s": 120}
        lines.append("exit status: 1")
        while sum(len(s) + 1 for s in lines) < budget:
            t = rng.choice(_IDENTS)
            ok = rng.random() < 0.8
            lines.append(f"tests/{area}/test_{t}.py::test_{t}_{rng.randint(1, 9)} {'PASSED' if ok else 'FAILED'}")
            if not ok:
                lines.append(f"    AssertionError: expected {rng.randint(0, 99)}, got {rng.randint(100, 999)}")
    else:
        args = {"pattern": rng.choice(_IDENTS), "path_glob": f"src/{area}/**/*.py"}
        while sum(len(s) + 1 for s in lines) < budget:
            f = rng.choice(_IDENTS)
            lines.append(f"src/{area}/{f}.py:{rng.randint(10, 400)}:    result = {args['pattern']}(ctx, {f}_opts)")
    call = {"id": f"call_{session}{turn}", "type": "function",
            "function": {"name": kind, "arguments": json.dumps(args)}}
    return call, "\n".join(lines)


TASKS = {
    "agent": "The test suite fails with a ValueError from parse_header when the input has a trailing "
             "newline. Find the cause, fix it with the smallest change, and add a regression test.",
    "A": "Make retry_after honour the Retry-After header in seconds and in HTTP-date form, and add tests "
         "for both forms.",
    "B": "The job queue sometimes schedules the same job twice after a restart. Find out why and fix it "
         "without changing the public API of schedule_next.",
}
RESULT_TOKENS = [130, 270, 180, 280, 110, 220]  # target size of the tool result after turn i


class Session:
    def __init__(self, name: str, sys_prompt: str, tool_defs: list[dict]):
        self.name = name
        self.tools = tool_defs
        self.messages: list[dict] = [{"role": "system", "content": sys_prompt},
                                     {"role": "user", "content": TASKS[name]}]
        self.turn = 0

    def body(self) -> dict:
        return {"model": "bench", "messages": self.messages, "tools": self.tools, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0, "top_k": 1, "seed": 0,
                "max_tokens": MAX_TOKENS}

    def append_turn(self, reply: str) -> None:
        """The model's own reply (with the tool call the agent made) and the tool's result."""
        call, result = tool_call_and_result(self.name, self.turn, RESULT_TOKENS[self.turn % len(RESULT_TOKENS)])
        self.messages.append({"role": "assistant", "content": reply, "tool_calls": [call]})
        self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        self.turn += 1


# ---------------------------------------------------------------------------------------------
# Client

def _has_output(delta: dict) -> bool:
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


def stream_chat(port: int, body: dict, timeout: float = 600) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.connect()
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=payload, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    ttft = None          # first chunk carrying output
    first_after_role = None
    seen_role = False
    done = False
    text: list[str] = []
    usage = None
    timings = None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        now = time.perf_counter() - t0
        if data == b"[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error']}")
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if _has_output(delta):
                if ttft is None:
                    ttft = now
                text.append(delta.get("content") or "")
            elif delta.get("role") and not seen_role:
                seen_role = True
                continue
            if first_after_role is None:
                first_after_role = now
    total = time.perf_counter() - t0
    conn.close()
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    usage = usage or {}
    timings = timings or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n")
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": cached,
        "completion_tokens": usage.get("completion_tokens"),
        "ttft_s": ttft if ttft is not None else first_after_role,
        "ttft_from": "content" if ttft is not None else "first-chunk-after-role",
        "total_s": total,
        "server_prompt_ms": timings.get("prompt_ms"),
        "server_cache_n": timings.get("cache_n"),
        "reply": "".join(text),
    }


# ---------------------------------------------------------------------------------------------
# Servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def contenders(pattern: str | None) -> list[int]:
    """Processes matching `pgrep -f pattern` other than ourselves (our command line, and run.sh's,
    which execs us, hold the pattern)."""
    if not pattern:
        return []
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found if int(p) not in (os.getpid(), os.getppid())]


def wait_idle(pattern: str | None) -> None:
    """On a shared machine: wait while another benchmark (pgrep -f PATTERN) is running."""
    said = False
    while contenders(pattern):
        if not said:
            print(f"ttft: waiting for `pgrep -f '{pattern}'` to clear ...", file=sys.stderr, flush=True)
            said = True
        time.sleep(10)


class Watch:
    """Watches for a contender while a scenario is measured; when one starts, it kills the server
    at once (so as not to disturb the other benchmark either) and the scenario is measured again."""

    def __init__(self, pattern: str | None):
        self.pattern, self.seen, self.done = pattern, False, threading.Event()
        self.server: Server | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(1.0):
            if contenders(self.pattern):
                self.seen = True
                if self.server is not None and self.server.proc.poll() is None:
                    self.server.proc.kill()
                return

    def stop(self) -> bool:
        self.done.set()
        self.thread.join()
        return self.seen


class Server:
    def __init__(self, kind: str, argv: list[str], port: int, log_path: str):
        self.kind, self.port = kind, port
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {self.proc.returncode} while starting; see {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{kind} did not become healthy in 300 s; see {log_path}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def server_argv(kind: str, args, port: int) -> list[str]:
    common = ["-m", args.model, "--port", str(port), "--chat-template-file", args.template]
    if kind == "radix-serve":
        return [args.radix_serve, *common, "--threads", str(args.threads), "--parallel", "1"]
    return [args.llama_server, *common, "-t", str(args.threads), "-c", str(args.ctx), "-np", "1"]


def warm_up(port: int) -> None:
    """Touch the weights once with an unrelated tiny prompt (shares only '<|im_start|>system\\n')."""
    stream_chat(port, {"messages": [{"role": "system", "content": "Warm-up."},
                                    {"role": "user", "content": "Say hi."}],
                       "stream": True, "temperature": 0, "max_tokens": 2})


def run_scenario(kind: str, scenario: str, args, sys_prompt: str, tool_defs: list[dict]) -> list[dict]:
    """One scenario on a fresh server; measured again (up to 3 tries) if a contender ran meanwhile."""
    for attempt in range(1, 6):
        wait_idle(args.wait_for)
        watch = Watch(args.wait_for)
        try:
            records = run_scenario_once(kind, scenario, args, sys_prompt, tool_defs, watch)
        except Exception:
            if not watch.stop():
                raise
        if not watch.stop():
            return records
        print(f"ttft: `{args.wait_for}` started during {kind} / {scenario} (try {attempt}); stopped, will measure "
              "again once it is done", file=sys.stderr, flush=True)
    raise RuntimeError(f"{kind} / {scenario}: disturbed 5 times by `{args.wait_for}`")


def run_scenario_once(kind: str, scenario: str, args, sys_prompt: str, tool_defs: list[dict],
                      watch: Watch | None = None) -> list[dict]:
    port = free_port()
    log_path = os.path.join(args.out, f"{kind}-{scenario}.log")
    print(f"ttft: {kind} / {scenario}: starting on port {port}", file=sys.stderr, flush=True)
    server = Server(kind, server_argv(kind, args, port), port, log_path)
    if watch is not None:
        watch.server = server
    records = []
    try:
        warm_up(port)
        if scenario == "agent":
            order = [("agent", i) for i in range(5)]
            sessions = {"agent": Session("agent", sys_prompt, tool_defs)}
        else:
            order = [(s, i) for i in range(3) for s in ("A", "B")]
            sessions = {s: Session(s, sys_prompt, tool_defs) for s in ("A", "B")}
        for name, i in order:
            session = sessions[name]
            r = stream_chat(port, session.body())
            label = f"turn {i + 1}" if scenario == "agent" else f"{name}{i + 1}"
            r.update(server=kind, scenario=scenario, request=label)
            records.append(r)
            print(f"ttft: {kind:11s} {scenario:11s} {label:7s} prompt={r['prompt_tokens']} "
                  f"cached={r['cached_tokens']} ttft={r['ttft_s'] * 1000:.0f} ms total={r['total_s'] * 1000:.0f} ms "
                  f"reply={r['reply'][:40]!r}", file=sys.stderr, flush=True)
            session.append_turn(r["reply"])
    finally:
        server.stop()
    return records


# ---------------------------------------------------------------------------------------------
# Tables

def summary(records: list[dict], kind: str) -> dict[str, float]:
    """Each figure per round, then the median over rounds."""
    rounds = sorted({r["round"] for r in records})
    per_round = [summary_one([r for r in records if r["round"] == n], kind) for n in rounds]
    return {k: statistics.median(s[k] for s in per_round if k in s) for k in per_round[0]}


def summary_one(records: list[dict], kind: str) -> dict[str, float]:
    mine = [r for r in records if r["server"] == kind]
    get = lambda sc, labels: [r["ttft_s"] for r in mine if r["scenario"] == sc and r["request"] in labels]
    out = {}
    cold = get("agent", ["turn 1"])
    warm = get("agent", [f"turn {i}" for i in range(2, 6)])
    ret = get("interleaved", ["A2", "B2", "A3", "B3"])
    if cold:
        out["cold first turn (agent turn 1)"] = cold[0]
    if warm:
        out["warm agent turns (mean of turns 2-5)"] = statistics.mean(warm)
    if ret:
        out["interleaved returning turns (mean of A2 B2 A3 B3)"] = statistics.mean(ret)
    return out


def tables(records: list[dict], kinds: list[str]) -> str:
    lines = []
    for kind in kinds:
        lines += [f"**{kind}**", "",
                  "| round | scenario | request | prompt tokens | cached tokens | TTFT (ms) | total (ms) |",
                  "| ---: | --- | --- | ---: | ---: | ---: | ---: |"]
        for r in records:
            if r["server"] != kind:
                continue
            note = "" if r["ttft_from"] == "content" else " (no content; first chunk)"
            lines.append(f"| {r['round']} | {r['scenario']} | {r['request']} | {r['prompt_tokens']} | "
                         f"{r['cached_tokens']} | {r['ttft_s'] * 1000:.0f}{note} | {r['total_s'] * 1000:.0f} |")
        lines.append("")
    if len(kinds) == 2:
        a, b = (summary(records, k) for k in kinds)
        n = len({r["round"] for r in records})
        if n > 1:
            lines += [f"Median over {n} rounds of each round's figure.", ""]
        lines += [f"| TTFT | {kinds[0]} (ms) | {kinds[1]} (ms) | {kinds[1]} / {kinds[0]} |",
                  "| --- | ---: | ---: | ---: |"]
        for key in a:
            if key in b:
                lines.append(f"| {key} | {a[key] * 1000:.0f} | {b[key] * 1000:.0f} | {b[key] / a[key]:.2f}x |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the GGUF both servers load")
    p.add_argument("--radix-serve", help="path to target/release/radix-serve")
    p.add_argument("--llama-server", help="path to llama.cpp's llama-server")
    p.add_argument("--template", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "chatml_tools.jinja"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=8192, help="llama-server -c")
    p.add_argument("--scenarios", default="agent,interleaved")
    p.add_argument("--out", default="target/ttft-bench")
    p.add_argument("--wait-for", default="llama-bench", help="pgrep -f pattern to wait out before each scenario ('' : none)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat everything this many times (servers alternate); the summary takes the median")
    p.add_argument("--dump-workload", action="store_true", help="print the agent session's final request and exit")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally` that stops a server
    os.makedirs(args.out, exist_ok=True)

    sys_prompt, tool_defs = system_prompt(), tools()
    if args.dump_workload:
        s = Session("agent", sys_prompt, tool_defs)
        for _ in range(5):
            s.append_turn("I will look at the relevant code first.")
        print(json.dumps(s.body(), indent=1))
        return
    kinds = [k for k, path in (("radix-serve", args.radix_serve), ("llama-server", args.llama_server)) if path]
    records: list[dict] = []
    for rnd in range(1, args.rounds + 1):
        for kind in kinds:
            for scenario in args.scenarios.split(","):
                for r in run_scenario(kind, scenario, args, sys_prompt, tool_defs):
                    r["round"] = rnd
                    records.append(r)
    with open(os.path.join(args.out, "records.json"), "w") as f:
        json.dump(records, f, indent=1)
    md = tables(records, kinds)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
