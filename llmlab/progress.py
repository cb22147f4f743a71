"""A small progress bar on stderr (no dependency), for long steps: downloads, quantizing."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, unit: str = "", enabled: bool = True, stream=None):
        self.total, self.label, self.unit = max(int(total), 1), label, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.t0 = self._last = time.perf_counter()
        self.done = 0
        self._drawn = False

    def _fmt(self, n: float) -> str:
        if self.unit == "B":
            return f"{n / 1e6:.1f} MB"
        return f"{int(n)}{self.unit}"

    def update(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if not self.enabled or (now - self._last < 0.2 and done < self.total):
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(30 * frac)
        rate = done / max(now - self.t0, 1e-9)
        rate_s = f"{rate / 1e6:.1f} MB/s" if self.unit == "B" else f"{rate:.1f}/s"
        self._drawn = True
        self.stream.write(f"\r{self.label}: [{bar:<30}] {100 * frac:5.1f}% {self._fmt(done)}/{self._fmt(self.total)} {rate_s}")
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Closes the bar; on an exception (Ctrl-C) only ends its line, so what follows starts a line of its own."""
        if exc_type is None:
            self.close()
        elif self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        return False

    def close(self) -> None:
        if self.enabled:
            self.update(self.total if self.done >= self.total else self.done)
            self.stream.write("\n")
            self.stream.flush()
