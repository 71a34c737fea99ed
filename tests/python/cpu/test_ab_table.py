"""scripts/ab_table.py: an A/B call's runs (as scripts/ab_bench.sh leaves them) become one table and one JSON
file, rows in the order the runs ran, with the bench's rows as columns."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
SCRIPT = str(REPO / "scripts" / "ab_table.py")


def _run_dir(tmp_path, builds, reps, names):
    """Fake runs: <build>-r<rep>/decode-x.json with two rows each, and ab.txt in the order they ran."""
    order = []
    for rep in range(1, reps + 1):
        for i, build in enumerate(builds):
            d = tmp_path / names(build, rep)
            d.mkdir()
            rows = [
                {"workload": "D-B1", "shape": "M3-TP1", "pattern": "random", "impl": "msa", "us": 6.0 + i + rep / 10},
                {"workload": "D-B1", "shape": "M3-TP4", "pattern": "random", "impl": "msa-floor-no-token",
                 "us": 1.25, "tflops": None},
            ]
            (d / "decode-x.json").write_text(json.dumps({
                "bench": "decode", "date": "2026-11-30", "device": "H200", "ceilings": {"copy_gbps": 4250.4},
                "rows": rows}))
            order.append(f"{rep} {build} D-B1:M3-TP1:random:msa=...")
    (tmp_path / "ab.txt").write_text("\n".join(order) + "\n")
    return tmp_path


def _table(run_dir, *extra):
    out = subprocess.run([sys.executable, SCRIPT, str(run_dir), "# note", *extra], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("| ")]


def test_rows_in_run_order_and_columns_per_bench_row(tmp_path):
    run_dir = _run_dir(tmp_path, ["ab_main", "ab_le", "B"], 2, lambda b, r: f"{b}-r{r}")
    lines = _table(run_dir, "--json", str(tmp_path / "ab.json"))
    assert lines[0] == "| rep | build | D-B1 | D-B1:M3-TP4:floor-no-token | copy GB/s |"
    builds = [line.split("|")[2].strip() for line in lines[1:]]
    assert builds == ["ab_main", "ab_le", "B", "ab_main", "ab_le", "B"]  # as ab.txt says, not sorted
    assert lines[1] == "| 1 | ab_main | 6.10 | 1.25 | 4250 |"
    assert lines[6] == "| 2 | B | 8.20 | 1.25 | 4250 |"
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert saved["note"] == "# note" and [r["build"] for r in saved["runs"]][:3] == ["ab_main", "ab_le", "B"]


def test_older_run_names_without_the_r(tmp_path):
    run_dir = _run_dir(tmp_path, ["ab_mt1", "B"], 2, lambda b, r: f"{b}{r}")
    builds = [line.split("|")[2].strip() for line in _table(run_dir)[1:]]
    assert builds == ["ab_mt1", "B", "ab_mt1", "B"]  # "ab_mt11" is build ab_mt1, rep 1


def test_empty_run_dir_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, str(tmp_path), "# note"], capture_output=True, text=True)
    assert out.returncode != 0 and "argument 'run_dir'" in out.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
