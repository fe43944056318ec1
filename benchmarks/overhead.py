"""Per-batch overhead of profiling a fastai fit: no profiler, the floor, fastxtend_prof, and fastxtend 0.1.7 if installed.

The floor is the cheapest honest design of this kind: the loop that emits `before_draw`, plus two bare callbacks,
ordered as ours, that each append `perf_counter()` at every per-batch event fastai dispatches (`before_draw` and
fastai's eight: `before_batch`, `after_pred`, `after_loss`, `before_backward`, `after_backward`, `before_step`,
`after_step`, `after_batch`) and answer fastai's `training` lookup themselves, so that nothing falls through to the
Learner and the model (a failed lookup there costs ~10 µs). Each configuration lives in its own process (one torch
thread; fastxtend patches fastai globally, so it can't share one). The parent interleaves the repeats: each round asks
every process, in rotating order, for one timed fit of fastai's `synth_learner`, so the machine's slow drifts hit all
configurations alike. Each fit is timed twice: fastai's epoch loop alone (`Learner._do_fit`: every batch, but not
`before_fit`/`after_fit` nor what runs after the fit, such as the reports), which is the per-batch cost, and the whole
`fit` call. The table shows medians over rounds: microseconds per batch, the cost each configuration adds over no
profiler in the same round, that cost as a ratio of the floor's, and the fixed cost per fit outside the loop.

    python benchmarks/overhead.py                      # 30 rounds of 1,000 batches per configuration
    python benchmarks/overhead.py --rounds 60 --batches 2000
    git worktree add /tmp/base HEAD~1 && python benchmarks/overhead.py --base /tmp/base   # before/after a change, same rounds
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
        def stamp(self): self.t.append(perf_counter())
        class Floor(Callback):
            "Appends perf_counter() at every per-batch event fastai dispatches, and answers `training` itself"
            def __init__(self): self.t = []
            def before_fit(self): self.t = []
            @property
            def training(self): return self.learn.training  # else fastai's per-event lookup falls through Learner to the model
            before_draw = before_batch = after_pred = after_loss = before_backward = after_backward = before_step = after_step = after_batch = stamp
        class FloorPre(Floor): order = -1000
        class FloorPost(Floor): order = 49
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
    "Serve timed fits, one per 'go' line on stdin, answering as JSON: the epoch loop's and the whole fit's µs per batch"
    if mode == 'base': mode = 'ours'  # the profiler of another checkout, found first on PYTHONPATH
    learn = make_learner(mode, batches)
    n, loop = batches + max(1, batches//10), []
    do_fit = learn._do_fit
    def timed_do_fit():  # fastai's epoch loop, without before_fit/after_fit and what runs after the fit (reports)
        t = time.perf_counter(); do_fit(); loop.append(time.perf_counter() - t)
    learn._do_fit = timed_do_fit
    for _ in range(2):  # warm up: first-call costs, allocator, caches
        attach(learn, mode)
        with learn.no_logging(): learn.fit(1)
    print('ready', flush=True)
    for line in sys.stdin:
        if line.strip() != 'go': break
        attach(learn, mode)
        with learn.no_logging():
            w = time.perf_counter()
            learn.fit(1)
            w = time.perf_counter() - w
        print(json.dumps([1e6*loop[-1]/n, 1e6*w/n]), flush=True)

def available(mode):
    if mode != 'fastxtend': return True
    import importlib.util
    return importlib.util.find_spec('fastxtend') is not None

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=30)
    p.add_argument('--batches', type=int, default=1000, help='train batches per timed fit (plus a tenth as many valid)')
    p.add_argument('--base', metavar='CHECKOUT', help="another checkout of this repository (e.g. `git worktree add /tmp/base HEAD~1`): "
                   "its profiler runs as configuration `base`, interleaved with `ours` in the same rounds")
    p.add_argument('--worker', choices=MODES + ('base',), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(a.worker, a.batches)
    modes = [m for m in MODES if available(m)] + (['base'] if a.base else [])
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', PYTHONHASHSEED='0')
    envs = {m: dict(env, PYTHONPATH=os.path.abspath(a.base)) if m == 'base' else env for m in modes}
    procs = {m: subprocess.Popen([sys.executable, __file__, '--worker', m, '--batches', str(a.batches)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=envs[m]) for m in modes}
    for m, pr in list(procs.items()):
        if pr.stdout.readline().strip() != 'ready':
            print(f'{m}: worker failed to start', file=sys.stderr); procs.pop(m); modes.remove(m)
    loop, fit = {m: [] for m in modes}, {m: [] for m in modes}
    for r in range(a.rounds):
        for m in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotate who goes first
            procs[m].stdin.write('go\n'); procs[m].stdin.flush()
            lp, ft = json.loads(procs[m].stdout.readline())
            loop[m].append(lp); fit[m].append(ft)
        print(f'round {r+1}/{a.rounds}: ' + ', '.join(f'{m} {loop[m][-1]:.0f}' for m in modes), file=sys.stderr)
    for pr in procs.values(): pr.stdin.close(); pr.wait()
    n = a.batches + max(1, a.batches//10)
    added = lambda t, m: statistics.median(x - y for x, y in zip(t[m], t['none']))
    print(f'\n{a.batches} train + {n - a.batches} valid batches per fit, {a.rounds} interleaved rounds, one thread, medians over rounds. '
          f'loop: fastai\'s epoch loop (the per-batch cost); fit: the whole `fit` call, reports included; added: minus `none` in the same round')
    print(f'{"configuration":<14}{"loop µs/batch":>14}{"added µs":>10}{"× floor":>9}{"fit µs/batch":>14}{"added µs":>10}{"outside the loop":>18}')
    for m in modes:
        row = f'{m:<14}{statistics.median(loop[m]):>14.1f}{added(loop, m):>10.1f}'
        row += f'{added(loop, m)/added(loop, "floor"):>9.2f}' if m != 'none' and 'floor' in modes else f'{"":>9}'
        outside = (added(fit, m) - added(loop, m))*n/1e3  # ms per fit: before_fit, after_fit, the report and advice
        row += f'{statistics.median(fit[m]):>14.1f}{added(fit, m):>10.1f}' + (f'{outside:>15.1f} ms' if m != 'none' else '')
        print(row)

if __name__ == '__main__': main()
