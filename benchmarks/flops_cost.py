"""What FLOP counting costs a fit: `learn.profile(flops=True)` against `flops=False` (the default), in one process.

Each round fits fastai's `synth_learner` (one thread) once in each configuration, in alternating order, and times
fastai's epoch loop (`Learner._do_fit`: every batch; the counted batch included) and the whole `fit` call (the report,
the FLOP columns, the advice and, the first time, the peak's measurement included). The table gives medians over
rounds, and the difference per batch and per fit. `--model mlp` swaps the model for a small MLP (matmuls to count:
the counting's dispatch mode runs on real work).

    python benchmarks/flops_cost.py                 # 30 rounds of 1,000 batches
    python benchmarks/flops_cost.py --model mlp --rounds 20
"""
import argparse, statistics, time, warnings

def make_learner(model, batches):
    import torch
    from torch import nn
    torch.set_num_threads(1)
    from fastai.test_utils import synth_learner
    from fastai.callback.progress import ProgressCallback
    import fastxtend_prof.all  # noqa: F401
    learn = synth_learner(n_trn=batches, n_val=max(1, batches//10))
    learn.remove_cb(ProgressCallback)
    if model == 'mlp': learn.model = nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 1))
    return learn

def timed(learn, flops, loop):
    learn.profile(show_report=False, logger_callback=None, flops=flops)
    with warnings.catch_warnings(), learn.no_logging():
        warnings.simplefilter('ignore')
        t = time.perf_counter(); learn.fit(1); t = time.perf_counter() - t
    return loop[-1], t, (learn.profile_result.flops.seconds if flops else 0.)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=30)
    p.add_argument('--batches', type=int, default=1000)
    p.add_argument('--model', choices=('synth', 'mlp'), default='synth')
    a = p.parse_args()
    learn = make_learner(a.model, a.batches)
    n, loop = a.batches + max(1, a.batches//10), []
    do_fit = learn._do_fit
    def timed_do_fit():
        t = time.perf_counter(); do_fit(); loop.append(time.perf_counter() - t)
    learn._do_fit = timed_do_fit
    for f in (False, True, False, True): timed(learn, f, loop)  # warm up: imports, the peak's measurement, caches
    res = {False: [], True: []}
    for r in range(a.rounds):
        for f in ((False, True) if r % 2 else (True, False)): res[f].append(timed(learn, f, loop))
    med = lambda f, i: statistics.median(x[i] for x in res[f])
    print(f'{a.model} model, {n} batches a fit, {a.rounds} rounds, medians')
    print('| flops | loop µs/batch | fit ms | counting ms |\n|---|---|---|---|')
    for f in (False, True): print(f'| {f} | {1e6*med(f, 0)/n:.1f} | {1e3*med(f, 1):.1f} | {1e3*med(f, 2):.2f} |')
    print(f'added by counting: {1e6*(med(True, 0) - med(False, 0))/n:+.2f} µs a batch in the loop, '
          f'{1e3*(med(True, 1) - med(False, 1)):+.1f} ms a fit in all')

if __name__ == '__main__': main()
