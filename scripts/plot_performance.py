#!/usr/bin/env python3
"""Redraws docs/performance.md's charts and tables from the runs of record (bench/results/<bench>.json).

    python3 scripts/plot_performance.py

writes docs/img/decode_copy_fraction.svg and docs/img/prefill_tflops.svg, and rewrites the tables of
docs/performance.md that stand between `<!-- table: NAME -->` and `<!-- end table -->` (the prose around them is
left alone). No dependency beyond Python: the SVG is written by hand. msa's figures come from the JSON; the
peers' figures that the JSON does not hold are those of the project's benchmark spec (benchmarks.md), copied
into PEERS below.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
IMG = ROOT / "docs" / "img"
DOC = ROOT / "docs" / "performance.md"

# Peers measured on the same kind of H200 (benchmarks.md). sglang's decode is given in microseconds per call;
# the chart turns it into bytes per second with the byte count msa's rows use (below) and the copy ceiling of
# the peers' run. FlashInfer's decode runs an fp8 K/V cache and is given as its fraction of the copy ceiling
# counting fp8 bytes.
PEERS = {
    "copy_gbps": 4271.0,
    "sglang_decode_us": {1: 12.0, 8: 24.0, 32: 52.0, 64: 90.0, 128: 188.0},          # M3-TP1, graph replay
    "flashinfer_fp8_decode_ratio": {1: 0.05, 32: 0.56, 64: 0.68, 128: 0.78},         # M3-TP1, fp8 K/V
    "prefill": {  # M3-TP1 effective TFLOP/s: {workload: {(impl, pattern): figure}}
        "P-32K": {("sglang", "random"): 87.0, ("sglang", "clustered"): 86.5, ("sglang", "shared"): 86.7,
                  ("flashinfer-fp8", "random"): 152.0, ("flashinfer-fp8", "clustered"): 179.0,
                  ("flashinfer-fp8", "shared"): 211.0, ("flex", "shared"): 387.0, ("cudnn-sdpa", "dense"): 593.0},
        "P-chunk": {("sglang", "random"): 86.0, ("flashinfer-fp8", "random"): 143.0,
                    ("flashinfer-fp8", "clustered"): 175.0, ("flashinfer-fp8", "shared"): 207.0},
    },
}
# M3-TP1 decode at 65536 tokens, top-16 `random`: per request 4 KV heads x 16 blocks x 128 keys x 128 dims x
# (K, V) x 2 bytes, plus q and o (64 heads x 128 dims x 2 bytes each).
DECODE_BYTES_PER_REQUEST = 4 * 16 * 128 * 128 * 2 * 2 + 2 * 64 * 128 * 2

BARS_DECODE = 0.85  # D-B32..B128, fraction of the copy ceiling
BARS_PREFILL = {"random": 250, "clustered": 450, "shared": 550}  # P-32K and P-chunk, TFLOP/s

COLORS = {"msa": "#1f5fa8", "msa-tp4": "#6fa0d8", "msa-fp8": "#16a085", "sglang": "#d9822b", "flashinfer-fp8": "#7a9a01",
          "flex": "#8e44ad", "cudnn-sdpa": "#7f7f7f"}
NAMES = {"msa": "msa", "msa-tp4": "msa, M3-TP4", "msa-fp8": "msa, fp8 K/V", "sglang": "sglang Triton",
         "flashinfer-fp8": "FlashInfer (fp8 K/V)",
         "flex": "FlexAttention", "cudnn-sdpa": "cuDNN SDPA (dense)"}
TITLES = {"P-32K": "P-32K: 32768 tokens, no prefix", "P-chunk": "P-chunk: 4096 tokens after 28672 cached"}
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


class Svg:
    def __init__(self, width: int, height: int):
        self.width, self.height, self.parts = width, height, []

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", color="#222", rotate=None):
        rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" text-anchor="{anchor}" '
                 f'font-weight="{weight}" fill="{color}"{rot}>{s}</text>')

    def line(self, x1, y1, x2, y2, color="#222", width=1.0, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
                 f'stroke-width="{width}"{d}/>')

    def rect(self, x, y, w, h, color, stroke="none"):
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{color}" stroke="{stroke}"/>')

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "\n".join(self.parts)
        path.write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                        f'viewBox="0 0 {self.width} {self.height}">\n<rect width="100%" height="100%" fill="white"/>\n'
                        f"{body}\n</svg>\n")


def load(bench: str) -> dict:
    return json.loads((RESULTS / f"{bench}.json").read_text())


def decode_chart(doc: dict) -> Svg:
    """Fraction of the copy ceiling against the batch size (log scale), msa's M3 shapes and the peers at M3-TP1."""
    series = {}
    for key, shape, suffix in (("msa", "M3-TP1", ""), ("msa-tp4", "M3-TP4", ""), ("msa-fp8", "M3-TP1", "-fp8")):
        pts = {}
        for r in doc["rows"]:
            m = re.fullmatch(r"D-B(\d+)" + suffix, r["workload"])
            if m and r["shape"] == shape and r["impl"] == "msa" and r["pattern"] == "random" and r["ratio"] is not None:
                pts[int(m.group(1))] = r["ratio"]
        series[key] = pts
    series["sglang"] = {b: b * DECODE_BYTES_PER_REQUEST / (us * 1e-6) / 1e9 / PEERS["copy_gbps"]
                        for b, us in PEERS["sglang_decode_us"].items()}
    series["flashinfer-fp8"] = dict(PEERS["flashinfer_fp8_decode_ratio"])

    svg = Svg(760, 430)
    left, right, top, bottom = 70, 540, 50, 370
    ymax = 1.1
    xs = [1, 8, 32, 64, 128]
    xpos = lambda b: left + (right - left) * math.log2(b) / math.log2(128)  # noqa: E731
    ypos = lambda v: bottom - (bottom - top) * v / ymax  # noqa: E731
    svg.text(20, 28, "Decode, 65536 cached tokens per request, top-16: fraction of the copy ceiling", 15, weight="bold")
    for v in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        svg.line(left, ypos(v), right, ypos(v), "#e3e3e3")
        svg.text(left - 8, ypos(v) + 4, f"{v:.1f}", 11, "end")
    for b in xs:
        svg.line(xpos(b), bottom, xpos(b), bottom + 5)
        svg.text(xpos(b), bottom + 20, str(b), 11, "middle")
    svg.line(left, bottom, right, bottom)
    svg.line(left, top, left, bottom)
    svg.text((left + right) / 2, bottom + 42, "batch size B (requests, one query token each)", 12, "middle")
    svg.text(22, (top + bottom) / 2, "bytes read / time, over the copy ceiling", 12, "middle", rotate=-90)
    svg.line(xpos(32), ypos(BARS_DECODE), xpos(128), ypos(BARS_DECODE), "#c0392b", 1.5, "6 4")
    for key, pts in series.items():
        if not pts:
            continue
        color = COLORS[key]
        coords = [(xpos(b), ypos(v)) for b, v in sorted(pts.items())]
        dash = ' stroke-dasharray="5 3"' if key in ("sglang", "flashinfer-fp8") else ""
        svg.add(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in coords)}" fill="none" '
                f'stroke="{color}" stroke-width="2"{dash}/>')
        for (b, v), (x, y) in zip(sorted(pts.items()), coords):
            svg.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')
            if key == "msa":
                svg.text(x + 6 if b == 1 else x, y - 10 if b == 1 else y - 8, f"{v:.2f}", 10, "start" if b == 1 else "middle", color=color)
    ly = top + 10
    for key in series:
        svg.line(right + 25, ly, right + 50, ly, COLORS[key], 2, "5 3" if key in ("sglang", "flashinfer-fp8") else None)
        svg.add(f'<circle cx="{right + 37.5:.1f}" cy="{ly:.1f}" r="3.5" fill="{COLORS[key]}"/>')
        svg.text(right + 58, ly + 4, NAMES[key] if key != "msa" else "msa, M3-TP1", 11)
        ly += 22
    svg.line(right + 25, ly, right + 50, ly, "#c0392b", 1.5, "6 4")
    svg.text(right + 58, ly + 4, f"bar: {BARS_DECODE} at B >= 32", 11, color="#c0392b")
    svg.text(right + 25, ly + 28, "peers (dashed) at M3-TP1", 10, color="#555")
    return svg


