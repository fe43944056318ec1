"""How often `compare_profiles` calls identical code "slower" or "faster", and how often it finds a real 10% slowdown,
with one run a side and with several, on real fits of a compute-bound MLP (every step CPU work) as a user's runs are.

Two parts, so that the fits (the slow part, run under the load you want) and the analysis are apart:

    # the fits: A alone (A/A), then A and B in turns (B does a fixed amount of extra compute before each optimizer
    # step, sized at the start to about 10% of A's iteration); one JSON profile per fit
    ../shared/tools/under-varying-load python benchmarks/compare_runs.py collect runs_varying --fits 600
    ../shared/tools/under-load -n 2 python benchmarks/compare_runs.py collect runs_steady --fits 600
    # the machine's noise as `learn.noise_find()` measures it on A's Learner, under the same load: noise*.json in the folder
    ../shared/tools/under-varying-load python benchmarks/compare_runs.py noise runs_varying
    # the verdicts on them: 1 v 1 consecutive A/A pairs, 3 v 3 (up to 50 v 50) groups of consecutive A fits, in turns
    # (ABABAB: read in pairs) and one side after the other (AAABBB); the same groups of A and B for the power, read in
    # pairs and, their times dropped, as independent runs
    python benchmarks/compare_runs.py analyze runs_varying
    # the power of pairs at more pairs than the fits give non-overlapping groups of: random sets of k of the real pairs
    # (A_i, B_i), in their order, each set read as compare reads it, beside the pairs compare's plan says it needs
    python benchmarks/compare_runs.py power runs_varying --draws 200
    # how right a noise record's plan of pairs is by its trials: windows of consecutive A/A fits read as records
    python benchmarks/compare_runs.py records runs_varying --trials 8 12 16 24

Each rate is printed with its 95% interval (Clopper and Pearson). A fit is one process's fit after a first, unprofiled
one, as CI's nightly job would be run after run; the machine's level moves between fits wherever the load does.
"""
import argparse, json, pathlib, time
import numpy as np

WIDTH, BS, BATCHES = 512, 128, 60  # the MLP: about 8 ms an iteration on a quiet 2-core VM, one torch thread

def learner(extra:int=0):
    import torch
    from torch import nn
    from fastai.basics import Learner, DataLoaders, CrossEntropyLossFlat, Callback
    class ExtraWork(Callback):
        "`n` matrix products before each optimizer step: real compute, the same every batch (its own tensors, no random draws)"
        def __init__(self, n):
            self.n, g = n, torch.Generator().manual_seed(1)
            self.a, self.b = torch.randn(128, 256, generator=g), torch.randn(256, 256, generator=g)
        def before_step(self):
            for _ in range(self.n): self.a @ self.b
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(BATCHES*BS, 64, generator=g), torch.randint(0, 10, (BATCHES*BS,), generator=g)
    dls = DataLoaders.from_dsets(list(zip(x, y)), list(zip(x[:4*BS], y[:4*BS])), bs=BS, num_workers=0)
    model = nn.Sequential(nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))
    return Learner(dls, model, loss_func=CrossEntropyLossFlat(), cbs=[ExtraWork(extra)] if extra else [])

def fit(extra:int):
    "One profiled fit of one epoch: its `SavedProfile`"
    import fastxtend_prof.all  # noqa: F401  (learn.profile)
    from fastxtend_prof.core.saved import profile_of
    learn = learner(extra)
    with learn.no_logging(), learn.no_mbar(): learn.fit(1)  # one-off costs (allocator, kernels) out of the profile
    learn.profile(show_report=False)
    with learn.no_logging(), learn.no_mbar(): learn.fit(1)
    return profile_of(learn)

def iteration(p) -> float: return float(np.mean(p.distributions[('train', 'iteration')]))

def noise(a):
    "`learn.noise_find()` on A's Learner, its record saved in the folder (`noise.json`, or `--name`)"
    import torch
    import fastxtend_prof.all  # noqa: F401  (learn.noise_find)
    torch.set_num_threads(1)
    out = pathlib.Path(a.folder); out.mkdir(parents=True, exist_ok=True)
    learn = learner()
    with learn.no_logging(), learn.no_mbar(): learn.fit(1)  # one-off costs, as before each fit
    learn.noise_find(save=out/a.name, **({} if a.trials is None else dict(trials=a.trials)))

