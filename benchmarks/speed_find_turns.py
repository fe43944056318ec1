"""How often `speed_find` keeps a fix that changes nothing, and how often one that saves 15% or 30%, on real trials of a
compute-bound fit (every step CPU work, one torch thread) under the load you run it in.

`speed_find` runs as a user calls it (its defaults: `max_time` 120 s, `alpha` 0.01, `min_change` 5%), with one fix
registered (`register_strategy`) and the plan cut to it:

- `--effect 0`: the fix sets a flag nothing reads (the Learner is the MLP of `compare_runs.py`);
- `--effect 0.3`: the Learner does extra matrix products before each optimizer step, sized at the start to 30% of the
  iteration with them, and the fix removes them (real compute, so the saving holds at any load).

The fix predicts a saving of `--predict` (a share of the iteration): what sizes its pairs of blocks, not what it saves.
One line of JSON a search goes to `--out`; `analyze` prints the share kept with its 95% interval (Clopper and Pearson).

    ../shared/tools/under-varying-load -n 4 python benchmarks/speed_find_turns.py search --effect 0 --searches 200 --out nothing.jsonl
    ../shared/tools/under-load -n 2 python benchmarks/speed_find_turns.py search --effect 0 --searches 200 --out steady.jsonl
    K=$(python benchmarks/speed_find_turns.py calibrate --effect 0.3)   # on a quiet machine: under a load the sizing is off
    ../shared/tools/under-varying-load -n 4 python benchmarks/speed_find_turns.py search --effect 0.3 --predict 0.3 --products $K --out saves30.jsonl
    python benchmarks/speed_find_turns.py analyze nothing.jsonl steady.jsonl saves30.jsonl
"""
import argparse, json, math, sys, time, warnings
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).parent))
warnings.simplefilter('ignore')

def search(a):
    import torch
    import compare_runs as C
    import fastxtend_prof.all  # noqa: F401  (Learner.speed_find)
    import fastxtend_prof.tune.search as T
    from fastxtend_prof.core.recorder import Step
    torch.set_num_threads(1)
    # the products' cost read in the fit itself, in turns with the plain fit (the load moves both alike): one product
    # as a share of the plain iteration, the median of 9 pairs of trials
    learn = C.learner(1)
    extra = next(cb for cb in learn.cbs if type(cb).__name__ == 'ExtraWork')
    with learn.no_logging(), learn.no_mbar(): learn.fit(1)  # one-off costs
    mean = lambda: float(np.mean(T.run_trial(learn, 40, 3, math.inf).distributions[T._KEY]))
    shares = []
    with learn.no_mbar():
        for _ in range(9):
            extra.n = 0; plain = mean()
            extra.n = 40; shares.append((mean() - plain)/40/plain)
    share = float(np.median(shares))
    # with k products the iteration is (1 + k*share) plain ones; the fix removes them: a saving of effect
    k = round(a.effect/(1 - a.effect)/share) if a.effect else 0
    if a.products is not None: k = a.products  # sized beforehand (`calibrate`, on a quiet machine)
    if a.cmd == 'calibrate':
        print(k)
        return
    extra.n = k
    if not k: learn.remove_cb(extra); extra = None
    print(f'one product {100*share:.2f}% of the plain iteration (9 pairs: {", ".join(f"{100*x:.2f}" for x in shares)}): '
          f'{k} products a step', flush=True)
    state = {'on': False}
    def apply(learn, v):
        old = extra.n if extra is not None else None
        if extra is not None: extra.n = 0
        state['on'] = True
        def undo():
            state['on'] = False
            if extra is not None: extra.n = old
        return undo
    def predict(times, ctx, allow):
        return [T.Fix('bench', True, Step.OPT_STEP, times[Step.ITERATION]*(1 - a.predict), 'the benchmark\'s fix')], []
    T.register_strategy('bench', T.Strategy(predict, apply, 'speed only', lambda v: 'the bench fix', 'nothing'), overwrite=True)
    plan = T.plan
    T.plan = lambda times, ctx, allow, done: ([f for f in plan(times, ctx, allow, done)[0] if f.kind == 'bench'], [])
    out = Path(a.out)
    for i in range(a.searches):
        t1 = time.time()
        with learn.no_mbar(): res = learn.speed_find(show=False)
        row = res.trials[res.trials.Kind == 'bench']
        r = row.iloc[0] if len(row) else None
        line = dict(products=k, share=share, effect=a.effect, predict=a.predict, kept=bool(res.fixes), time=t1, seconds=res.seconds,
                    change=None if r is None else float(r['Change %']), p=None if r is None else float(r['p-value']),
                    level=None if r is None else float(r['Level']), pairs=None if r is None else int(r['Pairs']),
                    start=float(res.trials.Mean.iloc[0]), note=None if r is None else str(r['Note']))
        with out.open('a') as fh: fh.write(json.dumps(line) + '\n')
        if i % 10 == 0: print(f"{i}/{a.searches}: {line['kept']} {line['change']} p {line['p']} {line['pairs']} pairs "
                              f"{line['seconds']:.1f} s", flush=True)

def rate(k:int, n:int) -> str:
    from scipy.stats import beta
    lo = beta.ppf(0.025, k, n - k + 1) if k else 0.
    hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.
    return f'{k}/{n} = {100*k/n:.1f}% ({100*lo:.1f}-{100*hi:.1f}%)'

def analyze(a):
    print('| file | fix saves | predicted | searches | kept | median pairs | median seconds |\n|---|---:|---:|---:|---:|---:|---:|')
    for f in a.files:
        rows = [json.loads(l) for l in Path(f).read_text().splitlines() if l.strip()]
        if not rows: continue
        kept = sum(r['kept'] for r in rows)
        pairs = [r['pairs'] for r in rows if r['pairs'] is not None]
        print(f"| {Path(f).name} | {100*rows[0]['effect']:.0f}% | {100*rows[0]['predict']:.0f}% | {len(rows)} | "
              f"{rate(kept, len(rows))} | {np.median(pairs):.0f} | {np.median([r['seconds'] for r in rows]):.1f} |")

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    s = sub.add_parser('search', help='run searches, a JSON line each')
    s.add_argument('--effect', type=float, default=0., help='the share of the iteration the fix saves (default 0)')
    s.add_argument('--predict', type=float, default=0.6, help='the saving the fix predicts (default 0.6)')
    s.add_argument('--searches', type=int, default=200)
    s.add_argument('--out', required=True)
    s.add_argument('--products', type=int, default=None, help="the fix's products a step, as `calibrate` sized them (default: sized here)")
    c = sub.add_parser('calibrate', help="print the products a step that make `--effect` of the iteration (run it on a quiet machine)")
    c.add_argument('--effect', type=float, required=True)
    s = sub.add_parser('analyze', help='the share kept, per file')
    s.add_argument('files', nargs='+')
    a = p.parse_args()
    if a.cmd == 'calibrate': a.products = None
    analyze(a) if a.cmd == 'analyze' else search(a)

if __name__ == '__main__': main()
