"""Per-batch overhead of profiling a fastai fit: no profiler, the floor, fastxtend_prof, and fastxtend 0.1.7 if installed.

The floor is the cheapest honest design of this kind: the loop that emits `before_draw`, plus two bare callbacks,
ordered as ours, that each append `perf_counter()` at every per-batch event fastai dispatches (`before_draw` and
fastai's eight: `before_batch`, `after_pred`, `after_loss`, `before_backward`, `after_backward`, `before_step`,
`after_step`, `after_batch`) and answer fastai's `training` lookup themselves, so that nothing falls through to the
Learner and the model (a failed lookup there costs ~10 µs).

Each profiler runs in a process of its own (one torch thread; fastxtend patches fastai globally, and `--base` is
another checkout of this package), and each process also times `none` and `floor` on the same Learner. A process has
its own speed (where its memory landed, what its caches hold): the same fit differs by several µs a batch from one
process to the next, which a median over rounds does not remove. So every cost is a difference within one process:
each round, every process runs one fit of fastai's `synth_learner` per configuration, in rotating order, and the table
gives medians over rounds of (configuration - `none`) in the same process and round, and that cost as a ratio of the
same process's floor. Each fit is timed twice: fastai's epoch loop alone (`Learner._do_fit`: every batch, but not
`before_fit`/`after_fit` nor what runs after the fit, such as the reports), which is the per-batch cost, and the whole
`fit` call; `outside the loop` is the fixed cost per fit.

    python benchmarks/overhead.py                      # 30 rounds of 1,000 batches per configuration
    python benchmarks/overhead.py --rounds 40 --batches 2000
    git worktree add /tmp/base HEAD~1 && python benchmarks/overhead.py --base /tmp/base   # before/after a change, same rounds
"""
import argparse, json, os, statistics, subprocess, sys, time

PROFILERS = ('ours', 'fastxtend')

