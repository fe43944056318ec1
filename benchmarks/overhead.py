"""Per-batch overhead of profiling a fastai fit: no profiler, the floor, fastxtend_prof, and fastxtend 0.1.7 if installed.

The floor is what any design built on a `before_draw` event and a pair of callbacks pays in fastai's own dispatch:
the loop that emits `before_draw`, plus two bare callbacks, ordered as ours, that only append `perf_counter()` at the
same events. Each configuration runs in its own process (one torch thread), repeats are interleaved so drift hits all
alike, and the table shows medians: microseconds per batch, the cost each adds over no profiler, and that added cost
as a ratio of the floor's.

    python benchmarks/overhead.py                  # 5 rounds of 4,000 train batches per configuration
    python benchmarks/overhead.py --rounds 3 --batches 2000
"""
import argparse, json, os, statistics, subprocess, sys, time

MODES = ('none', 'floor', 'ours', 'fastxtend')

def worker(mode, batches, epochs):
    import torch
    torch.set_num_threads(1)
    from fastai.test_utils import synth_learner
    from fastai.callback.core import Callback
    from fastai.callback.progress import ProgressCallback
    cbs = []
    if mode == 'floor':
        import fastxtend_prof.events  # noqa: F401  registers before_draw and the loop that emits it
        from time import perf_counter
        class FloorPre(Callback):
            order = -1000
            def __init__(self): self.t = []
            def before_draw(self): self.t.append(perf_counter())
            def before_batch(self): self.t.append(perf_counter())
            def before_backward(self): self.t.append(perf_counter())
            def before_step(self): self.t.append(perf_counter())
            def after_batch(self): self.t.append(perf_counter())
        class FloorPost(Callback):
            order = 49
            def __init__(self): self.t = []
            def after_pred(self): self.t.append(perf_counter())
            def after_loss(self): self.t.append(perf_counter())
            def after_step(self): self.t.append(perf_counter())
            def after_batch(self): self.t.append(perf_counter())
        cbs = [FloorPre(), FloorPost()]
    learn = synth_learner(n_trn=batches//epochs, n_val=max(1, batches//epochs//10), cbs=cbs)
    learn.remove_cb(ProgressCallback)
    def attach():
        if mode == 'ours':
            import fastxtend_prof.all  # noqa: F401
            learn.profile(show_report=False)
        elif mode == 'fastxtend':
            from fastxtend.callback.profiler import ProfileMode
            from fastxtend.callback.utils import LogDispatch  # fastxtend's profiler needs it (its default callbacks add it)
            if not hasattr(learn, 'log_dispatch'): learn.add_cb(LogDispatch())
            learn.profile(mode=ProfileMode.Simple, show_report=False)
    attach()
    with learn.no_logging(): learn.fit(1)          # warm up: first-call costs, allocator, caches
    attach()
    n = (batches//epochs)*epochs + max(1, batches//epochs//10)*epochs
    with learn.no_logging():
        t = time.perf_counter(); learn.fit(epochs); t = time.perf_counter() - t
    return 1e6*t/n

def available(mode):
    if mode != 'fastxtend': return True
    try:
        import importlib.util
        return importlib.util.find_spec('fastxtend') is not None
    except Exception: return False

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--batches', type=int, default=4000, help='train batches per timed fit')
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--worker', choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.batches, a.epochs)))
        return
    modes = [m for m in MODES if available(m)]
    res = {m: [] for m in modes}
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    for r in range(a.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotate who goes first
        for m in order:
            out = subprocess.run([sys.executable, __file__, '--worker', m, '--batches', str(a.batches), '--epochs', str(a.epochs)],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(f'{m} failed:\n{out.stderr[-2000:]}', file=sys.stderr); res.pop(m, None); modes.remove(m); continue
            res[m].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f'round {r+1}/{a.rounds}: ' + ', '.join(f'{m} {v[-1]:.1f}' for m, v in res.items() if v), file=sys.stderr)
    med = {m: statistics.median(v) for m, v in res.items()}
    base = med['none']
    floor = med.get('floor', float('nan')) - base
    print(f'\n{a.batches} train batches x {a.rounds} interleaved rounds, one thread, medians')
    print(f'{"configuration":<22}{"µs/batch":>10}{"added µs":>10}{"× floor":>9}')
    for m in res:
        added = med[m] - base
        ratio = '' if m == 'none' else f'{added/floor:.2f}'
        print(f'{m:<22}{med[m]:>10.1f}{added:>10.1f}{ratio:>9}')

if __name__ == '__main__': main()