def prefill_chart(doc: dict) -> Svg:
    """Effective TFLOP/s per selection pattern at M3-TP1, P-32K and P-chunk, msa against the peers."""
    patterns = ["random", "clustered", "shared", "dense"]
    order = ["msa", "sglang", "flashinfer-fp8", "flex", "cudnn-sdpa"]
    panels = {}
    for wl in ("P-32K", "P-chunk"):
        vals = {}
        for r in doc["rows"]:
            if r["workload"] != wl or r["shape"] != "M3-TP1" or r.get("tflops") is None:
                continue
            impl = {"msa-dense": "msa"}.get(r["impl"], r["impl"])
            if impl in order:
                vals[(impl, r["pattern"])] = r["tflops"]
        for k, v in PEERS["prefill"][wl].items():
            vals.setdefault(k, v)
        panels[wl] = vals

    svg = Svg(900, 470)
    top, bottom, ymax = 60, 380, 700.0
    ypos = lambda v: bottom - (bottom - top) * v / ymax  # noqa: E731
    svg.text(20, 28, "Prefill at M3-TP1: effective TFLOP/s by selection pattern (bf16; FlashInfer: fp8 K/V)",
             15, weight="bold")
    panel_w, gap, x0 = 370, 40, 70
    bar_w = 14
    for i, (wl, vals) in enumerate(panels.items()):
        left = x0 + i * (panel_w + gap)
        right = left + panel_w
        for v in range(0, 701, 100):
            svg.line(left, ypos(v), right, ypos(v), "#e3e3e3")
            if i == 0:
                svg.text(left - 8, ypos(v) + 4, str(v), 11, "end")
        svg.line(left, bottom, right, bottom)
        svg.text((left + right) / 2, top - 12, TITLES[wl], 13, "middle", weight="bold")
        group_w = panel_w / len(patterns)
        for g, pat in enumerate(patterns):
            present = [impl for impl in order if (impl, pat) in vals]
            cx = left + group_w * (g + 0.5)
            start = cx - len(present) * bar_w / 2
            for j, impl in enumerate(present):
                v = vals[(impl, pat)]
                x = start + j * bar_w
                svg.rect(x + 1, ypos(v), bar_w - 2, bottom - ypos(v), COLORS[impl])
                svg.text(x + bar_w / 2 + 3, ypos(v) - 4, f"{v:.0f}", 9, "start", color="#333", rotate=-90)
            if pat in BARS_PREFILL:
                y = ypos(BARS_PREFILL[pat])
                svg.line(cx - group_w * 0.45, y, cx + group_w * 0.45, y, "#c0392b", 1.5, "6 4")
            svg.text(cx, bottom + 18, pat, 11, "middle")
    svg.text(22, (top + bottom) / 2, "effective TFLOP/s", 12, "middle", rotate=-90)
    lx, ly = x0, bottom + 48
    for impl in order:
        svg.rect(lx, ly - 10, 12, 12, COLORS[impl])
        svg.text(lx + 17, ly, NAMES[impl], 11)
        lx += 36 + 6.2 * len(NAMES[impl])
    svg.line(lx, ly - 4, lx + 24, ly - 4, "#c0392b", 1.5, "6 4")
    svg.text(lx + 30, ly, "bar", 11, color="#c0392b")
    return svg


