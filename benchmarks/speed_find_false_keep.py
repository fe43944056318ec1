"""How often `speed_find` keeps a fix that changes nothing (its false keeps), and how often one that helps, measured.

`speed_find` runs as it is, its pairs of blocks in turns and its budget included, on a small Learner; only
its trials (each block of a pair is one) are drawn instead of run: each trial's steady train iterations from a model of a trial's batches, the same model for the
best so far and for the fix, times `1 - effect` where the fix is set. So the share of searches that keep the fix is the
false-keep rate at `--effects 0`, and the power at a real gain. Three models of a trial's batches, each on the log
scale around 50 ms a batch:

- `iid`: independent batches, sd `--within` (0.13: the JPEG pipeline's cached loader, batch to batch);
- `ar`: the same with the lag-1 autocorrelation `--ar` (0.44, that loader's, in 11 trials);
- `trial`: `ar` with each trial's own level too, sd `--between` (0.10: the spread of that loader's 11 trial means, its
  trials in searches a few seconds apart), which a trial's own batches cannot show.

The tuner's claim holds for all three: a fix that changes nothing is kept with probability at most the level the
search gives it (`alpha`/2 for the first fix), the third included, since a pair's two blocks share a level only as far
as it lasts and the pairs' spread is the error. Prints, per model and effect, the share kept with its 95% interval
(Clopper-Pearson). Real trials under a load that comes and goes: `speed_find_turns.py`.

    python benchmarks/speed_find_false_keep.py                 # 2,000 searches a cell, about 4 minutes
    python benchmarks/speed_find_false_keep.py --searches 500  # quicker, wider intervals
    python benchmarks/speed_find_false_keep.py --models trial --min-change 25 --effects 0 0.3 0.5
"""
import argparse, math, sys, time, warnings
from dataclasses import replace
from pathlib import Path
import numpy as np
from scipy.stats import binomtest
sys.path.insert(0, str(Path(__file__).parents[1]/'tests'))
warnings.simplefilter('ignore')

def draw(rng, model:str, n:int, a) -> np.ndarray:
    "`n` batches' seconds of one trial from `model`"
    phi = 0. if model == 'iid' else a.ar  # AR(1) on the log scale, its stationary sd `a.within`
    e = rng.normal(0, a.within*math.sqrt(1 - phi**2), n)
    x = np.empty(n)
    x[0] = e[0] if model == 'iid' else rng.normal(0, a.within)
    for i in range(1, n): x[i] = phi*x[i - 1] + e[i]
    level = rng.normal(0, a.between) if model == 'trial' else 0.
    return a.mean*np.exp(level + x)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--searches', type=int, default=2000, help='searches a model and effect (default: 2000)')
    p.add_argument('--models', nargs='+', default=['iid', 'ar', 'trial'], choices=('iid', 'ar', 'trial'))
    p.add_argument('--effects', nargs='+', type=float, default=[0., 0.3], help="the fix's gains (default: 0 and 0.3)")
    p.add_argument('--within', type=float, default=0.13)
    p.add_argument('--ar', type=float, default=0.44)
    p.add_argument('--between', type=float, default=0.10)
    p.add_argument('--mean', type=float, default=0.05, help='seconds a batch (default: 0.05)')
    p.add_argument('--batches', type=int, default=40, help="speed_find's `batches` (default: 40)")
    p.add_argument('--min-change', type=float, default=None, help="speed_find's `min_change` (default: its own, 5)")
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args()

    import test_tune as t
    import fastxtend_prof.all  # noqa: F401  (Learner.speed_find)
    import fastxtend_prof.tune.search as T
    from fastxtend_prof.core.recorder import Step
    from fastxtend_prof.core.defaults import ALPHA, MIN_GAIN
    min_change = MIN_GAIN if a.min_change is None else a.min_change

    learn = t.busy_learner(item=0., compute=1e-3, n_batches=60)
    with learn.no_mbar(): template = T.run_trial(learn, a.batches, 3, math.inf)  # a real trial: its results and metadata
    on, rng, state = [False], np.random.default_rng(a.seed), {}
    def trial(learn, batches, warmup, deadline, sync='auto'):
        d = draw(rng, state['model'], batches, a)*(1 - state['effect'] if on[0] else 1.)
        return replace(template, distributions={T._KEY: d})
    def apply(learn, value):
        on[0] = True
        return lambda: on.__setitem__(0, False)
    def predict(times, ctx, allow):
        return [T.Fix('nothing', True, Step.FORWARD, times[Step.ITERATION]*0.7, 'a fix whose trials are drawn')], []
    T.register_strategy('nothing', T.Strategy(predict, apply, 'speed only', lambda v: 'the drawn fix', 'nothing'))
    plan = T.plan
    def only_drawn(times, ctx, allow, done):
        "The tuner's plan with the drawn fix alone (the small Learner's own profile could suggest others)"
        fixes, notes = plan(times, ctx, allow, done)
        return [f for f in fixes if f.kind == 'nothing'], notes
    T.run_trial, T.plan = trial, only_drawn

    print(f'{a.searches:,} searches a cell; trials of {a.batches} batches around {a.mean*1e3:.0f} ms, within sd {a.within}, '
          f'lag-1 {a.ar}, between trials {a.between} (the `trial` model); alpha {ALPHA}, min_change {min_change:g}%')
    print(f"{'model':<7}{'effect':>8}{'kept':>9}{'95% interval':>18}{'median pairs':>14}")
    t0 = time.monotonic()
    for model in a.models:
        for effect in a.effects:
            state.update(model=model, effect=effect)
            kept, pairs = 0, []
            for _ in range(a.searches):
                with learn.no_mbar(): r = learn.speed_find(max_time=1e6, batches=a.batches, min_change=min_change, show=False).trials
                mine = r[r.Kind == 'nothing']
                kept += bool(mine.Accepted.any()); pairs += list(mine.Pairs)
            ci = binomtest(kept, a.searches).proportion_ci(0.95)
            print(f'{model:<7}{effect:>8.0%}{kept/a.searches:>9.2%}{f"{ci.low:.2%}-{ci.high:.2%}":>18}'
                  f'{np.median(pairs) if pairs else math.nan:>14.0f}', flush=True)
    print(f'{time.monotonic() - t0:.0f} s')

if __name__ == '__main__': main()
