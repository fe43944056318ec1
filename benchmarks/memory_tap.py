"""The host-side cost of memory tracking per batch: the marks of a train batch driven straight into a `TimingRecorder`,
and through a `MemoryTap` reading a `FakeMemory` on one batch in `every`. The fake's `read` is two integer moves, so
what this measures is the tap's own Python: the allocator's calls on a real GPU (one nested-statistics call and a
peak reset per reading) come on top, and are measured by `gpu_overhead.py` (`events+mem`, `events+mem1`).

    python benchmarks/memory_tap.py                 # 100,000 batches, 5 repeats, every = 1, 10, 100
"""
import argparse, statistics, time
from fastxtend_prof.core.recorder import *
from fastxtend_prof.features.memory import MemoryTap, FakeMemory

MARKS = (AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH)

def drive(n:int, every:int|None) -> float:
    "Seconds to drive `n` train batches' marks through the recorder (and a tap reading one batch in `every`, if given)"
    rec = TimingRecorder(keep_raw=False)
    to = rec if every is None else MemoryTap(rec, FakeMemory(), every, 'fake:0')
    draw, start, mark, draw_mark, end = to.draw, to.start_batch, to.mark, to.draw_mark, to.end_batch
    to.start(Step.FIT); to.begin_phase(Phase.TRAIN)
    t = time.perf_counter()
    for _ in range(n):
        draw(); draw_mark(AFTER_LOAD); start(64.)
        for s in MARKS: mark(s)
        end()
    t = time.perf_counter() - t
    to.end_phase(); to.stop(Step.FIT)
    return t

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--batches', type=int, default=100_000)
    ap.add_argument('--repeats', type=int, default=5)
    a = ap.parse_args()
    configs = {'recorder alone': None, 'tap, every batch': 1, 'tap, 1 in 10': 10, 'tap, 1 in 100': 100}
    times = {k: [] for k in configs}
    for _ in range(a.repeats):  # interleaved, so a slow moment of the machine falls on every configuration
        for k, every in configs.items(): times[k].append(drive(a.batches, every)/a.batches*1e6)
    base = statistics.median(times['recorder alone'])
    print(f'{a.batches:,} train batches (9 marks each), {a.repeats} interleaved repeats, medians; µs per batch')
    print(f"{'configuration':<18} {'µs/batch':>9} {'added':>7}")
    for k, v in times.items(): print(f'{k:<18} {statistics.median(v):>9.2f} {statistics.median(v) - base:>7.2f}')

if __name__ == '__main__': main()
