#!/usr/bin/env python3
"""Discrete models of the Hopper prefill kernels' mbarrier protocols, the kernels' waits and arrivals in
the kernels' order, run over random work lists and random interleavings of the roles. Each checks that
every list finishes (no deadlock) and that whenever a role reads a buffer or a record it holds what that
role expects. They check the order of waits and arrivals as transcribed here, not the compiled kernels:
keep the two in step.

- query-major (src/cuda/prefill_sm90/qmajor_kernel.cuh): two Q buffers, 3 K stages, 2 V stages, the cross-tile
  step; the scheduler warp (claims, records, Q), warp 0 (K/V), one consumer (both consumer warpgroups
  act alike on the mbarriers; the ping-pong's named barriers pair their sections one to one).
- KV-major (src/cuda/prefill_sm90/kvmajor_kernel.cuh): 2 K/V stages, 2 Q stages; the scheduler warp (claims,
  item records, K/V), warp 0 (Q tiles), one consumer (QK^T of job j with PV of job j - 1).
- fp8 K/V (f8=True, both kernels): the loads complete on the land barriers and the converter warps (one role:
  their threads act alike) widen the tiles in place and complete the full barriers; in the query-major kernel
  warp 0 loads block j's K before block j - 1's V inside a tile and a tile's last V after its last K, the
  converters widen them in that order (K(j), V(j - 1) if due, V(j) at a tile's last block) and stop at the
  end record warp 0 writes after the last block.

    python3 scripts/prefill_protocol_model.py
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

def run_qmajor(tiles, seed, f8=False):
    rnd = random.Random(seed)
    qf = [Bar(1) for _ in range(QS)]; qe = [Bar(1) for _ in range(QS)]
    kf = [Bar(1) for _ in range(KS)]; ke = [Bar(1) for _ in range(KS)]
    vf = [Bar(1) for _ in range(VS)]; ve = [Bar(1) for _ in range(VS)]
    kl = [Bar(1) for _ in range(KS)]; vl = [Bar(1) for _ in range(VS)]  # fp8: the loads land
    qbuf = [None] * QS; kbuf = [None] * KS; vbuf = [None] * VS; tile_rec = [None] * QS
    stage_rec = [None] * KS  # s.stage: the block of a K stage, 'end' after the last (fp8)
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
    def load_v_f8(b, blk):  # fp8: V of block b (an e4m3 tile, widened later)
        vs = b % VS
        yield lambda: ve[vs].passed(((b // VS) & 1) ^ 1)
        vbuf[vs] = ('e4m3', blk); vl[vs].arrive()
    def producer():
        it = 0; q_it = 0; pending = None; v_next = 0
        def flush_v():
            nonlocal v_next
            if f8 and v_next < it:
                yield from load_v_f8(v_next, pending); v_next += 1
        while True:
            yield lambda: af.passed(q_it & 1)
            ti = tile_rec[q_it % QS]
            assert ahead[0] == (None if ti is None else ti[0]), (ahead[0], ti)
            if ti is None:
                if f8:
                    st = it % KS
                    yield lambda: ke[st].passed(((it // KS) & 1) ^ 1)
                    stage_rec[st] = 'end'; kl[st].arrive()
                return
            trigger = max(ti[1] - LOOKAHEAD, 0)
            if ti[1] == 0: go.arrive()
            for j in range(ti[1]):
                st = it % KS; vs = it % VS
                yield lambda: ke[st].passed(((it // KS) & 1) ^ 1)
                stage_rec[st] = ((ti[0], j), j == ti[1] - 1)
                if f8:
                    kbuf[st] = ('e4m3', (ti[0], j)); kl[st].arrive()
                else:
                    kbuf[st] = (ti[0], j); kf[st].arrive()
                if j == trigger: go.arrive()
                if f8:
                    yield from flush_v()
                    pending = (ti[0], j)
                else:
                    yield lambda: ve[vs].passed(((it // VS) & 1) ^ 1)
                    vbuf[vs] = (ti[0], j); vf[vs].arrive()
                it += 1
            yield from flush_v()
            q_it += 1
    def converter():  # fp8: in warp 0's order, in place
        it = 0; v_next = 0
        while True:
            st = it % KS
            yield lambda: kl[st].passed((it // KS) & 1)
            if stage_rec[st] == 'end':
                assert v_next == it
                return
            blk, last = stage_rec[st]
            assert kbuf[st] == ('e4m3', blk), (kbuf[st], blk)
            kbuf[st] = blk; kf[st].arrive()
            while v_next < it + (1 if last else 0):
                vs = v_next % VS
                yield lambda: vl[vs].passed((v_next // VS) & 1)
                assert vbuf[vs][0] == 'e4m3', vbuf[vs]
                vbuf[vs] = vbuf[vs][1]; vf[vs].arrive(); v_next += 1
            it += 1
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
    drive([scheduler(), producer(), consumer()] + ([converter()] if f8 else []), rnd, tiles)
    assert [t for t, _ in out] == [t[0] for t in tiles], out


def drive(agents, rnd, what):
    """Runs the roles (generators yielding wait predicates) in a random order among those ready."""
    waits = [next(a) for a in agents]
    while True:
        ready = [k for k in range(len(agents)) if waits[k] is not None and waits[k]()]
        if not ready:
            if all(w is None for w in waits): return
            raise RuntimeError(f"deadlock: {what}")
        k = rnd.choice(ready)
        try: waits[k] = next(agents[k])
        except StopIteration: waits[k] = None


def run_kvmajor(items, seed, tile_tokens=8, lookahead=LOOKAHEAD, f8=False):
    """items: (id, count) work items with count >= 1 tokens, cut into Q tiles of tile_tokens."""
    rnd = random.Random(seed)
    KB, QB = 2, 2
    kf = [Bar(1) for _ in range(KB)]; ke = [Bar(1) for _ in range(KB)]
    kl = [Bar(1) for _ in range(KB)]  # fp8: the loads land
    qf = [Bar(1) for _ in range(QB)]; qe = [Bar(1) for _ in range(QB)]
    af, go = Bar(1), Bar(1)
    kvbuf = [None] * KB; rec = [None] * KB; qbuf = [None] * QB; ahead = [None]
    def ntiles(c): return (c + tile_tokens - 1) // tile_tokens
    def scheduler():
        for item_it, it in enumerate(items + [None]):
            if item_it > 0: yield lambda: go.passed((item_it - 1) & 1)
            kb = item_it % KB
            yield lambda: ke[kb].passed(((item_it // KB) & 1) ^ 1)
            rec[kb] = it
            if it is not None: kvbuf[kb] = ('e4m3', it[0]) if f8 else it[0]
            (kl if f8 else kf)[kb].arrive()
            ahead[0] = None if it is None else (it[0], 0)
            af.arrive()
            if it is None: return
    def producer():
        q_it = 0
        for item_it in itertools.count():
            yield lambda: af.passed(item_it & 1)
            it = rec[item_it % KB]
            assert ahead[0] == (None if it is None else (it[0], 0)), (ahead[0], it)
            if it is None: return
            n = ntiles(it[1]); trigger = max(n - lookahead, 0)
            for q in range(n):
                qs = q_it % QB
                if q == trigger: go.arrive()
                yield lambda: qe[qs].passed(((q_it // QB) & 1) ^ 1)
                qbuf[qs] = (it[0], q); qf[qs].arrive()
                q_it += 1
    def converter():  # fp8: an item's K/V widened in place; the end record passed on to the consumers
        for item_it in itertools.count():
            kb = item_it % KB; ph = (item_it // KB) & 1
            yield lambda: kl[kb].passed(ph)
            it = rec[kb]
            if it is not None:
                assert kvbuf[kb] == ('e4m3', it[0]), (kvbuf[kb], it)
                kvbuf[kb] = it[0]
            kf[kb].arrive()
            if it is None: return
    done = []
    def consumer():
        jobs = []  # (item, q, kb, last_of_item) in stream order, built as the records are read
        item_it = 0; q_it = 0
        def next_job():
            nonlocal item_it, q_it
            while not jobs:
                kb = item_it % KB; ph = (item_it // KB) & 1
                yield lambda: kf[kb].passed(ph)
                it = rec[kb]; item_it += 1
                if it is None: return None
                assert kvbuf[kb] == it[0]
                n = ntiles(it[1])
                jobs.extend((it[0], q, kb, q == n - 1) for q in range(n))
            job = jobs.pop(0)
            qs = q_it % QB; ph = (q_it // QB) & 1; q_it += 1
            yield lambda: qf[qs].passed(ph)
            assert qbuf[qs] == job[:2] and kvbuf[job[2]] == job[0], (qbuf[qs], job)
            return job + (qs,)
        cur = yield from next_job()
        if cur is None: return
        qe[cur[4]].arrive()  # after the first QK^T
        prev = cur
        while True:
            cur = yield from next_job()
            if cur is None: break
            assert kvbuf[prev[2]] == prev[0]  # PV(prev) reads V of prev's stage, issued with QK^T(cur)
            qe[cur[4]].arrive()
            if prev[3]: ke[prev[2]].arrive()
            done.append(prev[:2]); prev = cur
        assert kvbuf[prev[2]] == prev[0]
        if prev[3]: ke[prev[2]].arrive()
        done.append(prev[:2])
    drive([scheduler(), producer(), consumer()] + ([converter()] if f8 else []), rnd, items)
    assert done == [(i, q) for i, c in items for q in range(ntiles(c))], done

def main(trials=4000):
    for trial in range(trials):
        rnd = random.Random(trial)
        tiles = [(k, rnd.choice([0, 1, 1, 2, 3, 5, 16])) for k in range(rnd.randint(1, 9))]
        run_qmajor(tiles, trial)
        run_qmajor(tiles, trial, f8=True)
        items = [(k, rnd.choice([1, 3, 8, 9, 17, 64])) for k in range(rnd.randint(0, 9))]
        lookahead = rnd.choice([1, 2, 3, 6])
        run_kvmajor(items, trial, lookahead=lookahead)
        run_kvmajor(items, trial, lookahead=lookahead, f8=True)
    print("ok", trials, "random tile lists and item lists each, 16-bit and fp8 K/V, random interleavings")


if __name__ == "__main__":
    main()
