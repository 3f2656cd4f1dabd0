"""The GPU's SM clock and power while the judge times (NVML, through nvidia-ml-py).

A large GEMM on the H200 runs into the board's power cap: the SM clock falls from 1980 MHz to
1.4 to 1.9 GHz, and its time grows by up to 10% from a short timing to a long one (notebook,
session 25). A figure of such a kernel is a figure at a clock. So the judge samples the clock,
the power draw and the reasons NVML gives for a lowered clock in a thread while it times, and
every timed window gets a summary: the clock's median and low, the power's high, and the
reasons seen. `pipe compare` prints them wherever a point's arms ran below full clock.

Only the judge's process samples; a candidate kernel cannot reach the thread or its samples.
Without NVML (no driver, no nvidia-ml-py, a CPU backend) every summary is None and nothing
else changes.
"""
from __future__ import annotations

import bisect
import statistics
import threading
import time

PERIOD_S = 0.01  # one sample every 10 ms: NVML reads the clock in about 50 us
KEEP_S = 120.0  # samples older than this are dropped (a window is a timing call: well under)
FULL = 0.97  # a window whose median clock is below this fraction of the device's maximum ran throttled

# NVML's clock event reasons (nvmlClocksEventReason*), by bit, the ones that lower a busy clock
REASONS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}


def reason_names(mask: int) -> list[str]:
    """The names of the clock-lowering reasons set in an NVML reasons mask, in bit order."""
    return [name for bit, name in sorted(REASONS.items()) if mask & bit]


def summarize(samples: list[tuple[float, float, float, int]], max_mhz: float | None) -> dict | None:
    """One window's samples (time, SM MHz, watts, reasons mask) as {sm_mhz: median, sm_mhz_low,
    power_w_high, reasons: [names], throttled: bool, samples: n}; None for no samples.
    `throttled`: the median clock below FULL of `max_mhz`, or a clock-lowering reason seen."""
    if not samples:
        return None
    mhz = [s[1] for s in samples]
    mask = 0
    for s in samples:
        mask |= s[3]
    med = statistics.median(mhz)
    names = reason_names(mask)
    slow = bool(max_mhz) and med < FULL * max_mhz
    return {"sm_mhz": round(med), "sm_mhz_low": round(min(mhz)), "power_w_high": round(max(s[2] for s in samples)),
            "reasons": names, "throttled": slow or bool(names), "samples": len(samples)}


def merge(parts: list[dict | None]) -> dict | None:
    """Several windows' summaries (an arm's rounds) as one: the median of their medians, the
    lowest low, the highest power, every reason, throttled if any was."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    names = sorted({n for p in parts for n in p["reasons"]}, key=lambda n: list(REASONS.values()).index(n))
    return {"sm_mhz": round(statistics.median(p["sm_mhz"] for p in parts)),
            "sm_mhz_low": min(p["sm_mhz_low"] for p in parts),
            "power_w_high": max(p["power_w_high"] for p in parts),
            "reasons": names, "throttled": any(p["throttled"] for p in parts),
            "samples": sum(p["samples"] for p in parts)}


def describe(c: dict | None) -> str:
    """A summary as a short text: '1.71 GHz (low 1.41, 698 W, power cap)'."""
    if not c:
        return ""
    why = ", ".join(c["reasons"])
    return (f"{c['sm_mhz'] / 1000:.2f} GHz (low {c['sm_mhz_low'] / 1000:.2f}, {c['power_w_high']} W"
            + (f", {why})" if why else ")"))


def notes(rows: list[tuple[str, list[tuple[str, dict | None]]]], head: str) -> list[str]:
    """Report lines for the rows (a label, and the (name, clock summary) of what ran there)
    where any of them ran throttled: `head` first, with `{n}` the number of such rows."""
    out = [f"  {label}: " + "; ".join(f"{name} {describe(c)}" for name, c in got if c)
           for label, got in rows if any((c or {}).get("throttled") for _, c in got)]
    return [head.format(n=len(out)), *out] if out else []


class ClockWatch:
    """Samples one GPU's SM clock, power and clock event reasons in a daemon thread; window(t0,
    t1) summarizes the samples taken between two time.monotonic() readings. start() returns
    None (and samples nothing) where NVML is not there."""

    def __init__(self, handle, nvml, period_s: float = PERIOD_S):
        self._h, self._nvml, self._period = handle, nvml, period_s
        self._t: list[float] = []
        self._s: list[tuple[float, float, float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        try:
            self.max_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        except Exception:
            self.max_mhz = None
        self._thread = threading.Thread(target=self._run, name="pipe-clock-watch", daemon=True)

    @classmethod
    def start(cls, torch_device_index: int = 0) -> "ClockWatch | None":
        """A running watch of the CUDA device torch numbers `torch_device_index` (found in NVML
        by its UUID, else its PCI bus id), or None without NVML."""
        try:
            import pynvml as nvml

            nvml.nvmlInit()
        except Exception:
            return None
        try:
            import torch

            p = torch.cuda.get_device_properties(torch_device_index)
        except Exception:
            return None
        handle = None
        uuid = str(getattr(p, "uuid", "") or "")
        if uuid:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            except Exception:
                handle = None
        if handle is None:
            try:
                handle = nvml.nvmlDeviceGetHandleByPciBusId(
                    f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0")
            except Exception:
                return None
        watch = cls(handle, nvml)
        watch._thread.start()
        return watch

    def _read(self) -> tuple[float, float, float, int]:
        n, h = self._nvml, self._h
        mhz = float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        try:
            watts = n.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            watts = 0.0
        try:
            mask = int(n.nvmlDeviceGetCurrentClocksEventReasons(h))
        except Exception:
            mask = 0
        return time.monotonic(), mhz, watts, mask

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                s = self._read()
            except Exception:  # the device went away: the watch ends, summaries stay None
                return
            with self._lock:
                self._t.append(s[0])
                self._s.append(s)
                if self._t[0] < s[0] - KEEP_S:
                    cut = bisect.bisect_left(self._t, s[0] - KEEP_S)
                    del self._t[:cut], self._s[:cut]
            self._stop.wait(self._period)

    def window(self, t0: float, t1: float) -> dict | None:
        """The summary of the samples taken from t0 to t1 (time.monotonic()); a window shorter
        than a sampling period gets the sample nearest to it."""
        with self._lock:
            a = bisect.bisect_left(self._t, t0)
            b = bisect.bisect_right(self._t, t1)
            got = self._s[a:b] or self._s[max(0, a - 1):a + 1]
        return summarize(list(got), self.max_mhz)

    def stop(self) -> None:
        self._stop.set()
