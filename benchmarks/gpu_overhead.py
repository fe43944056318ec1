"""Cost of profiling a fastai fit on a CUDA GPU, per timing mode: a profiled fit's wall time over an unprofiled one's.

Two workloads: `mlp`, a small MLP fed from host memory by fastai's usual loader, where a fast GPU waits on the host
and per-boundary host costs show; and `cnn`, a 3-conv CNN on batches already on the GPU, where the device sets the
pace. Configurations: `none` (no profiler), fastxtend_prof with `sync='none'` (`host`), `'events'` and `'device'` (memory
tracking off), `'events'` with memory tracking on one batch in 10 (`events+mem`, the default on a GPU) and on every
batch (`events+mem1`), and fastxtend 0.1.7 if installed. Each (workload, configuration) lives in its own process (fastxtend patches fastai
globally, so it can't share one). The parent interleaves the repeats: each round asks every configuration of a
workload, in rotating order, for one timed fit, so slow drifts hit all alike. The table shows medians over rounds:
ms per batch of fastai's epoch loop, and each configuration's time over `none`'s in the same round, for that loop
(the per-batch cost) and for the whole `fit` call (which adds each profiler's fixed cost per fit: its report).

    python benchmarks/gpu_overhead.py                          # both workloads, 15 rounds, every configuration
    python benchmarks/gpu_overhead.py --workload mlp --rounds 30 --configs none host events
    python benchmarks/gpu_overhead.py --smoke                  # CPU, tiny sizes: checks the harness, measures nothing
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

CONFIGS = ('none', 'host', 'events', 'device', 'events+mem', 'events+mem1', 'fastxtend')
OURS = {'host': dict(sync='none'), 'events': dict(sync='events'), 'device': dict(sync='device'),  # timing alone, memory off
        'events+mem': dict(sync='events', memory=True), 'events+mem1': dict(sync='events', memory=dict(every=1))}  # memory: 1 batch in 10, every batch
WORKLOADS = ('mlp', 'cnn')
# batch size, train and valid batches per fit, image side
SIZES = {'mlp': dict(bs=64, n=500, nv=50), 'cnn': dict(bs=256, n=40, nv=8, hw=64)}
SMOKE = {'mlp': dict(bs=64, n=20, nv=4), 'cnn': dict(bs=8, n=4, nv=2, hw=16)}

def make_learner(workload, config, dev, s):
    import torch
    from torch import nn
    from fastai.learner import Learner
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.callback.progress import ProgressCallback
    if config in OURS: import fastxtend_prof.all  # noqa: F401
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
    if config in OURS:
        learn.profile(**{'memory': False, **OURS[config]}, show_report=False, logger_callback=None)
    elif config == 'fastxtend':
        from fastxtend.callback.profiler import ProfileMode
        learn.profile(mode=ProfileMode.Simple, show_report=False)

def worker(workload, config, smoke):
    "Serve timed fits, one per 'go' line on stdin, answering as JSON: µs per batch of the epoch loop and of the whole fit"
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
    for _ in range(2):  # warm up: first-call costs, cuDNN autotune, allocator
        attach(learn, config)
        with learn.no_logging(): learn.fit(1)
    print('ready', flush=True)
    n = s['n'] + s['nv']
    for line in sys.stdin:
        if line.strip() != 'go': break
        attach(learn, config)
        with learn.no_logging():
            sync(); t = time.perf_counter()  # the fit's queued GPU work counts, none from before it
            learn.fit(1)
            sync(); t = time.perf_counter() - t
        print(json.dumps([1e6*loop[-1]/n, 1e6*t/n]), flush=True)

def drop(procs, key, why):
    "Stop the worker of `key` (workload, configuration) and show the end of its stderr"
    pr, log = procs.pop(key); pr.kill(); pr.wait(); log.seek(0)
    print(f'{"/".join(key)}: worker {why}; the end of its stderr:\n' + ''.join(log.readlines()[-15:]), file=sys.stderr)

def rounds(workload, procs, a):
    "Interleaved rounds of `workload`'s live workers: {configuration: [(loop, fit) µs per batch, one per round]}"
    times = {c: [] for w, c in procs if w == workload}
    for r in range(a.rounds):
        if (workload, 'none') not in procs: return {}
        order = list(times)
        for c in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
            pr = procs[workload, c][0]
            try: pr.stdin.write('go\n'); pr.stdin.flush(); times[c].append(json.loads(pr.stdout.readline()))
            except (OSError, ValueError): drop(procs, (workload, c), f'died in round {r+1}'); del times[c]
        print(f'{workload} round {r+1}/{a.rounds}: ' + ', '.join(f'{c} {t[-1][0]/1e3:.3f}' for c, t in times.items()) + ' ms/batch', file=sys.stderr)
    return times

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--workload', choices=(*WORKLOADS, 'both'), default='both')
    p.add_argument('--configs', nargs='+', choices=CONFIGS, help='default: every one available (`none` always runs)')
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
    configs = ['none'] + [c for c in dict.fromkeys(configs) if c != 'none']
    env = dict(os.environ, PYTHONWARNINGS='ignore', **({'OMP_NUM_THREADS': '1'} if a.smoke else {}))
    workloads = WORKLOADS if a.workload == 'both' else (a.workload,)
    keys, procs = [(w, c) for w in workloads for c in configs], {}
    # All warm before any timed fit, and on the GPU one at a time: cuDNN's autotune, timed while another worker warms up,
    # could pick other kernels for some configurations
    for group in [keys] if a.smoke else [[k] for k in keys]:
        for k in group:
            log = tempfile.TemporaryFile('w+')  # the worker's stderr, shown if it fails
            procs[k] = (subprocess.Popen([sys.executable, __file__, '--worker', *k] + ['--smoke']*a.smoke, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env), log)
        for k in group:
            if procs[k][0].stdout.readline().strip() != 'ready': drop(procs, k, 'failed to start')
    results = {w: rounds(w, procs, a) for w in workloads}
    for pr, _ in procs.values(): pr.stdin.close(); pr.wait()
    sizes = SMOKE if a.smoke else SIZES
    where = ('CPU SMOKE RUN: tiny sizes on the CPU, where events and device fall back to the host clock; it checks the harness '
             'end to end, and its numbers say nothing about GPUs') if a.smoke else torch.cuda.get_device_name()
    v = importlib.metadata.version
    print(f'\n{where}\ntorch {v("torch")}, fastai {v("fastai")}, {a.rounds} interleaved rounds, medians over rounds. loop: fastai\'s '
          'epoch loop, the per-batch cost; fit: the whole `fit` call, reports included; × none: over `none`\'s time in the same round')
    for w in workloads:
        s = sizes[w]
        print(f'{w}: {s["n"]} train + {s["nv"]} valid batches of {s["bs"]}' + (f' {s["hw"]}×{s["hw"]} images' if 'hw' in s else '')
              + ' per fit' + ('' if a.smoke else ', data ' + ('on the GPU' if w == 'cnn' else 'in host memory')))
    print(f'{"":<16}' + ''.join(f'{c:>13}' for c in configs))
    for w, t in results.items():
        cell = lambda c, f: f'{f(c):>13.3f}' if c in t else f'{"failed":>13}'
        print(f'{w + " ms/batch":<16}' + ''.join(cell(c, lambda c: statistics.median(x[0] for x in t[c])/1e3) for c in configs))
        if 'none' not in t: continue
        for i, what in ((0, 'loop'), (1, 'fit')):
            print(f'{w + " " + what + " × none":<16}' + ''.join(cell(c, lambda c: statistics.median(x[i]/y[i] for x, y in zip(t[c], t['none'])))
                                                            for c in configs))
    if any('none' not in t for t in results.values()): sys.exit(1)

if __name__ == '__main__': main()
