"""Plumbing shared by the Python driver workloads: settings from the environment, checks and
the one-line summary. The workload itself is described in tests/drivers/README.md."""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from typing import Callable


class Settings:
    """What a run is told through the environment (connection parameters stay PG* variables,
    which libpq, psycopg and asyncpg read themselves)."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.mode = os.environ.get("SLUICE_MODE", "direct")
        self.clients = int(os.environ.get("DRIVER_CLIENTS", "8"))
        self.iterations = int(os.environ.get("DRIVER_ITERATIONS", "40"))
        self.deadline_s = float(os.environ.get("DRIVER_DEADLINE_S", "60"))
        self.tag = f"drv_{driver}_{secrets.token_hex(4)}"
        self.shared = f"{self.tag}_shared"

    @property
    def exact(self) -> bool:
        """Whether to expect exactly what the driver does on a direct connection. Session mode
        relays every message untouched, so yes; transaction mode may land a retry on another
        server, so only the common rule holds there (0A000 at most once, then success)."""
        return self.mode in ("session", "direct")


class CheckFailed(Exception):
    """A result differed from what the workload expects; ends that client's run."""


class Report:
    def __init__(self, settings: Settings, message: Callable[[BaseException], str] = str) -> None:
        """`message` renders an exception's text for `failed` (the driver's own, by default)."""
        self.s = settings
        self.message = message
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.checks = 0
        self.recovered = 0  # 0A000/26000 errors the application saw and recovered from
        self.failures: list[str] = []
        timer = threading.Timer(settings.deadline_s, self._timeout)
        timer.daemon = True
        timer.start()

    def _timeout(self) -> None:
        self.fail("watchdog", f"still running after {self.s.deadline_s:.0f} s")
        print(self.summary(), flush=True)
        os._exit(3)

    def check(self, ok: bool, what: str) -> None:
        """Counts a check; raises CheckFailed (ending that client's run) when it fails."""
        with self.lock:
            self.checks += 1
        if not ok:
            raise CheckFailed(what)

    def note_recovered(self) -> None:
        with self.lock:
            self.recovered += 1

    def fail(self, who: str, what: str) -> None:
        with self.lock:
            self.failures.append(f"{who}: {what}")

    def failed(self, who: str, e: Exception, step: str | None = None) -> None:
        """Records the exception that ended `who`'s run, in `step` if given: a failed check by its
        message (which names its step), anything else as `step: [SQLSTATE] Class: message`, the
        SQLSTATE where the driver's error carries one."""
        if isinstance(e, CheckFailed):
            self.fail(who, str(e))
            return
        sqlstate = getattr(e, "sqlstate", None)
        what = f"{sqlstate} " if sqlstate else ""
        what += f"{type(e).__name__}: {self.message(e)}"
        self.fail(who, f"{step}: {what}" if step else what)

    def summary(self) -> str:
        s = self.s
        elapsed = time.monotonic() - self.started
        head = f"{s.driver}/{s.mode}:"
        shape = f"{s.clients} clients x {s.iterations} iterations, {self.checks} checks passed"
        if not self.failures:
            return (
                f"{head} PASS {shape}, {self.recovered} invalidated statements recovered, "
                f"{elapsed:.1f} s"
            )
        return f"{head} FAIL {len(self.failures)} failure(s), {shape}; first: {self.failures[0]}"

    def finish(self) -> int:
        for line in self.failures[:20]:
            print(f"FAILED {line}", file=sys.stderr)
        if len(self.failures) > 20:
            print(f"FAILED ... and {len(self.failures) - 20} more", file=sys.stderr)
        sys.stderr.flush()
        print(self.summary(), flush=True)
        return 1 if self.failures else 0


def shared_totals(settings: Settings) -> tuple[int, int]:
    """Rows and sum(n) a client leaves in the shared table: ids i = 0..iterations+2, n = 7 * i."""
    rows = settings.iterations + 3
    return rows, 7 * rows * (rows - 1) // 2