# Bars the JSON does not carry: dense decode at D-B1, the indexer and host rows.
BAR_DENSE_DECODE = "ratio>=0.80"
BARS_OTHER = {("I-scores-P-32K", "ratio"): 0.60, ("I-topk-P-32K", "us"): 150, ("I-step-D-B64", "ratio"): 0.90,
              ("I-step-D-B64-fp8", "us"): 150, ("I-topk-D-B64", "us"): 6, ("plan-decode-B128", "us"): 20}


def fmt(v, digits: int = 1) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def table(cols: list, rows: list) -> str:
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def bar_cell(kind: str, limit: float, value) -> str:
    """A '>= 0.85: met' cell: kind 'ratio' or 'tflops' (at least the limit) or 'us' (at most)."""
    if value is None:
        return ""
    met = value <= limit if kind == "us" else value >= limit
    unit = " us" if kind == "us" else " TFLOP/s" if kind == "tflops" else ""
    return f"{'<=' if kind == 'us' else '>='} {limit:g}{unit}: {'met' if met else 'not met'}"


def decode_table(doc: dict, dense_bar: bool = True) -> str:
    """dense_bar: the dense D-B1 row's bar (the Hopper path's), which the JSON rows do not carry."""
    rows = []
    for r in doc["rows"]:
        dense_b1 = dense_bar and (r["workload"], r["pattern"]) == ("D-B1", "dense")
        bar, spec = "", r.get("bar") or (BAR_DENSE_DECODE if dense_b1 else None)
        if spec:
            kind, limit = ("ratio", spec.split(">=")[1]) if ">=" in spec else ("us", spec.split("<=")[1])
            bar = bar_cell(kind, float(limit), r["ratio"] if kind == "ratio" else r["us"])
        rows.append([r["workload"], r["shape"], r["pattern"], fmt(r["us"], 2), fmt(r["gbps"], 0), fmt(r["ratio"], 3), bar])
    return table(["workload", "shape", "pattern", "us per call", "GB/s", "of copy", "bar"], rows)


