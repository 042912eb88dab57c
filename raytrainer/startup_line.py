"""The line the driver's terminal shows while train() starts: what it waits for, and for how long.

Starting Ray and a new worker group takes 20-50 s on a laptop (placement, worker processes, imports, the
process group), and before this line nothing was printed until the progress bar. Its words follow the
start-up timeline (`Startup.doing`, startup.py), set by the driver's own phases; the line goes as the run's
first event reaches the callbacks (the progress bar's turn), or when train() ends before that.

On a terminal it is one line, redrawn in place, shown only once start-up has taken `after_s` (a warm group
starts in about a second: nothing to say). Elsewhere (a log file, `ray job submit`'s logs, a notebook) each
phase that lasts `after_s` is printed once, as its own line, since a redrawn line would fill a log with copies.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional, TextIO

from .startup import Startup

PREFIX = "[raytrainer] "


class StartupLine:
    def __init__(self, startup: Startup, enabled: bool = True, stream: Optional[TextIO] = None,
                 tty: Optional[bool] = None, after_s: float = 2.0, every_s: float = 0.5, since: str = "train()"):
        self.startup, self.since = startup, since  # since: what the seconds count from, in the line's words
        self.stream = stream if stream is not None else sys.stderr
        self.tty = tty if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.after_s, self.every_s = after_s, every_s
        self.enabled = enabled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drawn = False  # a terminal line is on screen (to clear)
        self._printed = set()  # the phases printed already (not a terminal)
        self._phase, self._phase_since = None, 0.0
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "StartupLine":
        if self.enabled:
            self.startup.on_started = self.stop
            self._thread = threading.Thread(target=self._run, name="raytrainer-startup-line", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def stop(self) -> None:
        """Clear the line and draw no more; under the lock, so nothing is drawn after the progress bar's first."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            if self._drawn:
                self._write("\r\x1b[K")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                if not self._stop.is_set():
                    self._draw(time.monotonic())

    def _draw(self, now: float) -> None:
        doing = self.startup.doing
        if doing != self._phase:
            self._phase, self._phase_since = doing, now
        waited = self.startup.driver.elapsed()
        if self.tty:
            if waited >= self.after_s:
                self._write(f"\r{PREFIX}starting: {doing}... {waited:.0f} s\x1b[K")
                self._drawn = True
        elif now - self._phase_since >= self.after_s and doing not in self._printed:
            self._printed.add(doing)
            self._write(f"{PREFIX}starting: {doing}... ({waited:.0f} s since {self.since})\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream (the user's own redirection): say nothing rather than fail
            self._stop.set()
