"""A tiny runner for the SDK test scripts: each check runs even when an earlier one failed, so
one missing feature does not hide the state of the others. Prints one line per check and a
closing 'N passed, N failed' line; the exit status is 1 when any check failed."""

import os
import sys
import traceback

_checks = []


def check(function):
    """Registers a check (a function of no arguments that raises on failure)."""
    _checks.append(function)
    return function


def base_url():
    """The server's root URL, e.g. http://127.0.0.1:8080 (no trailing /v1)."""
    url = os.environ.get("RADIX_BASE_URL")
    if not url:
        sys.exit("set RADIX_BASE_URL to the server's root URL, e.g. http://127.0.0.1:8080")
    return url.rstrip("/")


def run():
    """Runs every registered check in order and exits."""
    passed = failed = 0
    for function in _checks:
        try:
            function()
        except Exception:  # noqa: BLE001 - any failure of a check is reported, then the next runs
            failed += 1
            print(f"FAIL {function.__name__}", flush=True)
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print(f"ok   {function.__name__}", flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)