# fp8 K/V sparse prefill: at least this fraction of the bf16 cache's speed, same run (vs_bf16 = bf16 time / fp8 time).
BAR_PREFILL_FP8_VS_BF16 = 0.95


def prefill_table(doc: dict) -> str:
    rows = []
    for r in doc["rows"]:
        bar = "" if r.get("bar_tflops") is None else bar_cell("tflops", r["bar_tflops"], r["tflops"])
        vs = r.get("vs_bf16")
        if vs is not None and r["pattern"] != "dense":
            bar = f">= {BAR_PREFILL_FP8_VS_BF16} of bf16: {'met' if vs >= BAR_PREFILL_FP8_VS_BF16 else 'not met'}"
        rows.append([r["workload"], r["shape"], r["pattern"], r["impl"], fmt(r["us"], 1), fmt(r["tflops"], 1),
                     fmt(r["ratio"], 3), "" if vs is None else f"{vs:.3f}", r.get("sm_mhz", ""), bar])
    return table(["workload", "shape", "pattern", "impl", "us", "TFLOP/s", "of matmul", "vs bf16", "SM MHz", "bar"],
                 rows)


# The portable prefill's dense bar: within 15% of the SDPA flash backend (FlashAttention-2's kernels) in time.
BAR_PORTABLE_DENSE_VS_FLASH = 1 / 1.15


def prefill_portable_table(doc: dict) -> str:
    """The portable path's prefill rows: sparse rows against their bars (TFLOP/s), the dense row against the
    SDPA flash backend of the same run (vs_sdpa_flash = its time over msa's), fp8 rows against bf16 (vs_bf16)."""
    rows = []
    for r in doc["rows"]:
        vs = r.get("vs_sdpa_flash", r.get("vs_bf16"))
        label = "vs sdpa-flash" if "vs_sdpa_flash" in r else "vs bf16" if "vs_bf16" in r else ""
        bar = "" if r.get("bar_tflops") is None else bar_cell("tflops", r["bar_tflops"], r["tflops"])
        if "vs_sdpa_flash" in r:
            met = r["vs_sdpa_flash"] >= BAR_PORTABLE_DENSE_VS_FLASH
            bar = f">= {BAR_PORTABLE_DENSE_VS_FLASH:.2f} of sdpa-flash: {'met' if met else 'not met'}"
        rows.append([r["workload"], r["shape"], r["pattern"], r["impl"], fmt(r["us"], 1), fmt(r["tflops"], 1),
                     f"{label} {vs:.3f}" if vs is not None else "", bar])
    return table(["workload", "shape", "pattern", "impl", "us", "TFLOP/s", "against", "bar"], rows)


