"""SM clock and power of the GPU while a benchmark row is timed, and a rest between rows.

Why: the H200 board limits its power (~700 W, nvidia-smi clocks_event_reasons bit 0x4, "software power
cap") by lowering the SM clock, and the limiter averages the draw over about a second. A row timed over
~100 ms on a rested board runs at 1980 MHz; the same row timed over ~1 s, or right after a capped row, runs at
~1700 MHz and reads ~6% lower (M3-TP1 P-32K `shared`: 556.7 TFLOP/s at 1980 MHz over 10 calls, 523.6 at
1725 over 100). A fixed idle time between rows (2 s) did not bring the board back to
rest after the dense rows. So the benchmarks wait until it is (no cap bit, the averaged draw low) and
record, per row, the clock and the cap seen while the row was timed.

A background `nvidia-smi -lms` process samples the board; without nvidia-smi every call degrades to a
plain sleep and the row fields are absent.
"""
from __future__ import annotations

import atexit
import datetime
import shutil
import statistics
import subprocess
import threading
import time

_FIELDS = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"
_SW_POWER_CAP = 0x4


class GpuMonitor:
    def __init__(self, period_ms: int = 20, device: int = 0, enabled: bool = True):
        self.samples: list = []  # (epoch seconds, sm MHz, averaged W, reasons)
        self._proc = None
        self._lock = threading.Lock()
        if not enabled or shutil.which("nvidia-smi") is None:
            return
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(device), f"--query-gpu={_FIELDS}", "--format=csv,noheader,nounits",
                 f"-lms={period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
            return
        atexit.register(self.close)
        threading.Thread(target=self._reader, daemon=True).start()

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()

    def _reader(self):
        for line in self._proc.stdout:
            s = parse_sample(line)
            if s is not None:
                with self._lock:
                    self.samples.append(s)

    @property
    def available(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _since(self, t0: float, t1: float | None = None) -> list:
        with self._lock:
            return [s for s in self.samples if s[0] >= t0 and (t1 is None or s[0] <= t1)]

    def rest(self, min_s: float, max_s: float, watts: float = 150.0) -> float:
        """Idles at least min_s, then until the last 0.5 s of samples show no power cap and an averaged draw
        below `watts` (at most max_s in all). Returns the seconds waited."""
        t0 = time.time()
        time.sleep(min_s)
        if not self.available:
            return time.time() - t0
        while time.time() - t0 < max_s:
            recent = self._since(time.time() - 0.5)
            if len(recent) >= 5 and all(not (r[3] & _SW_POWER_CAP) and r[2] < watts for r in recent):
                break
            time.sleep(0.1)
        return time.time() - t0

    def window(self):
        """Context manager; after the block, .fields() are the row fields of the samples taken inside it."""
        return _Window(self)


class _Window:
    def __init__(self, mon: GpuMonitor):
        self.mon, self.t0, self.t1 = mon, 0.0, 0.0

    def __enter__(self):
        self.t0 = time.time()
        return self

    def __exit__(self, *exc):
        self.t1 = time.time()
        time.sleep(0.05)  # the sampler's last lines
        return False

    def fields(self) -> dict:
        return window_fields(self.mon._since(self.t0, self.t1)) if self.mon.available else {}


def parse_sample(line: str):
    """(epoch seconds, SM MHz, averaged W, reasons) of one `nvidia-smi --format=csv,noheader,nounits` line of
    _FIELDS, or None for anything else (a header, an error message, a field the driver reports as N/A)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return (t, float(parts[1]), float(parts[2]), int(parts[3], 16))
    except ValueError:
        return None


def window_fields(samples: list) -> dict:
    """Row fields of the samples taken while a row was timed ({} without samples)."""
    if not samples:
        return {}
    mhz = [x[1] for x in samples]
    reasons = 0
    for x in samples:
        reasons |= x[3]
    return {"sm_mhz": round(statistics.median(mhz)), "sm_mhz_min": round(min(mhz)),
            "power_capped": round(sum(1 for x in samples if x[3] & _SW_POWER_CAP) / len(samples), 2),
            "clock_reasons": hex(reasons & ~0x1)}  # every reason seen but idle (0x1): 0x4 power cap, 0x8 / 0x40 / 0x80 hw
