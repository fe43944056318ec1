"""`speed_find`'s choice of loader workers against an exhaustive sweep of `num_workers`, on two loaders:

- **storage-bound**: items that sleep `--item` seconds each (a read from slow storage), so workers mostly wait and more
  of them than the machine has cores can help;
- **computing**: items that spin for `--item` seconds of their thread's CPU time each (decoding, augmenting), so the
  cores bound the workers.

Batches of `--bs`, a model whose forward spins `--compute` seconds of CPU time. Each repeat runs, for each loader, the sweep (a
trial of every worker count from 0 to `--max-workers`, the tuner's own `run_trial` of 40 steady batches) and then
`learn.speed_find()` from 0 workers. A configuration's throughput is the samples/s of its trial's steady batches; the
best of the sweep is the best count's median over the repeats. It prints, per loader, each count's samples/s, what
speed_find chose, the share of the sweep's best throughput that choice reaches (the count's own sweep median), and the
time speed_find took against the sweep's (medians over the repeats). The issue's bar: at least 90% of the best
throughput in at most a third of the sweep's time.

    python benchmarks/speed_find_sweep.py                  # 1.5 ms items, bs 8, 1 ms compute, 0..8 workers, 5 repeats
    python benchmarks/speed_find_sweep.py --loaders storage-bound   # that loader alone (about 3 minutes)
"""
import argparse, math, sys, time, warnings
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, str(Path(__file__).parents[1]/'tests'))
warnings.simplefilter('ignore')

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--item', type=float, default=1.5e-3, help='seconds per item (default: 1.5e-3)')
    p.add_argument('--bs', type=int, default=8)
    p.add_argument('--compute', type=float, default=1e-3, help="seconds of the model's forward (default: 1e-3)")
    p.add_argument('--max-workers', type=int, default=None, help='largest count of the sweep (default: 6, or 4 a core if more)')
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--loaders', nargs='+', choices=('storage-bound', 'computing'), default=['storage-bound', 'computing'],
                   help='which loaders (default: both)')
    a = p.parse_args()
    import fastxtend_prof.all  # noqa: F401
    from fastxtend_prof.tune import run_trial, set_num_workers, cores, LearnerState, set_aside, OVERSUBSCRIBE, _measured
    import test_tune as t
    t.BS = a.bs
    def cpu_spin(s:float):
        "Spin for `s` seconds of this thread's CPU time: a worker the OS takes off its core makes no progress meanwhile"
        end = time.thread_time() + s
        while time.thread_time() < end: pass
    t.busy = cpu_spin  # the items' and the model's work (the tests spin on the wall clock, which a descheduled worker also passes)
    torch.set_num_threads(1)
    top = a.max_workers if a.max_workers is not None else max(6, OVERSUBSCRIBE*cores())
    print(f'items {a.item*1e3:g} ms, bs {a.bs}, compute {a.compute*1e3:g} ms, {cores()} cores, sweep 0..{top} workers, {a.repeats} repeats')
    for name, sleep in (('storage-bound', True), ('computing', False)):
        if name not in a.loaders: continue
        learn = t.busy_learner(item=a.item, compute=a.compute, sleep=sleep)
        rates, sweep_s, find_s, chosen = {k: [] for k in range(top + 1)}, [], [], []
        for _ in range(a.repeats):
            state, t0 = LearnerState(learn), time.monotonic()
            with learn.removed_cbs(set_aside(learn)):
                for k in rates:
                    undo = set_num_workers(learn, k)
                    rates[k].append(_measured(run_trial(learn, 40, 3, math.inf))['Samples/s'])
                    undo()
            state.restore()
            sweep_s.append(time.monotonic() - t0)
            res = learn.speed_find(max_time=120, show=False)
            find_s.append(res.seconds)
            ks = [f.value for f in res.fixes if f.kind == 'num_workers']
            chosen.append(ks[-1] if ks else 0)
        med = {k: float(np.median(v)) for k, v in rates.items()}
        best = max(med, key=med.get)
        print(f'\n{name}: samples/s by num_workers (medians of {a.repeats})')
        print('  ' + '  '.join(f'{k}: {med[k]:,.0f}' for k in med))
        got = [med.get(k, math.nan)/med[best] for k in chosen]
        print(f'  sweep best: {best} workers, {med[best]:,.0f} samples/s; the sweep took {np.median(sweep_s):.1f} s (median)')
        print(f"  speed_find chose {', '.join(map(str, chosen))} workers: {', '.join(f'{g:.0%}' for g in got)} of the best; "
              f'it took {np.median(find_s):.1f} s (median), {np.median(find_s)/np.median(sweep_s):.0%} of the sweep')
        ok = min(got) >= 0.9 and np.median(find_s) <= np.median(sweep_s)/3
        print(f"  {'meets' if ok else 'misses'} the bar: at least 90% of the best in at most a third of the sweep's time")

if __name__ == '__main__': main()