def collect(a):
    import torch
    from fastxtend_prof.core.saved import save_profile
    torch.set_num_threads(1)
    out = pathlib.Path(a.folder); out.mkdir(parents=True, exist_ok=True)
    base = iteration(fit(0))
    t0 = time.perf_counter(); n = 2000
    A, B = torch.randn(128, 256), torch.randn(256, 256)
    for _ in range(n): A @ B
    mm = (time.perf_counter() - t0)/n
    extra = max(1, round(0.10*base/mm))
    print(f'iteration {base*1e3:.2f} ms, one product {mm*1e6:.0f} µs: {extra} products a step (about 10%)', flush=True)
    aa = a.fits//2 if a.aa is None else a.aa
    (out/'plan.json').write_text(json.dumps(dict(extra=extra, iteration=base, product=mm, fits=a.fits, aa=aa)))
    t0 = time.time()
    for i in range(a.fits):  # the first `aa` (half) A alone, then A and B in turns
        kind = 'A' if i < aa or (i - aa) % 2 == 0 else 'B'
        p = fit(extra if kind == 'B' else 0)
        save_profile(p, out/f'{i:04d}_{kind}.json')
        if i % 20 == 0: print(f'{i}/{a.fits} fits, {time.time() - t0:.0f} s; {kind} {iteration(p)*1e3:.2f} ms', flush=True)

def rate(k:int, n:int) -> str:
    from scipy.stats import beta
    lo = beta.ppf(0.025, k, n - k + 1) if k else 0.
    hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.
    return f'{k}/{n} = {100*k/n:.1f}% ({100*lo:.1f}-{100*hi:.1f}%)'

