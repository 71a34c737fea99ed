#!/usr/bin/env python3
"""The result of one scripts/ab_bench.sh call as a Markdown table and one JSON file.

    scripts/ab_table.py RUN_DIR NOTE > table.md     # RUN_DIR: abr.tgz unpacked (or ab_bench's own folder)
    scripts/ab_table.py RUN_DIR NOTE --json out.json

RUN_DIR holds <build>-r<rep>.log and <build>-r<rep>/<bench>-<date>-<commit>.json for each run (the build
is "B" for the tree the script ran from, else the A checkout's folder name). Table rows are runs in
the order they ran (from ab.txt in RUN_DIR or beside it, else B last within a rep); columns are the bench rows (workload:shape:pattern:impl, with
M3-TP1, random and the msa prefix left out) in microseconds (TFLOP/s beside them where the bench gives it), and the copy ceiling of that process.
"""
import argparse
import json
import os
import re
import sys


def runs(run_dir):
    found = []
    for name in os.listdir(run_dir):
        # <build>-r<rep> (older calls: <build><rep>, one digit)
        m = re.fullmatch(r"(.+)-r(\d+)", name) or re.fullmatch(r"(.+)(\d)", name)
        if m and os.path.isdir(os.path.join(run_dir, name)):
            files = [f for f in os.listdir(os.path.join(run_dir, name)) if f.endswith(".json")]
            if len(files) == 1:
                with open(os.path.join(run_dir, name, files[0])) as f:
                    found.append((int(m.group(2)), m.group(1), json.load(f)))
    # The order the runs ran in: ab.txt beside the runs (its lines start "rep build"), else B last in a rep.
    ran = {}
    for txt in (os.path.join(run_dir, "ab.txt"), os.path.join(run_dir, "..", "ab.txt")):
        if os.path.exists(txt):
            with open(txt) as f:
                ran = {tuple(line.split()[:2]): i for i, line in enumerate(f) if len(line.split()) >= 2}
            break
    return sorted(found, key=lambda r: (r[0], ran.get((str(r[0]), r[1]), 0 if r[1] != "B" else 1), r[1]))


def key(row):
    parts = [row["workload"], row.get("shape", ""), row.get("pattern", ""), row.get("impl", "")]
    parts[3] = parts[3].removeprefix("msa-").removeprefix("msa")
    return ":".join(p for p in parts if p not in ("M3-TP1", "random", ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("note", help="what A and B are (commits), the command")
    ap.add_argument("--json", help="write the runs as one JSON file here")
    a = ap.parse_args()
    rs = runs(a.run_dir)
    if not rs:
        sys.exit(f"ab_table.py: argument 'run_dir': no <build>-r<rep>/ folders with one JSON file in {a.run_dir}")
    cols = []
    for _, _, res in rs:
        for row in res["rows"]:
            if key(row) not in cols:
                cols.append(key(row))
    print(f"{a.note}\n")
    print("| rep | build | " + " | ".join(cols) + " | copy GB/s |")
    print("|" + "---|" * (len(cols) + 3))
    for rep, build, res in rs:
        cell = {key(row): f"{row['us']:.2f}" + (f" ({row['tflops']:.1f})" if row.get("tflops") else "") for row in res["rows"]}
        cells = [cell.get(c, "") for c in cols]
        print(f"| {rep} | {build} | " + " | ".join(cells) + f" | {res['ceilings']['copy_gbps']:.0f} |")
    if a.json:
        first = rs[0][2]
        with open(a.json, "w") as f:
            json.dump({"bench": first["bench"], "date": first["date"], "device": first["device"], "note": a.note,
                       "runs": [{"rep": rep, "build": build, "result": res} for rep, build, res in rs]}, f, indent=1)


if __name__ == "__main__":
    main()
