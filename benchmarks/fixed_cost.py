"""The profiler's fixed cost per fit as a user sees it: the wall time of `learn.profile(...); learn.fit(1)` minus `learn.fit(1)`.

A fixed cost is what a fit pays once whatever its length: setting up in `learn.profile()` and `before_fit`, and building
the result, the report and the advice after it, plus the per-batch cost of its 24 batches. The first fit in a fresh
process pays it most (the first call of each piece of code: lazy imports, pandas' and the report's first use, FLOP
counting's fake tensors); later fits in the same process pay what is left, the cost a user sees each time they profile
again in a notebook. A later fit is timed beside an unprofiled fit just before it, in the same process: processes
differ by more than the cost itself. So each configuration runs in
processes of its own, one per round (`import fastxtend_prof.all` and fastai already imported, the Learner built, before
anything is timed): the first fit, then `--fits` more. Every process fits fastai's `synth_learner` (22 train batches, 2
valid, one torch thread, no progress bar, `learn.no_logging()`), with stdout redirected to a buffer around every timed
call, in every configuration, so that the report's cost is building it, not a terminal drawing it.

A process has its own speed, so every `added` is a difference within one round (the rounds start the configurations'
processes in rotating order): (configuration - `none`) of that round's first fits, and of the medians of its later fits;
the table gives medians over rounds. A configuration the package does not have (an option `learn.profile` rejects with
TypeError or ValueError) is shown as unavailable.

    python benchmarks/fixed_cost.py                          # 5 rounds, 5 later fits each
    python benchmarks/fixed_cost.py --rounds 3 --json fixed_cost.json
    python benchmarks/fixed_cost.py --n-trn 2                # fits of 2 train batches: what is left is the fixed part
    git worktree add /tmp/base HEAD~1 && python benchmarks/fixed_cost.py --base /tmp/base   # before/after, in the same rounds

With `--base`, every profiled configuration also runs with that checkout of the package (`base:defaults`, ...), in the
same rounds, so that the two versions meet the machine in the same state.
"""
import argparse, contextlib, io, json, os, statistics, subprocess, sys, tempfile, time

N_TRN, N_VAL = int(os.environ.get('FIXED_COST_N_TRN', 22)), 2  # train and valid batches of 16 in `synth_learner` (`--n-trn`)
CONFIGS = {  # name: the options of `learn.profile`, None for no profiler
    'none': None,
    'defaults': dict(show_report=False),
    'report': dict(),  # the report, printed (into a buffer)
    'flops': dict(show_report=False, flops=True),
}

def make_learner():
    "fastai's `synth_learner` with `N_TRN` train batches, one thread, no progress bar; everything the timed calls need imported"
    import torch
    torch.set_num_threads(1)
    import fastxtend_prof.all  # noqa: F401  (Learner.profile): imported before timing, in every configuration
    from fastai.test_utils import synth_learner
    from fastai.callback.progress import ProgressCallback
    learn = synth_learner(n_trn=N_TRN, n_val=N_VAL)
    learn.remove_cb(ProgressCallback)
    assert len(learn.dls.train) == N_TRN, len(learn.dls.train)
    return learn

class Unavailable(Exception): "`learn.profile` rejects the options: this version of the package does not have them"

def timed_fit(learn, opts):
    "Seconds of `learn.profile(**opts); learn.fit(1)` (just the fit when `opts` is None), printing into a buffer"
    with contextlib.redirect_stdout(io.StringIO()):
        t = time.perf_counter()
        if opts is not None:
            try: learn.profile(**opts)
            except (TypeError, ValueError) as e: raise Unavailable(f'{type(e).__name__}: {e}') from e
        learn.fit(1)
        return time.perf_counter() - t

def worker(config, fits):
    "One process of `config`: its first fit and `fits` later ones, as one JSON line; or why the configuration is unavailable"
    learn = make_learner()
    with learn.no_logging():
        try: first = timed_fit(learn, CONFIGS[config])
        except Unavailable as e: return print(json.dumps(dict(unavailable=str(e))))
        later, plain = [], []
        for _ in range(fits):  # each later fit beside an unprofiled one in the same process: their difference is the profile's cost
            plain.append(timed_fit(learn, None)); later.append(timed_fit(learn, CONFIGS[config]))
    print(json.dumps(dict(first=first, later=later, plain=plain)))

