"""Where the profiler's per-batch cost goes on the CPU, part by part.

Two measurements, both on fastai's `synth_learner` with one torch thread:

1. **Fits, interleaved in one process.** Each round runs one fit of 1,000 train batches per configuration (the order
   rotates), and times fastai's epoch loop (`Learner._do_fit`). The configurations add one part at a time:
   - `none`: fastai alone;
   - `floor`: the loop that emits `before_draw` plus two bare callbacks stamping `perf_counter()` at every per-batch
     event (as in `overhead.py`);
   - `callbacks`: our two callbacks, the loop and the session, with every per-batch mark swallowed by a relay in
     front of the recorder and the draw not split: what fastai's dispatch and our callbacks cost (the pair answers
     the per-batch events from its `_events`, the floor's callbacks go through fastai's `Callback.__call__`);
   - `+ relay`: as `callbacks` plus a relay that watches nothing (its marks are bound straight through);
   - `+ marks`: the recorder takes the marks (the draw still not split);
   - `+ split`: the draw split on: the default profile as shipped;
   - `+ flops`: with `learn.profile(flops=True)` (its shape check at every train batch, and the one batch a fit it
     counts on the side).
   The table gives each configuration's µs per batch over `none` (medians of per-round differences), and each part's
   cost as the difference from the row above.
2. **Each mark alone**, timed with `timeit` on a recorder driven as a fit drives it: what one call costs.

    python benchmarks/hot_path.py                  # 20 rounds
    python benchmarks/hot_path.py --rounds 40 --batches 2000
"""
import argparse, math, statistics, time, timeit
import torch
from fastai.test_utils import synth_learner
from fastai.callback.core import Callback
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (Learner.profile)
from fastxtend_prof.core.recorder import *
from fastxtend_prof.profiler.simpleprofiler import SimpleProfilerCallback

class Swallow(Relay):
    "Takes the per-batch marks and passes none on: the recorder sees loops and spans but no batch"
    def draw(self): pass
    def draw_mark(self, slot): return math.nan
    def start_batch(self, samples=math.nan): pass
    def mark(self, slot): pass
    def end_batch(self, samples=None): pass

def _stamp(self): self.t.append(time.perf_counter())
class Floor(Callback):
    "Appends perf_counter() at every per-batch event fastai dispatches, and answers `training` itself"
    def __init__(self): self.t = []
    @property
    def training(self): return self.learn.training
    before_draw = before_batch = after_pred = after_loss = before_backward = after_backward = before_step = after_step = after_batch = _stamp
class FloorPre(Floor): order = -1000
class FloorPost(Floor): order = 49

CONFIGS = ('none', 'floor', 'callbacks', '+ relay', '+ marks', '+ split', '+ flops')
_SHIPPED_MARKER = SimpleProfilerCallback.draw_marker

def fit_loop_us(learn, config:str, n:int) -> float:
    "One fit of `learn` in `config`: µs per batch of fastai's epoch loop"
    split = config in ('+ split', '+ flops')
    SimpleProfilerCallback.draw_marker = _SHIPPED_MARKER if split else (lambda self: None)
    try:
        if config == 'floor': learn.add_cbs([FloorPre(), FloorPost()])
        elif config != 'none':
            obs = {'callbacks': [Swallow], '+ relay': [Swallow, Relay]}.get(config, [])
            learn.profile(show_report=False, logger_callback=None, observers=obs, flops=config == '+ flops')
        loop = []
        do_fit = learn._do_fit
        def timed():
            t = time.perf_counter(); do_fit(); loop.append(time.perf_counter() - t)
        learn._do_fit = timed
        try:
            with learn.no_logging(): learn.fit(1)
        finally: del learn._do_fit
        if config == 'floor': learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, Floor)])
        return loop[0]/(n + max(1, n//10))*1e6
    finally: SimpleProfilerCallback.draw_marker = _SHIPPED_MARKER

def fits(rounds:int, n:int) -> dict:
    learn = synth_learner(n_trn=n, n_val=max(1, n//10))
    learn.remove_cb(ProgressCallback)
    for c in CONFIGS: fit_loop_us(learn, c, n)  # warm up every path
    out = {c: [] for c in CONFIGS}
    for r in range(rounds):
        k = r % len(CONFIGS)
        for c in CONFIGS[k:] + CONFIGS[:k]: out[c].append(fit_loop_us(learn, c, n))
    return out

def mark_costs(number:int=20000) -> dict:
    "µs per call of each mark on a recorder in the middle of a train loop (the draw's marks: per draw, as a fit sends them)"
    rec = TimingRecorder(keep_raw=False)
    rec.start(Step.FIT); rec.begin_phase(Phase.TRAIN)
    def batch():
        rec.draw(); rec.draw_mark(BEFORE_TFMS); rec.draw_mark(AFTER_TFMS); rec.start_batch(16)
        for s in (AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH): rec.mark(s)
        rec.end_batch()
    parts = {'draw': lambda: rec.draw(), 'start_batch (closes the previous row)': lambda: (rec.draw(), rec.start_batch(16)),
             'mark': lambda: rec.mark(AFTER_PRED), 'mark, as fastai calls it (its `marker`)': rec.marker('mark', AFTER_PRED),
             'end_batch': lambda: rec.end_batch(),
             "draw_mark (the draw's two)": lambda: (rec.draw(), rec.draw_mark(BEFORE_TFMS), rec.draw_mark(AFTER_TFMS)),
             'a whole batch (the methods above)': batch, 'a Python call doing nothing': lambda: None}
    out = {k: min(timeit.repeat(f, number=number, repeat=5))/number*1e6 for k, f in parts.items()}
    base = out.pop('a Python call doing nothing')
    out['draw_mark (the draw\'s two)'] -= out['draw'] - base  # the draw it needs open
    out['start_batch (closes the previous row)'] -= out['draw'] - base
    out['mark, as fastai calls it (its `marker`)'] += base  # called directly, not through a lambda: nothing to take off
    return {k: v - base for k, v in out.items()}

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rounds', type=int, default=20)
    ap.add_argument('--batches', type=int, default=1000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    res = fits(a.rounds, a.batches)
    added = {c: statistics.median(x - y for x, y in zip(res[c], res['none'])) for c in CONFIGS}
    print(f'{a.batches} train + {max(1, a.batches//10)} valid batches per fit, {a.rounds} interleaved rounds, one thread: '
          f'fastai\'s epoch loop, µs per batch (medians of per-round differences from `none`)')
    print(f'{"configuration":<12}{"µs/batch":>10}{"added":>8}{"part":>8}{"× floor":>9}')
    prev = None
    for c in CONFIGS:
        part = f'{added[c] - added[prev]:>8.1f}' if prev is not None and c != 'floor' else ''
        ratio = f'{added[c]/added["floor"]:>9.2f}' if c != 'none' else ''
        print(f'{c:<12}{statistics.median(res[c]):>10.1f}{added[c]:>8.1f}{part:>8}{ratio}')
        if c != 'floor': prev = c
    print('\nOne call of each mark on a recorder (µs, best of 5 × 20,000, a bare Python call subtracted):')
    for k, v in mark_costs().items(): print(f'  {k:<36}{v:>6.2f}')

if __name__ == '__main__': main()
