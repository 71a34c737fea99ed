"""bench/gpu_monitor.py without a GPU: the nvidia-smi line parser and the per-row fields (the clock and
power-cap columns of the prefill results), and that a monitor without nvidia-smi degrades to a plain idle."""
import sys
from pathlib import Path

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
sys.path.insert(0, str(REPO / "bench"))
import gpu_monitor as gm  # noqa: E402


def test_parse_sample():
    s = gm.parse_sample("2026/11/30 02:54:19.929, 1980, 512.30, 0x0000000000000004\n")
    assert s is not None
    assert s[1:] == (1980.0, 512.3, 4)
    assert gm.parse_sample("timestamp, clocks.current.sm [MHz], power.draw [W], clocks_event_reasons.active") is None
    assert gm.parse_sample("2026/11/30 02:54:19.929, 1980, [N/A], 0x0") is None
    assert gm.parse_sample("No devices were found") is None


def test_window_fields():
    assert gm.window_fields([]) == {}
    samples = [(0.0, 1980.0, 300.0, 0x1), (0.02, 1710.0, 690.0, 0x4), (0.04, 1725.0, 700.0, 0x4 | 0x8),
               (0.06, 1980.0, 650.0, 0x0)]
    f = gm.window_fields(samples)
    assert f["sm_mhz"] == round((1725 + 1980) / 2)
    assert f["sm_mhz_min"] == 1710
    assert f["power_capped"] == 0.5
    assert f["clock_reasons"] == hex(0x4 | 0x8)  # idle (0x1) is not a throttle reason


def test_monitor_without_nvidia_smi(monkeypatch):
    monkeypatch.setattr(gm.shutil, "which", lambda name: None)
    mon = gm.GpuMonitor()
    assert not mon.available
    assert mon.rest(0.0, 5.0) < 5.0  # nothing to wait for beyond min_s
    with mon.window() as w:
        pass
    assert w.fields() == {}
