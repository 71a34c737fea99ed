"""Summary of a query-major kernel trace (src/cuda/prefill_sm90/qmajor_trace.cuh): the `qtrace` lines of one launch,
read from a bench log, as quantiles over the CTAs of when each phase happened (us after the first CTA's start).

    python3 scripts/qtrace_summary.py LOG [LOG ...]
"""
import re, sys
def an(f):
    rows=[]
    for line in open(f):
        if not line.startswith("qtrace"): continue
        m=re.match(r"qtrace cta\s+(\d+) sm\s+(\d+) tiles (\d+) start_ns (\d+) \|(.*)",line)
        cta,sm,tiles,start=map(int,m.groups()[:4])
        vals=[int(x) for x in m.group(5).replace("|"," ").split()]
        rows.append((cta,sm,tiles,start,vals))
    t0=min(r[3] for r in rows)
    def q(xs): xs=sorted(xs); return f"min {xs[0]/1e3:7.2f} med {xs[len(xs)//2]/1e3:7.2f} max {xs[-1]/1e3:7.2f}"
    out=[f"== {f}: {len(rows)} CTAs; times in us from the first CTA's start (global timer)"]
    out.append(" CTA start            "+q([r[3]-t0 for r in rows]))
    out.append(" past the PDL wait    "+q([r[3]-t0+r[4][0] for r in rows]))
    out.append(" first Q landed       "+q([r[3]-t0+r[4][1] for r in rows]))
    out.append(" first K landed       "+q([r[3]-t0+r[4][2] for r in rows]))
    out.append(" first QK^T issued    "+q([r[3]-t0+r[4][3] for r in rows]))
    out.append(" CTA end              "+q([r[3]-t0+r[4][-1] for r in rows]))
    for t in range(6):
        d=[r[4][4+2*t]-r[4][3+2*t] for r in rows if r[2]>t and t<6]
        if d: out.append(f" tile {t}: first QK^T -> o written "+q(d))
    return "\n".join(out)
if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(an(f))