def analyze(a):
    from fastxtend_prof.core.saved import load_profile, SavedProfile
    from fastxtend_prof.verdicts.compare import compare_profiles
    from fastxtend_prof.verdicts.noise import load_noise
    from fastxtend_prof.verdicts.stats import power
    folder = pathlib.Path(a.folder)
    records = {f.stem: load_noise(f) for f in sorted(folder.glob('noise*.json'))}
    files = sorted(folder.glob('[0-9]*_?.json'))
    runs = [(f.stem[-1], load_profile(f)) for f in files]
    plan = json.loads((folder/'plan.json').read_text())
    half = plan.get('aa', plan['fits']//2)
    aa, ab = [r for k, r in runs[:half]], runs[half:]
    As, Bs = [r for k, r in ab if k == 'A'], [r for k, r in ab if k == 'B']
    lvl = np.log([iteration(r) for r in aa])
    print(f'{len(aa)} A/A fits, {len(As)} A and {len(Bs)} B in turns; A/A iteration: between-fit sd {np.std(lvl, ddof=1):.3f} '
          f'(log), consecutive fits differ by a median {100*np.median(np.abs(np.expm1(np.diff(lvl)))):.1f}%')
    effect = float(np.median([iteration(b)/iteration(x) - 1 for x, b in zip(As, Bs)]))
    print(f'B against A, the median of neighbouring pairs: {100*effect:+.1f}%')
    for name, r in records.items():
        print(f'{name}: {r.trials} trials, between {r.between:.3f}, within {r.within:.3f}, spread {r.spread:.3f} (log): '
              f'{r.spread/np.std(lvl, ddof=1):.2f}x the fits\' between-fit sd; predicted power for B\'s {100*effect:+.1f}% at '
              'alpha 0.01: ' + ', '.join(f'{k} a side {100*power(100*effect, r.spread, k, 0.01):.0f}%' for k in (3, 5, 10)) +
              f'; {r.runs_for(100*effect) or "more than 50"} runs a side for 80%')
    d = np.abs(np.diff(lvl))
    print(f"the fits' between-fit sd read robustly (the median consecutive difference over 0.954, a normal's): {np.median(d)/0.954:.3f}")
    def undated(runs): return [SavedProfile(r.results, {**r.metadata, 'timestamp': None}, r.distributions, r.source) for r in runs]
    def called(b, n, **kw):
        it = compare_profiles(b, n, **kw).set_index(['Phase', 'Step']).loc[('train', 'iteration')]
        return bool(it['Significant']), float(it[ 'Change %'])
    settings = {'defaults': {}, 'test alone (min_change 0)': dict(min_change=0, min_share=0)}
    rows = []
    for name, kw in settings.items():
        one = [called(aa[i], aa[i + 1], within_run=True, **kw)[0] for i in range(0, len(aa) - 1, 2)]  # alone: not judged
        rows.append((name, '1 v 1 A/A, consecutive, judged within the runs (within_run)', rate(sum(one), len(one))))
        for noise_name, r in records.items():
            one = [called(aa[i], aa[i + 1], noise=r, **kw)[0] for i in range(0, len(aa) - 1, 2)]
            rows.append((name, f'1 v 1 A/A, consecutive, with {noise_name}', rate(sum(one), len(one))))
        for k in (3, 5, 10, 20, 30, 50):
            groups = [aa[i:i + 2*k] for i in range(0, len(aa) - 2*k + 1, 2*k)]
            turns = [called(g[0::2], g[1::2], **kw)[0] for g in groups]   # in turns: read in pairs (`in_turns`)
            apart = [called(g[:k], g[k:], **kw)[0] for g in groups]
            power = [called(As[i:i + k], Bs[i:i + k], **kw) for i in range(0, min(len(As), len(Bs)) - k + 1, k)]
            # the same runs without their times: read as independent runs, as before pairs were read
            unpaired = [called(undated(As[i:i + k]), undated(Bs[i:i + k]), **kw) for i in range(0, min(len(As), len(Bs)) - k + 1, k)]
            first = next(iter(records.items()), None)
            floor = ([] if first is None else
                     [(name, f'{k} v {k} A/A, one side then the other, with {first[0]}',
                       rate(sum(called(g[:k], g[k:], noise=first[1], **kw)[0] for g in groups), len(groups)))])
            rows += [(name, f'{k} v {k} A/A, in turns', rate(sum(turns), len(turns))),
                     (name, f'{k} v {k} A/A, one side then the other', rate(sum(apart), len(apart))), *floor,
                     (name, f'{k} v {k} A then B (+10%), in turns: found slower',
                      rate(sum(s and c > 0 for s, c in power), len(power))),
                     (name, f'{k} v {k} A then B (+10%), in turns, read as independent runs: found slower',
                      rate(sum(s and c > 0 for s, c in unpaired), len(unpaired)))]
    print('\n| setting | comparison | called |\n|---|---|---:|')
    for r in rows: print('| ' + ' | '.join(r) + ' |')

def power_of_pairs(a):
    """How often `compare_profiles` finds B slower with k pairs of runs in turns, k past what non-overlapping groups of
    the fits allow: `draws` random sets of k of the real neighbouring pairs (a bootstrap of pairs, each set in time order,
    so read in pairs), beside the pairs compare's plan asks for B's change from all the pairs (`stats.pairs_needed_from`:
    drawn from the pairs themselves) and what Noether's asymptotic size said (`stats.pairs_needed` on `rank_spread`)"""
    from fastxtend_prof.core.saved import load_profile, SavedProfile
    from fastxtend_prof.verdicts.compare import compare_profiles
    from fastxtend_prof.verdicts.stats import pairs_needed, pairs_needed_from, rank_spread
    from fastxtend_prof.core.defaults import ALPHA
    folder = pathlib.Path(a.folder)
    plan = json.loads((folder/'plan.json').read_text())
    files = sorted(folder.glob('[0-9]*_?.json'))[plan.get('aa', plan['fits']//2):]
    key = ('train', 'iteration')
    def lean(p): return SavedProfile(p.results, p.metadata, {key: p.distributions[key]}, p.source)  # the row the gate reads
    runs = [(f.stem[-1], lean(load_profile(f))) for f in files]
    As, Bs = [r for k, r in runs if k == 'A'], [r for k, r in runs if k == 'B']
    n = min(len(As), len(Bs))
    d = np.log([iteration(b)/iteration(x) for x, b in zip(As[:n], Bs[:n])])
    spread, change = rank_spread(d), 100*float(np.expm1(np.median(d)))
    need, asymptotic = pairs_needed_from(d, change, ALPHA/2), pairs_needed(spread, change, ALPHA/2)
    print(f"{n} real pairs; B's change, the pairs' median: {change:+.1f}%; compare's plan (drawn from the pairs) asks "
          f"{need} pairs to find it 80% of the time at alpha {ALPHA} (two-sided); Noether's size on their rank_spread "
          f"({spread:.3f}) said {asymptotic}")
    rng = np.random.default_rng(a.seed)
    print('\n| pairs | found slower (of random sets of real pairs) |\n|---:|---|')
    for k in sorted({*a.pairs, *(k for k in (need, asymptotic) if k and k <= n)}):
        if k > n: continue
        found = 0
        for _ in range(a.draws):
            idx = np.sort(rng.choice(n, k, replace=False))
            it = compare_profiles([As[i] for i in idx], [Bs[i] for i in idx]).set_index(['Phase', 'Step']).loc[key]
            found += bool(it['Significant'] and it['Change %'] > 0)
        said = ' (the plan)' if k == need else " (Noether's size)" if k == asymptotic else ''
        print(f'| {k}{said} | {rate(found, a.draws)} |', flush=True)

def records(a):
    """How right a noise record's plan of pairs is, by its trials: each window of `w` consecutive A/A fits read as a record
    of `w` trials (`Noise`, the fits' means as its levels), its `pairs_for` B's change, against the pairs the real pairs
    (A_i, B_i) need (`stats.pairs_needed_from` on all of them: what `power` then finds 80% of the time). Within a factor
    of 2.25 in pairs is within 1.5 in the smallest change (the change a test finds goes as one over the root of the pairs)"""
    from fastxtend_prof.core.saved import load_profile
    from fastxtend_prof.verdicts.noise import Noise
    from fastxtend_prof.verdicts.stats import pairs_needed_from
    from fastxtend_prof.core.defaults import ALPHA
    folder = pathlib.Path(a.folder)
    plan = json.loads((folder/'plan.json').read_text())
    files = sorted(folder.glob('[0-9]*_?.json'))
    half = plan.get('aa', plan['fits']//2)
    lv = [(f.stem[-1], iteration(load_profile(f))) for f in files]
    aa, ab = [v for _, v in lv[:half]], lv[half:]
    As, Bs = [v for k, v in ab if k == 'A'], [v for k, v in ab if k == 'B']
    d = np.log(np.asarray(Bs[:len(As)])/np.asarray(As[:len(Bs)]))
    change = 100*float(np.expm1(np.median(d)))
    need = pairs_needed_from(d, change, ALPHA/2)
    print(f"{len(aa)} A/A fits; {len(d)} real pairs, B's change {change:+.1f}%: they need {need} pairs for 80% at alpha {ALPHA}")
    print('\n| trials a record | records | its plan of pairs: median (10th-90th percentile) | within a factor of 2.25 |\n|---:|---:|---|---|')
    for w in a.trials:
        got = np.array([Noise(tuple(aa[s:s + w]), (0.,)*w, 1).pairs_for(change) or 1001
                        for s in range(0, len(aa) - w + 1, max(1, w//2))])   # windows overlapping by half
        ok = int(np.sum((got >= need/2.25) & (got <= need*2.25)))
        q = np.quantile(got, [0.1, 0.9])
        print(f'| {w} | {len(got)} | {np.median(got):.0f} ({q[0]:.0f}-{q[1]:.0f}) | {rate(ok, len(got))} |', flush=True)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    c = sub.add_parser('collect'); c.add_argument('folder'); c.add_argument('--fits', type=int, default=600)
    c.add_argument('--aa', type=int, default=None, help='the A/A fits first (default half the fits); then A and B in turns')
    c.set_defaults(func=collect)
    z = sub.add_parser('analyze'); z.add_argument('folder'); z.set_defaults(func=analyze)
    w = sub.add_parser('power'); w.add_argument('folder'); w.add_argument('--draws', type=int, default=200)
    w.add_argument('--pairs', type=int, nargs='+', default=[10, 20, 30, 40, 50, 60, 80, 100]); w.add_argument('--seed', type=int, default=0)
    w.set_defaults(func=power_of_pairs)
    r = sub.add_parser('records'); r.add_argument('folder'); r.add_argument('--trials', type=int, nargs='+', default=[8, 12, 16, 24])
    r.set_defaults(func=records)
    n = sub.add_parser('noise'); n.add_argument('folder'); n.add_argument('--trials', type=int, default=None, help='default: noise_find\'s')
    n.add_argument('--name', default='noise.json'); n.set_defaults(func=noise)
    a = ap.parse_args()
    a.func(a)

if __name__ == '__main__': main()
