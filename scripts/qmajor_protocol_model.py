#!/usr/bin/env python3
"""A discrete model of the query-major kernel's mbarrier protocol (src/cuda/sm90/qmajor_kernel.cuh with
two Q buffers, 3 K stages, 2 V stages, the cross-tile step and the scheduler warp's hand-over): the
scheduler (claims, records, Q), the K/V producer, one consumer (both consumer
warpgroups act alike on the mbarriers; the ping-pong's named barriers pair their sections one to one),
the kernel's waits and arrivals in the kernel's order. For random tile lists (tiles of 0 to 16 blocks)
and random interleavings it checks that every list finishes (no deadlock) and that whenever the
consumer reads a Q, K or V buffer it holds the tile / block the consumer expects. It checks the order
of waits and arrivals as transcribed here, not the compiled kernel: keep the two in step.

    python3 scripts/qmajor_protocol_model.py
"""
import itertools, random

KS, VS, QS = 3, 2, 2
LOOKAHEAD = 3  # kTileLookaheadBlocks

class Bar:
    def __init__(s, n): s.n, s.count, s.done = n, 0, 0
    def arrive(s):
        s.count += 1
        if s.count == s.n: s.count = 0; s.done += 1
    def passed(s, parity): return (s.done & 1) != parity

def run(tiles, seed):
    rnd = random.Random(seed)
    qf = [Bar(1) for _ in range(QS)]; qe = [Bar(1) for _ in range(QS)]
    kf = [Bar(1) for _ in range(KS)]; ke = [Bar(1) for _ in range(KS)]
    vf = [Bar(1) for _ in range(VS)]; ve = [Bar(1) for _ in range(VS)]
    qbuf = [None] * QS; kbuf = [None] * KS; vbuf = [None] * VS; tile_rec = [None] * QS
    af, go = Bar(1), Bar(1)  # hand-over (32 lane arrivals in the kernel: one here) and "claim the next"
    ahead = [None]
    def scheduler():
        q_it = 0
        for ti in tiles + [None]:
            if q_it > 0: yield lambda: go.passed((q_it - 1) & 1)
            qb = q_it % QS
            yield lambda: qe[qb].passed(((q_it // QS) & 1) ^ 1)
            tile_rec[qb] = ti
            if ti is not None and ti[1] > 0: qbuf[qb] = ti[0]
            qf[qb].arrive()
            ahead[0] = None if ti is None else ti[0]
            af.arrive()
            q_it += 1
            if ti is None: return
    def producer():
        it = 0; q_it = 0
        while True:
            yield lambda: af.passed(q_it & 1)
            ti = tile_rec[q_it % QS]
            assert ahead[0] == (None if ti is None else ti[0]), (ahead[0], ti)
            if ti is None: return
            trigger = max(ti[1] - LOOKAHEAD, 0)
            if ti[1] == 0: go.arrive()
            for j in range(ti[1]):
                st = it % KS; vs = it % VS
                yield lambda: ke[st].passed(((it // KS) & 1) ^ 1)
                kbuf[st] = (ti[0], j); kf[st].arrive()
                if j == trigger: go.arrive()
                yield lambda: ve[vs].passed(((it // VS) & 1) ^ 1)
                vbuf[vs] = (ti[0], j); vf[vs].arrive()
                it += 1
            q_it += 1
    out = []
    def consumer():
        it = 0; q_it = 0
        def fetch():
            qb = q_it % QS
            return qb, (lambda: qf[qb].passed((q_it // QS) & 1))
        qb, w = fetch(); yield w; ti = tile_rec[qb]
        started = False
        while ti is not None:
            tid, n = ti
            if n == 0:
                qe[q_it % QS].arrive(); out.append((tid, 'empty')); q_it += 1
                qb, w = fetch(); yield w; ti = tile_rec[qb]; continue
            cur_q = q_it % QS
            if not started:
                st = it % KS; yield (lambda: kf[st].passed((it // KS) & 1))
                assert qbuf[cur_q] == tid and kbuf[st] == (tid, 0), (qbuf[cur_q], kbuf[st], tid)
                if n == 1: qe[cur_q].arrive()
                ke[st].arrive()
            for i in range(1, n):
                st = (it + i) % KS; pvs = (it + i - 1) % VS
                yield (lambda: kf[st].passed(((it + i) // KS) & 1))
                yield (lambda: vf[pvs].passed(((it + i - 1) // VS) & 1))
                assert qbuf[cur_q] == tid and kbuf[st] == (tid, i) and vbuf[pvs] == (tid, i - 1)
                if i == n - 1: qe[cur_q].arrive()
                ke[st].arrive(); ve[pvs].arrive()
            lvs = (it + n - 1) % VS; lvph = ((it + n - 1) // VS) & 1
            it += n; q_it += 1
            qb, w = fetch(); yield w; nx = tile_rec[qb]
            yield (lambda: vf[lvs].passed(lvph))
            assert vbuf[lvs] == (tid, n - 1)
            if nx is not None and nx[1] > 0:
                st = it % KS; yield (lambda: kf[st].passed((it // KS) & 1))
                assert qbuf[q_it % QS] == nx[0] and kbuf[st] == (nx[0], 0)
                if nx[1] == 1: qe[q_it % QS].arrive()
                ke[st].arrive(); ve[lvs].arrive(); started = True
            else:
                ve[lvs].arrive(); started = False
            out.append((tid, 'done'))
            ti = nx
    agents = [scheduler(), producer(), consumer()]
    waits = [next(a) for a in agents]
    while True:
        ready = [k for k in range(3) if waits[k] is not None and waits[k]()]
        if not ready:
            if all(w is None for w in waits): break
            raise RuntimeError(f"deadlock: tiles {tiles}")
        k = rnd.choice(ready)
        try: waits[k] = next(agents[k])
        except StopIteration: waits[k] = None
    assert [t for t, _ in out] == [t[0] for t in tiles], out
    return True

n_cases = 0
for trial in range(4000):
    rnd = random.Random(trial)
    tiles = [(k, rnd.choice([0, 1, 1, 2, 3, 5, 16])) for k in range(rnd.randint(1, 9))]
    run(tiles, trial); n_cases += 1
print("ok", n_cases, "random tile lists, random interleavings")