def indexer_table(doc: dict) -> str:
    rows = []
    for r in doc["rows"]:
        if r["workload"] == "graph-floor":
            continue
        kind = next((k for (w, k) in BARS_OTHER if w == r["workload"]), None)
        bar = "" if kind is None else bar_cell(kind, BARS_OTHER[(r["workload"], kind)],
                                               r["ratio"] if kind == "ratio" else r["us"])
        rows.append([r["workload"], r["pattern"], fmt(r["us"], 2), fmt(r["tflops"], 1), fmt(r["gbps"], 0),
                     fmt(r["ratio"], 3), bar])
    return table(["workload", "layout", "us", "TFLOP/s", "GB/s", "ratio", "bar"], rows)


def layer_table(doc: dict) -> str:
    """The layer step's chain rows with their stages beside them (one row per workload and shape)."""
    stages = {(r["workload"], r["shape"], r["pattern"]): r for r in doc["rows"] if r["impl"] == "msa"}
    rows = []
    for r in doc["rows"]:
        if r["pattern"] != "chain":
            continue
        st = {p: stages.get((r["workload"], r["shape"], p), {}).get("us") if r["impl"] == "msa" else None
              for p in ("scores", "topk", "attention")}
        spec = r.get("bar")
        bar = bar_cell("ratio", float(spec.split(">=")[1]), r["ratio"]) if spec and ">=" in spec else ""
        rows.append([r["workload"], r["shape"], r["impl"], fmt(r["us"], 1), fmt(st["scores"], 1), fmt(st["topk"], 1),
                     fmt(st["attention"], 1), fmt(r["ratio"], 3), bar])
    return table(["workload", "shape", "impl", "chain us", "scores", "top-k", "attention", "ratio", "bar"], rows)


def host_table(plan: dict, run_host: dict) -> str:
    rows = []
    for r in plan["rows"] + run_host["rows"]:
        bar = "" if (r["workload"], "us") not in BARS_OTHER else bar_cell("us", BARS_OTHER[(r["workload"], "us")], r["us"])
        rows.append([r["workload"], r["shape"], r["pattern"], r["impl"], fmt(r["us"], 2), fmt(r.get("worst_us"), 1), bar])
    return table(["call", "shape", "path", "impl", "median us", "max us", "bar"], rows)


def records_table(docs: dict) -> str:
    rows = []
    for bench, doc in docs.items():
        for part in doc.get("parts") or [doc]:
            c = part["ceilings"]
            rows.append([bench + (f" ({', '.join(part['workloads'])})" if "parts" in doc else ""), part["commit"],
                         fmt(c["copy_gbps"], 0), fmt(c["matmul_tflops"], 0)])
    return table(["bench", "commit measured", "copy ceiling GB/s", "matmul ceiling TFLOP/s"], rows)


def rewrite_tables(docs: dict) -> None:
    tables = {"records": records_table(docs), "decode": decode_table(docs["decode"]),
              "decode-portable": decode_table(docs["decode-portable"], dense_bar=False),
              "prefill": prefill_table(docs["prefill"]),
              "prefill-portable": prefill_portable_table(docs["prefill-portable"]), "indexer": indexer_table(docs["indexer"]),
              "layer": layer_table(docs["layer"]),
              "host": host_table(docs["plan"], docs["run_host"])}
    text = DOC.read_text()
    for name, body in tables.items():
        pattern = re.compile(rf"(<!-- table: {name} -->\n).*?(<!-- end table -->)", re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: no '<!-- table: {name} -->' ... '<!-- end table -->' block")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    DOC.write_text(text)


def main() -> None:
    docs = {b: load(b) for b in ("decode", "decode-portable", "prefill", "prefill-portable", "indexer", "layer", "plan",
                                  "run_host")}
    decode_chart(docs["decode"]).write(IMG / "decode_copy_fraction.svg")
    prefill_chart(docs["prefill"]).write(IMG / "prefill_tflops.svg")
    rewrite_tables(docs)
    print(f"wrote {IMG / 'decode_copy_fraction.svg'}, {IMG / 'prefill_tflops.svg'} and the tables of {DOC}")


if __name__ == "__main__":
    main()
