"""Cost of profiling a fastai fit on a CUDA GPU, per timing mode and feature: a profiled fit's time over an unprofiled one's.

Two workloads: `mlp`, a small MLP fed from host memory by fastai's usual loader, where a fast GPU waits on the host
and per-boundary host costs show; and `cnn`, a 3-conv CNN on batches already on the GPU, where the device sets the
pace. A configuration is a timing mode, `host` (`sync='none'`), `events` or `device`, with memory tracking off, plus
what is added after a `+`: `mem` (memory read on one batch in 10: `events+mem` is the default on a GPU), `mem1` (memory
on every batch), `idle` (why the GPU idled), `hw` (the GPU's activity and energy); `fastxtend` is fastxtend 0.1.7's
Simple Profiler, if installed. `base:CONFIG` runs CONFIG with another checkout of this package (`--base DIR`): before
and after in one run.

Each configuration lives in a process of its own (fastxtend patches fastai globally; a base checkout is another
package), and each process also times unprofiled fits of the same Learner: the same fit runs a little faster or
slower from one process to the next, which no number of rounds removes, so every ratio is taken within one process,
over its own unprofiled fit of the same round. The parent interleaves the rounds: each round asks every process, in
rotating order, for one unprofiled and one profiled fit (which goes first alternates). The table shows medians over
rounds: ms per batch of fastai's epoch loop, each configuration's time over its process's unprofiled time for that
loop (the per-batch cost) and for the whole `fit` call (which adds each profiler's fixed cost per fit: its report), and
the spread of the loop's ratio over the rounds.

    python benchmarks/gpu_overhead.py                          # both workloads, 15 rounds, the default configurations
    python benchmarks/gpu_overhead.py --rounds 5 --base /tmp/base --configs base:events base:events+mem events events+mem
    python benchmarks/gpu_overhead.py --smoke                  # CPU, tiny sizes: checks the harness, measures nothing
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

CONFIGS = ('none', 'host', 'events', 'device', 'events+mem', 'events+mem1', 'events+mem+idle', 'events+mem+hw', 'fastxtend')
MODES = {'host': 'none', 'events': 'events', 'device': 'device'}
ADDS = {'mem': dict(memory=True), 'mem1': dict(memory=dict(every=1)), 'idle': dict(idle=True), 'hw': dict(hardware=True)}
WORKLOADS = ('mlp', 'cnn')
# batch size, train and valid batches per fit, image side
SIZES = {'mlp': dict(bs=64, n=300, nv=30), 'cnn': dict(bs=256, n=120, nv=12, hw=64)}
SMOKE = {'mlp': dict(bs=64, n=20, nv=4), 'cnn': dict(bs=8, n=4, nv=2, hw=16)}

def options(config:str) -> dict|None:
    "`learn.profile`'s options for `config` (`base:` left out), or None for no profiler / fastxtend"
    config = config.removeprefix('base:')
    if config in ('none', 'fastxtend'): return None
    mode, *adds = config.split('+')
    if mode not in MODES or any(a not in ADDS for a in adds): raise ValueError(f'unknown configuration {config!r}')
    opts = dict(sync=MODES[mode], memory=False)
    for a in adds: opts.update(ADDS[a])
    return opts

def make_learner(workload, config, dev, s):
    import torch
    from torch import nn
    from fastai.learner import Learner
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.callback.progress import ProgressCallback
    if options(config) is not None: import fastxtend_prof.all  # noqa: F401
    bs = s['bs']
    if workload == 'mlp':
        ds = lambda n: torch.utils.data.TensorDataset(torch.randn(n*bs, 256), torch.randint(0, 10, (n*bs,)))
        dls = DataLoaders.from_dsets(ds(s['n']), ds(s['nv']), bs=bs, num_workers=0, device=dev)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    else:
        # Whole batches made on the device, handed over as they are (bs=None): no collation and no host-to-device copy,
        # so the loader costs next to nothing and the GPU is the bottleneck
        hw = s['hw']
        dl = lambda n: DataLoader([(torch.randn(bs, 3, hw, hw, device=dev), torch.randint(0, 10, (bs,), device=dev))
                                   for _ in range(n)], bs=None, device=dev)
        dls = DataLoaders(dl(s['n']), dl(s['nv']), device=dev)
        conv = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        model = nn.Sequential(conv(3, 32), conv(32, 64), conv(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    # The model goes to the device now: the profiler picks its clock from the model's device in before_fit, before fastai moves it
    learn = Learner(dls, model.to(dev), loss_func=nn.CrossEntropyLoss())
    learn.remove_cb(ProgressCallback)
    if config == 'fastxtend':
        from fastxtend.callback.utils import LogDispatch  # fastxtend's profiler needs it (its default callbacks add it)
        learn.add_cb(LogDispatch())
    return learn

def attach(learn, config):
    "Attach the profiler for the next fit (both profilers remove themselves after each fit)"
    opts = options(config)
    if opts is not None: learn.profile(**opts, show_report=False, logger_callback=None)
    elif config == 'fastxtend':
        from fastxtend.callback.profiler import ProfileMode
        learn.profile(mode=ProfileMode.Simple, show_report=False)

def worker(workload, config, smoke):
    "Serve pairs of timed fits, one per 'go N' line on stdin (N odd: the profiled fit first), answering as JSON: µs per batch of the epoch loop and of the whole fit, unprofiled then profiled"
    import torch
    s = (SMOKE if smoke else SIZES)[workload]
    dev = torch.device('cpu' if smoke else 'cuda')
    if smoke: torch.set_num_threads(1)  # 2-core CI: the workers warm up side by side
    else: torch.backends.cudnn.benchmark = True  # fixed shapes: autotune once, in the warm-up fits, as a tuned run would
    sync = torch.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
    learn, loop = make_learner(workload, config, dev, s), []
    do_fit = learn._do_fit
    def timed_do_fit():  # fastai's epoch loop alone: every batch, not before_fit/after_fit nor the reports after the fit
        sync(); t = time.perf_counter(); do_fit(); sync(); loop.append(time.perf_counter() - t)
    learn._do_fit = timed_do_fit
    n = s['n'] + s['nv']
    def fit(profiled):
        if profiled: attach(learn, config)
        with learn.no_logging():
            sync(); t = time.perf_counter()  # the fit's queued GPU work counts, none from before it
            learn.fit(1)
            sync(); t = time.perf_counter() - t
        return [1e6*loop[-1]/n, 1e6*t/n]
    for profiled in (False, True, True): fit(profiled)  # warm up: first-call costs, cuDNN autotune, allocator, the event pool
    print('ready', flush=True)
    for line in sys.stdin:
        word, _, r = line.partition(' ')
        if word != 'go': break
        first = int(r or 0) % 2 == 1
        a = fit(first); b = fit(not first)
        print(json.dumps([b, a] if first else [a, b]), flush=True)

def drop(procs, key, why):
    "Stop the worker of `key` (workload, configuration) and show the end of its stderr"
    pr, log = procs.pop(key); pr.kill(); pr.wait(); log.seek(0)
    print(f'{"/".join(key)}: worker {why}; the end of its stderr:\n' + ''.join(log.readlines()[-15:]), file=sys.stderr)

def rounds(workload, procs, a):
    "Interleaved rounds of `workload`'s live workers: {configuration: [((loop, fit) unprofiled, (loop, fit) profiled) µs per batch, one per round]}"
    times = {c: [] for w, c in procs if w == workload}
    for r in range(a.rounds):
        order = list(times)
        for c in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
            if (workload, c) not in procs: continue
            pr = procs[workload, c][0]
            try: pr.stdin.write(f'go {r}\n'); pr.stdin.flush(); times[c].append(json.loads(pr.stdout.readline()))
            except (OSError, ValueError): drop(procs, (workload, c), f'died in round {r+1}'); times[c] = []
        print(f'{workload} round {r+1}/{a.rounds}: ' + ', '.join(f'{c} {t[-1][1][0]/t[-1][0][0]:.3f}' for c, t in times.items() if t)
              + ' (loop over its own unprofiled loop)', file=sys.stderr)
    return {c: t for c, t in times.items() if t}

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--workload', choices=(*WORKLOADS, 'both'), default='both')
    p.add_argument('--configs', nargs='+', help=f'default: every one of {", ".join(CONFIGS)} available (`none` is always shown); '
                   '`base:CONFIG` runs CONFIG with the checkout --base')
    p.add_argument('--base', help='another checkout of this repository (its folder holding fastxtend_prof/), for the base: configurations')
    p.add_argument('--rounds', type=int, help='default: 15, or 2 with --smoke')
    p.add_argument('--smoke', action='store_true', help='tiny sizes on the CPU, to check the harness where no GPU is')
    p.add_argument('--worker', nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker: return worker(*a.worker, a.smoke)
    import importlib.metadata, importlib.util
    if not a.smoke:  # the smoke run's parent leaves torch unimported: its seconds of CPU go to the workers on small CI machines
        import torch
        if not torch.cuda.is_available():
            print('no CUDA device: gpu_overhead.py measures profiling cost on a GPU; run it on a machine with one '
                  '(benchmarks/overhead.py measures the CPU)')
            return
    a.rounds = a.rounds or (2 if a.smoke else 15)
    configs = a.configs or [c for c in CONFIGS if c != 'fastxtend' or importlib.util.find_spec('fastxtend')]
    for c in configs:
        if c != 'none': options(c)  # a ValueError now for a name it does not know
        if c.startswith('base:') and not a.base: p.error(f'{c} needs --base DIR')
    if a.base and not os.path.isdir(os.path.join(a.base, 'fastxtend_prof')): p.error(f'--base {a.base}: no fastxtend_prof/ there')
    configs = ['none'] + [c for c in dict.fromkeys(configs) if c != 'none']
    env = dict(os.environ, PYTHONWARNINGS='ignore', **({'OMP_NUM_THREADS': '1'} if a.smoke else {}))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    envs = {c: dict(env, PYTHONPATH=os.pathsep.join([os.path.abspath(a.base if c.startswith('base:') else here), env.get('PYTHONPATH', '')]))
            for c in configs}
    workloads = WORKLOADS if a.workload == 'both' else (a.workload,)
    keys, procs = [(w, c) for w in workloads for c in configs[1:]], {}  # `none` is timed in every worker
    # All warm before any timed fit, and the CNN's one at a time: cuDNN's autotune, timed while another worker warms up,
    # could pick other kernels for some configurations (the MLP's, without convolutions, warm side by side)
    t0 = time.time()
    for group in [keys] if a.smoke else [[k for k in keys if k[0] == 'mlp']] + [[k] for k in keys if k[0] == 'cnn']:
        for k in group:
            log = tempfile.TemporaryFile('w+')  # the worker's stderr, shown if it fails
            procs[k] = (subprocess.Popen([sys.executable, __file__, '--worker', *k] + ['--smoke']*a.smoke, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=envs[k[1]]), log)
        for k in group:
            if procs[k][0].stdout.readline().strip() != 'ready': drop(procs, k, 'failed to start')
    results = {w: rounds(w, procs, a) for w in workloads}
    for pr, _ in procs.values(): pr.stdin.close(); pr.wait()
    sizes = SMOKE if a.smoke else SIZES
    where = ('CPU SMOKE RUN: tiny sizes on the CPU, where events and device fall back to the host clock; it checks the harness '
             'end to end, and its numbers say nothing about GPUs') if a.smoke else torch.cuda.get_device_name()
    v = importlib.metadata.version
    print(f'\n{where}\ntorch {v("torch")}, fastai {v("fastai")}, {a.rounds} interleaved rounds in {time.time() - t0:.0f} s, medians over rounds. '
          "loop: fastai's epoch loop, the per-batch cost; fit: the whole `fit` call, reports included; × none: over the same process's "
          'unprofiled fit in the same round; spread: the lowest and highest round' + (f'; base: {a.base}' if a.base else ''))
    for w in workloads:
        s = sizes[w]
        print(f'{w}: {s["n"]} train + {s["nv"]} valid batches of {s["bs"]}' + (f' {s["hw"]}×{s["hw"]} images' if 'hw' in s else '')
              + ' per fit' + ('' if a.smoke else ', data ' + ('on the GPU' if w == 'cnn' else 'in host memory')))
    print(f'{"":<18}' + ''.join(f'{c:>17}' for c in configs))
    med = statistics.median
    for w, t in results.items():
        def row(label, f, fmt='{:>17.3f}'):
            cells = [fmt.format(f(c)) if c in t else f'{"failed":>17}' for c in configs[1:]]
            return f'{label:<18}' + fmt.format(f(None)) + ''.join(cells)
        nones = [x[0] for ts in t.values() for x in ts]
        print(row(f'{w} ms/batch', lambda c: med(x[0] for x in nones)/1e3 if c is None else med(x[1][0] for x in t[c])/1e3))
        for i, what in ((0, 'loop'), (1, 'fit')):
            print(row(f'{w} {what} × none', lambda c: 1.0 if c is None else med(x[1][i]/x[0][i] for x in t[c])))
        spread = lambda c: '-' if c is None else '{:.3f}-{:.3f}'.format(min(r := [x[1][0]/x[0][0] for x in t[c]]), max(r))
        print(f'{w + " loop spread":<18}{"-":>17}' + ''.join(f'{spread(c) if c in t else "failed":>17}' for c in configs[1:]))
    if any(len(t) < len(configs) - 1 for t in results.values()): sys.exit(1)

if __name__ == '__main__': main()
