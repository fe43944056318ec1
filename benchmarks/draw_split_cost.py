"""What splitting the draw costs per batch on the CPU: profiled fits of fastai's `synth_learner` (1,000 train batches,
one thread) with the draw split as it ships, and with `events.split_draw` replaced by a context that wraps nothing (the
loop's own `AFTER_LOAD` mark stays), interleaved in one process (which goes first alternates), medians over rounds.

    python benchmarks/draw_split_cost.py              # 20 rounds
"""
import argparse, statistics, time, torch
from fastai.test_utils import synth_learner
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from fastxtend_prof import events

SHIPPED = events.split_draw

def _unsplit(dl, mark): return SHIPPED(iter(()), mark)  # as for a loader of neither kind: the loop's own mark only

def fit_us_per_batch(split:bool, n:int) -> float:
    events.split_draw = SHIPPED if split else _unsplit
    try:
        learn = synth_learner(n_trn=n, n_val=10)
        learn.remove_cb(ProgressCallback)
        learn.profile(show_report=False, logger_callback=None)
        t = time.perf_counter()
        with learn.no_logging(): learn.fit(1)
        return (time.perf_counter() - t)/n*1e6
    finally: events.split_draw = SHIPPED

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rounds', type=int, default=20)
    ap.add_argument('--batches', type=int, default=1000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    fit_us_per_batch(True, 50); fit_us_per_batch(False, 50)  # warm up both paths
    res = {True: [], False: []}
    for r in range(a.rounds):
        for s in ((True, False) if r % 2 else (False, True)): res[s].append(fit_us_per_batch(s, a.batches))  # the order alternates
    diff = statistics.median(x - y for x, y in zip(res[True], res[False]))
    print(f'{a.batches} train batches per fit, {a.rounds} interleaved rounds, medians (whole fit, µs per batch)')
    print(f"split draw (shipped)   {statistics.median(res[True]):8.1f}\nunsplit draw           {statistics.median(res[False]):8.1f}\n"
          f"split minus unsplit    {diff:8.1f}  (median of the rounds' differences)")

if __name__ == '__main__': main()
