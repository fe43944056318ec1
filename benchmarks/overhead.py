"""Per-batch overhead of profiling a fastai fit: no profiler, the floor, fastxtend_prof, and fastxtend 0.1.7 if installed.

The floor is what any design built on a `before_draw` event and a pair of callbacks pays in fastai's own dispatch:
the loop that emits `before_draw`, plus two bare callbacks, ordered as ours, that only append `perf_counter()` at the
same events. Each configuration lives in its own process (one torch thread; fastxtend patches fastai globally, so it
can't share one). The parent interleaves the repeats: each round asks every process, in rotating order, for one timed
fit of fastai's `synth_learner`, so the machine's slow drifts hit all configurations alike. The table shows medians
over rounds: microseconds per batch, the cost each configuration adds over no profiler in the same round, and that
added cost as a ratio of the floor's.

    python benchmarks/overhead.py                      # 30 rounds of 1,000 batches per configuration
    python benchmarks/overhead.py --rounds 60 --batches 2000
"""
import argparse, json, os, statistics, subprocess, sys, time

MODES = ('none', 'floor', 'ours', 'fastxtend')

def make_learner(mode, batches):
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
            def before_fit(self): self.t = []
            def before_draw(self): self.t.append(perf_counter())
            def before_batch(self): self.t.append(perf_counter())
            def before_backward(self): self.t.append(perf_counter())
            def before_step(self): self.t.append(perf_counter())
            def after_batch(self): self.t.append(perf_counter())
        class FloorPost(Callback):
            order = 49
            def __init__(self): self.t = []
            def before_fit(self): self.t = []
            def after_pred(self): self.t.append(perf_counter())
            def after_loss(self): self.t.append(perf_counter())
            def after_step(self): self.t.append(perf_counter())
            def after_batch(self): self.t.append(perf_counter())
        cbs = [FloorPre(), FloorPost()]
    learn = synth_learner(n_trn=batches, n_val=max(1, batches//10), cbs=cbs)
    learn.remove_cb(ProgressCallback)
    if mode == 'fastxtend':
        from fastxtend.callback.profiler import ProfileMode
        from fastxtend.callback.utils import LogDispatch  # fastxtend's profiler needs it (its default callbacks add it)
        learn.add_cb(LogDispatch())
    return learn

def attach(learn, mode):
    "Attach the profiler for the next fit (both profilers remove themselves after each fit)"
    if mode == 'ours':
        import fastxtend_prof.all  # noqa: F401
        learn.profile(show_report=False, logger_callback=None)
    elif mode == 'fastxtend':
        from fastxtend.callback.profiler import ProfileMode
        learn.profile(mode=ProfileMode.Simple, show_report=False)

def worker(mode, batches):
    "Serve timed fits: one per line read from stdin, answering µs per batch (wall and CPU) as JSON"
    learn = make_learner(mode, batches)
    n = batches + max(1, batches//10)
    for _ in range(2):  # warm up: first-call costs, allocator, caches
        attach(learn, mode)
        with learn.no_logging(): learn.fit(1)
    print('ready', flush=True)
    for line in sys.stdin:
        if line.strip() != 'go': break
        attach(learn, mode)
        with learn.no_logging():
            w, c = time.perf_counter(), time.process_time()
            learn.fit(1)
            w, c = time.perf_counter() - w, time.process_time() - c
        print(json.dumps([1e6*w/n, 1e6*c/n]), flush=True)

def available(mode):
    if mode != 'fastxtend': return True
    import importlib.util
    return importlib.util.find_spec('fastxtend') is not None

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=30)
    p.add_argument('--batches', type=int, default=1000, help='train batches per timed fit (plus a tenth as many valid)')
    p.add_argument('--worker', choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(a.worker, a.batches)
    modes = [m for m in MODES if available(m)]
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', PYTHONHASHSEED='0')
    procs = {m: subprocess.Popen([sys.executable, __file__, '--worker', m, '--batches', str(a.batches)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) for m in modes}
    for m, pr in list(procs.items()):
        if pr.stdout.readline().strip() != 'ready':
            print(f'{m}: worker failed to start', file=sys.stderr); procs.pop(m); modes.remove(m)
    wall, cpu = {m: [] for m in modes}, {m: [] for m in modes}
    for r in range(a.rounds):
        for m in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate who goes first
            procs[m].stdin.write('go\n'); procs[m].stdin.flush()
            w, c = json.loads(procs[m].stdout.readline())
            wall[m].append(w); cpu[m].append(c)
        print(f'round {r+1}/{a.rounds}: ' + ', '.join(f'{m} {wall[m][-1]:.0f}' for m in modes), file=sys.stderr)
    for pr in procs.values(): pr.stdin.close(); pr.wait()
    print(f'\n{a.batches} train + {max(1, a.batches//10)} valid batches per fit, {a.rounds} interleaved rounds, one thread, '
          f'medians over rounds (added: this configuration minus `none` in the same round)')
    print(f'{"configuration":<14}{"wall µs/batch":>14}{"added µs":>10}{"× floor":>9}{"CPU µs/batch":>14}{"added µs":>10}{"× floor":>9}')
    for m in modes:
        row = f'{m:<14}'
        for t in (wall, cpu):
            added = [x - y for x, y in zip(t[m], t['none'])]
            floor = statistics.median(x - y for x, y in zip(t['floor'], t['none'])) if 'floor' in t else float('nan')
            add = statistics.median(added)
            row += f'{statistics.median(t[m]):>14.1f}{add:>10.1f}' + (f'{add/floor:>9.2f}' if m not in ('none',) else f'{"":>9}')
        print(row)

if __name__ == '__main__': main()