def run_worker(name, fits, cwd, base=None):
    "Run the configuration `name` (`base:<config>` with the checkout `base` first on the path) in a fresh process"
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', PYTHONHASHSEED='0')
    pkg, _, config = name.rpartition(':')
    if pkg: env['PYTHONPATH'] = os.path.abspath(base)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), '--worker', config, '--fits', str(fits)], capture_output=True,
                       text=True, cwd=cwd, env=env, timeout=600)
    if p.returncode: sys.exit(f'{name}: the worker failed\n{p.stderr[-3000:]}')
    return json.loads(p.stdout.strip().splitlines()[-1])

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=5, help='fresh processes per configuration')
    p.add_argument('--fits', type=int, default=5, help='later fits per process, after the first')
    p.add_argument('--json', metavar='PATH', help='write the numbers (seconds) here')
    p.add_argument('--n-trn', type=int, default=22, help='train batches a fit (2 leaves mostly the fixed cost: set-up and the fit\'s end)')
    p.add_argument('--base', metavar='CHECKOUT', help='another checkout of this repository: each profiled configuration also runs with it, in the same rounds')
    p.add_argument('--worker', choices=list(CONFIGS), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(a.worker, a.fits)
    os.environ['FIXED_COST_N_TRN'] = str(a.n_trn); global N_TRN; N_TRN = a.n_trn
    names = list(CONFIGS) + ([f'base:{c}' for c in CONFIGS if CONFIGS[c] is not None] if a.base else [])
    runs, unavailable = {c: [] for c in names}, {}
    with tempfile.TemporaryDirectory() as cwd:  # `learn.path` is '.': nothing of a run lands in the checkout
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
            for c in order:
                if c in unavailable: continue
                res = run_worker(c, a.fits, cwd, a.base)
                if 'unavailable' in res: unavailable[c] = res['unavailable']; continue
                runs[c].append(dict(round=r, **res))
            print(f'round {r+1}/{a.rounds}: ' + ', '.join(f'{c} {1e3*runs[c][-1]["first"]:.0f}' for c in order if c not in unavailable)
                  + ' ms first fit', file=sys.stderr)
    first = {c: [x['first'] for x in runs[c]] for c in names}
    later = {c: [statistics.median(x['later']) for x in runs[c]] for c in names}  # per process
    later_added = {c: [statistics.median(p - q for p, q in zip(x['later'], x['plain'])) for x in runs[c]] for c in names}  # paired in each process
    added = lambda t, c: statistics.median(x - y for x, y in zip(t[c], t['none']))  # paired by round
    ms = lambda s: f'{1e3*s:.1f}'
    print(f'\nfastai synth_learner, {N_TRN} train + {N_VAL} valid batches, one thread, stdout to a buffer. first fit: '
          f'`learn.profile(...); learn.fit(1)` in a fresh process, median over {a.rounds} rounds, added: minus `none`\'s first fit in the same round; '
          f'later fits: median over rounds of each process\'s median of {a.fits} more, added: minus the unprofiled fit run just before each, in the same process')
    print(f'{"configuration":<15}{"options":<36}{"first fit ms":>13}{"added":>9}{"later fits ms":>15}{"added":>9}')
    out = dict(rounds=a.rounds, fits=a.fits, n_trn=N_TRN, n_val=N_VAL, base=a.base, configs={})
    for c in names:
        o = CONFIGS[c.rpartition(':')[2]]
        opts = 'no profiler' if o is None else ', '.join(f'{k}={v}' for k, v in o.items()) or '(report shown)'
        if c in unavailable:
            print(f'{c:<15}{opts:<36}  unavailable: {unavailable[c]}')
            out['configs'][c] = dict(options=o, unavailable=unavailable[c]); continue
        a1, a2 = ('', '') if c == 'none' else (ms(added(first, c)), ms(statistics.median(later_added[c])))
        print(f'{c:<15}{opts:<36}{ms(statistics.median(first[c])):>13}{a1:>9}{ms(statistics.median(later[c])):>15}{a2:>9}')
        out['configs'][c] = dict(options=o, runs=runs[c], first_s=statistics.median(first[c]), later_s=statistics.median(later[c]),
                                 **({} if c == 'none' else dict(first_added_s=added(first, c), later_added_s=statistics.median(later_added[c]))))
    if a.json:
        with open(a.json, 'w') as f: json.dump(out, f, indent=1)
        print(f'wrote {a.json}')

if __name__ == '__main__': main()
