"""The oversubscribed fit of issue 57, measured end to end: a small CNN (two 3×3 convolutions of 32 channels on 32×32
images, batches of 32) trained with torch's default threads beside 2 loader workers on this machine's cores, while
`--busy` more processes spin on them (as a shared CI machine's other jobs). It prints what the profile says (the
training thread's wait for a core, `cores`, and the advice: the `core_wait` rule and whether anything blames the garbage
collector), then what `learn.speed_find()` tried and kept for torch's threads, with each trial's mean and median iteration; then
the same fit on a quiet machine (no spinning process) with one torch thread, where no `core_wait` advice is expected.

    python benchmarks/oversubscribed.py             # 2 busy processes; about 30 s on the 2-core VM
    python benchmarks/oversubscribed.py --busy 0    # the machine as it is
"""
import argparse, contextlib, multiprocessing as mp, os, sys, time, warnings
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).parents[1]/'tests'))
warnings.simplefilter('ignore')

def spin():
    while True: pass

@contextlib.contextmanager
def busy(n:int):
    "`n` processes spinning on the cores while the block runs"
    ps = [mp.get_context('fork').Process(target=spin, daemon=True) for _ in range(n)]
    for p in ps: p.start()
    try: yield
    finally:
        for p in ps: p.terminate()
        for p in ps: p.join()

def profile(learn):
    from fastxtend_prof.core.recorder import Cols
    learn.profile(show_report=False)
    with learn.no_logging(): learn.fit(1)
    r = learn.profile_result
    rules = [a.rule for a in r.advice]
    gc = [a.rule for a in r.advice if 'garbage collector' in a.suggestion and 'not the garbage collector' not in a.suggestion]
    cw = r.cores
    it = r.results[(r.results.Phase == 'train') & (r.results.Step == 'iteration')]
    return dict(iteration_ms=round(float(it[Cols.MEDIAN].iloc[0])*1e3, 1), core_wait=round(cw.share, 3) if cw else None,
                threads=cw.threads if cw else None, workers=cw.workers if cw else None, rules=rules, blames_gc=gc)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--busy', type=int, default=2, help='processes spinning on the cores beside the fit (default: 2)')
    ap.add_argument('--batches', type=int, default=64, help='train batches an epoch (default: 64)')
    a = ap.parse_args()
    import fastxtend_prof.all  # noqa: F401
    from test_cores import small_cnn_learner
    default = torch.get_num_threads()
    print(f'{os.cpu_count()} cores, torch threads {default} (its default), 2 loader workers, {a.busy} busy processes')
    with busy(a.busy):
        t0 = time.monotonic()
        print('profiled fit:', profile(small_cnn_learner(n=a.batches)))
        learn = small_cnn_learner(n=a.batches)
        res = learn.speed_find(max_time=120, show=False)
        t = res.trials[['Trial', 'Change', 'Kind', 'Mean', 'Median', 'Predicted', 'Change %', 'p-value', 'Accepted']].copy()
        for c in ('Mean', 'Median', 'Predicted'): t[c] = (t[c]*1e3).round(1)
        print(t.to_string(index=False))
        print('kept:', [f.name for f in res.fixes], f'({time.monotonic() - t0:.0f} s); threads after: {torch.get_num_threads()}')
    torch.set_num_threads(1)
    try: print('quiet, one thread:', profile(small_cnn_learner(n=a.batches)))
    finally: torch.set_num_threads(default)

if __name__ == '__main__': main()