def make_learner(prof, batches):
    "fastai's `synth_learner` with `batches` train batches, no progress bar, and what the profiler `prof` needs"
    import torch
    torch.set_num_threads(1)
    import fastxtend_prof.core.events  # noqa: F401  registers before_draw and the loop that emits it, for the floor
    from fastai.test_utils import synth_learner
    from fastai.callback.progress import ProgressCallback
    learn = synth_learner(n_trn=batches, n_val=max(1, batches//10))
    learn.remove_cb(ProgressCallback)
    if prof == 'fastxtend':
        from fastxtend.callback.utils import LogDispatch  # fastxtend's profiler needs it (its default callbacks add it)
        learn.add_cb(LogDispatch())
    return learn

def floor_callbacks():
    "The floor's two callbacks: each appends perf_counter() at every per-batch event fastai dispatches, and answers `training` itself"
    from time import perf_counter
    from fastai.callback.core import Callback
    def stamp(self): self.t.append(perf_counter())
    class Floor(Callback):
        def __init__(self): self.t = []
        @property
        def training(self): return self.learn.training  # else fastai's per-event lookup falls through Learner to the model
        before_draw = before_batch = after_pred = after_loss = before_backward = after_backward = before_step = after_step = after_batch = stamp
    class FloorPre(Floor): order = -1000
    class FloorPost(Floor): order = 49
    return [FloorPre(), FloorPost()]

def attach(learn, mode):
    "Attach the profiler for the next fit (both profilers remove themselves after each fit)"
    if mode in ('ours', 'base'):  # `base`: this package as another checkout has it
        import fastxtend_prof.all  # noqa: F401
        learn.profile(show_report=False, logger_callback=None)
    elif mode == 'fastxtend':
        from fastxtend.callback.profiler import ProfileMode
        learn.profile(mode=ProfileMode.Simple, show_report=False)

def timed_fit(learn, mode, loop):
    "One fit of `learn` in `mode` (`none`, `floor` or a profiler): µs per batch of fastai's epoch loop and of the whole `fit`"
    floor = floor_callbacks() if mode == 'floor' else []
    if floor: learn.add_cbs(floor)
    elif mode != 'none': attach(learn, mode)
    try:
        with learn.no_logging():
            w = time.perf_counter()
            learn.fit(1)
            w = time.perf_counter() - w
    finally: learn.remove_cbs(floor)
    n = learn.n_batches
    return 1e6*loop[-1]/n, 1e6*w/n

def worker(prof, batches):
    "Serve timed fits of `none`, `floor` and the profiler `prof`, one per line naming the configuration on stdin, answering as JSON"
    learn = make_learner(prof, batches)
    learn.n_batches, loop = batches + max(1, batches//10), []
    do_fit = learn._do_fit
    def timed_do_fit():  # fastai's epoch loop, without before_fit/after_fit and what runs after the fit (reports)
        t = time.perf_counter(); do_fit(); loop.append(time.perf_counter() - t)
    learn._do_fit = timed_do_fit
    for _ in range(2):  # warm up: first-call costs, allocator, caches
        for mode in ('none', 'floor', prof): timed_fit(learn, mode, loop)
    print('ready', flush=True)
    for line in sys.stdin:
        mode = line.strip()
        if mode not in ('none', 'floor', prof): break
        print(json.dumps(timed_fit(learn, mode, loop)), flush=True)

def available(mode):
    if mode != 'fastxtend': return True
    import importlib.util
    return importlib.util.find_spec('fastxtend') is not None

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=30)
    p.add_argument('--batches', type=int, default=1000, help='train batches per timed fit (plus a tenth as many valid)')
    p.add_argument('--base', metavar='CHECKOUT', help="another checkout of this repository (e.g. `git worktree add /tmp/base HEAD~1`): "
                   "its profiler runs as `base` in a process of its own, in the same rounds")
    p.add_argument('--worker', choices=PROFILERS + ('base',), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(a.worker, a.batches)
    profs = [m for m in PROFILERS if available(m)] + (['base'] if a.base else [])
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore', PYTHONHASHSEED='0')
    envs = {m: dict(env, PYTHONPATH=os.path.abspath(a.base)) if m == 'base' else env for m in profs}
    procs = {m: subprocess.Popen([sys.executable, __file__, '--worker', m, '--batches', str(a.batches)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=envs[m]) for m in profs}
    for m, pr in list(procs.items()):
        if pr.stdout.readline().strip() != 'ready':
            print(f'{m}: worker failed to start', file=sys.stderr); procs.pop(m); profs.remove(m)
    runs = [(m, c) for m in profs for c in ('none', 'floor', m)]  # (process, configuration)
    loop, fit = {r: [] for r in runs}, {r: [] for r in runs}
    for r in range(a.rounds):
        for m, c in runs[r % len(runs):] + runs[:r % len(runs)]:  # rotate who goes first
            procs[m].stdin.write(c + '\n'); procs[m].stdin.flush()
            lp, ft = json.loads(procs[m].stdout.readline())
            loop[m, c].append(lp); fit[m, c].append(ft)
        print(f'round {r+1}/{a.rounds}: ' + ', '.join(f'{m}/{c} {loop[m, c][-1]:.0f}' for m, c in runs), file=sys.stderr)
    for pr in procs.values(): pr.stdin.close(); pr.wait()
    n = a.batches + max(1, a.batches//10)
    added = lambda t, m, c: statistics.median(x - y for x, y in zip(t[m, c], t[m, 'none']))
    print(f'\n{a.batches} train + {n - a.batches} valid batches per fit, {a.rounds} interleaved rounds, one thread, medians over rounds. '
          f'loop: fastai\'s epoch loop (the per-batch cost); fit: the whole `fit` call, reports included; added: minus `none` in the '
          f'same process and round; × floor: over the same process\'s floor')
    print(f'{"process":<11}{"configuration":<14}{"loop µs/batch":>14}{"added µs":>10}{"× floor":>9}{"fit µs/batch":>14}{"added µs":>10}{"outside the loop":>18}')
    for m, c in runs:
        row = f'{m:<11}{c:<14}{statistics.median(loop[m, c]):>14.1f}{added(loop, m, c):>10.1f}'
        row += f'{added(loop, m, c)/added(loop, m, "floor"):>9.2f}' if c != 'none' else f'{"":>9}'
        outside = (added(fit, m, c) - added(loop, m, c))*n/1e3  # ms per fit: before_fit, after_fit, the report and advice
        row += f'{statistics.median(fit[m, c]):>14.1f}{added(fit, m, c):>10.1f}' + (f'{outside:>15.1f} ms' if c != 'none' else '')
        print(row)

if __name__ == '__main__': main()
