"""What the profiler says when one rank of a data-parallel fit is slow in one step.

Runs `--world` gloo ranks on the CPU, each a fastai `Learner` whose model is wrapped in `DistributedDataParallel`
(with `--no-ddp`, left unwrapped: the ranks then meet only where fastai gathers each batch's loss from every rank),
`--batches` train batches of `--bs` per rank, every rank's forward sleeping `--work` seconds per batch (a model
waiting on its device; without it the tiny model's step is mostly the loop's own overhead), and gives rank 1
`--delay` seconds of extra work per train batch in one place at a time (spun on the CPU; with `--sleep`, slept: time
that takes no core from the other ranks, which a loaded machine cannot shorten):

- `none`: no delay (a balanced run);
- `draw`: the rank's dataset busy-waits while its batch is collated;
- `forward`: a layer in front of the model busy-waits in `forward`;
- `backward`: a custom autograd function busy-waits in `backward`, inside DDP's backward, before the gradient all-reduce;
- `opt_step`: a callback busy-waits in `before_step`.

For each case it prints every rank's mean train step durations (ms, with `comm_wait`: the wait inside backward at the
gradient all-reduce), the arrival lines and the advice rank 0's report gives, and what the rule on step durations
alone would say, so that what the straggler analysis finds can be read against where the delay really was.

    python benchmarks/ddp_straggler.py                       # 2 ranks, every case
    python benchmarks/ddp_straggler.py --world 3 --cases forward backward
    python benchmarks/ddp_straggler.py --no-ddp --cases none forward
"""
import argparse, os, pickle, socket, sys, tempfile, time, traceback
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = ('none', 'draw', 'forward', 'backward', 'opt_step')
STEPS = ('draw', 'forward', 'loss', 'backward', 'comm_wait', 'opt_step', 'zero_grad', 'other')
SLOW = 1  # the rank given the delay

def busy(s:float):
    "Spend `s` seconds of CPU (a sleep would free the core: real work does not)"
    end = time.perf_counter() + s
    while time.perf_counter() < end: pass

def spend(s:float, sleep:bool=False):
    "`s` seconds of the delay: spun (`busy`), or with `sleep` slept"
    if sleep: time.sleep(s)
    else: busy(s)

class Items(torch.utils.data.Dataset):
    "Synthetic regression items"
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 1, generator=g)
        self.y = 2*self.x + 1
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return self.x[i], self.y[i]

class SlowForward(torch.nn.Module):
    "Spends `delay` s (`spend`), then sleeps `work` s (a model waiting on its device: time without taking a core from the other ranks)"
    def __init__(self, delay, work=0., sleep=False): super().__init__(); self.delay, self.work, self.sleep = delay, work, sleep
    def forward(self, x):
        spend(self.delay, self.sleep)
        if self.work: time.sleep(self.work)
        return x

class SlowGrad(torch.autograd.Function):
    "The identity forward; its backward spends `delay` s (`spend`)"
    @staticmethod
    def forward(ctx, x, delay, sleep=False):
        ctx.delay, ctx.sleep = delay, sleep
        return x.view_as(x)
    @staticmethod
    def backward(ctx, g):
        spend(ctx.delay, ctx.sleep)
        return g, None, None

class Model(torch.nn.Module):
    "fastai's `RegModel` (y = a*x + b) with the forward or backward delays in front of it"
    def __init__(self, fwd=0., bwd=0., work=0., sleep=False):
        super().__init__()
        self.a, self.b = torch.nn.Parameter(torch.randn(1)), torch.nn.Parameter(torch.randn(1))
        self.slow, self.bwd, self.sleep = SlowForward(fwd, work, sleep), bwd, sleep
    def forward(self, x):
        y = self.slow(x)*self.a + self.b
        return SlowGrad.apply(y, self.bwd, self.sleep) if self.bwd else y

def learner(rank, case, a):
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader, fa_collate
    from fastai.learner import Learner
    from fastai.losses import MSELossFlat
    from fastai.callback.core import Callback
    from fastai.callback.progress import ProgressCallback
    from fastcore.basics import noop
    delay, sleep = (a.delay if rank == SLOW else 0.), getattr(a, 'sleep', False)
    def collate(b):
        if case == 'draw': spend(delay, sleep)
        return fa_collate(b)
    trn, val = Items(a.batches*a.bs, seed=rank), Items(2*a.bs, seed=99)
    dls = DataLoaders(DataLoader(trn, bs=a.bs, shuffle=True, num_workers=0, create_batch=collate),
                      DataLoader(val, bs=a.bs, num_workers=0), device='cpu')
    torch.manual_seed(0)
    model = Model(fwd=delay if case == 'forward' else 0., bwd=delay if case == 'backward' else 0., work=getattr(a, 'work', 0.), sleep=sleep)
    learn = Learner(dls, model, loss_func=MSELossFlat(), lr=1e-2)
    learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, ProgressCallback)])
    learn.logger = noop
    if case == 'opt_step':
        class SlowStep(Callback):
            def before_step(self): spend(delay, sleep)
        learn.add_cb(SlowStep())
    if getattr(a, 'ddp', True):
        from torch.nn.parallel import DistributedDataParallel
        learn.model = DistributedDataParallel(learn.model)
    return learn

def worker(rank, world, port, out, case, a):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    rec = {}
    try:
        import fastxtend_prof.all  # noqa: F401
        dist.init_process_group('gloo', rank=rank, world_size=world, timeout=timedelta(seconds=60))
        learn = learner(rank, case, a)
        learn.profile(show_report=False)
        learn.fit(1)
        res = learn.simple_profile_results
        train = res[res.Phase == 'train']
        rec['means'] = {s: float(train[train.Step == s]['Mean Duration'].iloc[0])*1e3 for s in STEPS if (train.Step == s).any()}
        rec['advice'] = [f'[{x.rule}] {x.verdict} -> {x.suggestion}' for x in learn.profile_result.advice] if rank == 0 else []
        if rank == 0 and learn.profile_result.arrivals is not None:
            from fastxtend_prof.features.arrivals import arrival_text
            rec['arrivals'] = arrival_text(learn.profile_result.arrivals)
        if rank == 0:  # what the rule on step durations alone (the fallback without arrival times) would say
            from fastxtend_prof.features.distributed import straggler_advice
            rec['by_durations'] = [f"rank {x.evidence['rank']}, `{x.evidence['step']}`" for x in straggler_advice(learn.profile_result.rank_results)]
    except BaseException: rec['error'] = traceback.format_exc()
    finally:
        if dist.is_initialized(): dist.destroy_process_group()
        Path(out, f'rank{rank}.pkl').write_bytes(pickle.dumps(rec))

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def run(case, a):
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(a.world, free_port(), d, case, a), nprocs=a.world, start_method='spawn')
        return [pickle.loads(Path(d, f'rank{r}.pkl').read_bytes()) for r in range(a.world)]

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--world', type=int, default=2)
    p.add_argument('--batches', type=int, default=20, help='train batches per rank')
    p.add_argument('--bs', type=int, default=8)
    p.add_argument('--delay', type=float, default=0.01, help='seconds of extra work per train batch on rank 1')
    p.add_argument('--work', type=float, default=0.005, help='seconds every rank\'s forward sleeps per batch (a model waiting on its device)')
    p.add_argument('--sleep', action='store_true', help='the delays sleep instead of spinning (as tests/test_arrivals.py runs them)')
    p.add_argument('--no-ddp', dest='ddp', action='store_false',
                   help='leave the model unwrapped: no gradient all-reduce (the ranks meet only where fastai gathers the loss)')
    p.add_argument('--cases', nargs='+', choices=CASES, default=list(CASES))
    a = p.parse_args()
    print(f'{a.world} gloo ranks, {a.batches} train batches of {a.bs} per rank; rank {SLOW} gets {a.delay*1e3:g} ms per batch in the step named'
          f"{', slept' if a.sleep else ', spun'}{'' if a.ddp else '; the model not wrapped in DDP'}")
    for case in a.cases:
        recs = run(case, a)
        print(f'\n== {case}')
        for r, rec in enumerate(recs):
            if 'error' in rec: print(f'rank {r} failed:\n{rec["error"]}'); continue
            print(f'rank {r}: ' + ', '.join(f'{s} {v:.2f}' for s, v in rec['means'].items()) + ' (ms, train means)')
        if recs[0].get('arrivals'): print(recs[0]['arrivals'])
        print(f"  step durations alone: {'; '.join(recs[0].get('by_durations', [])) or 'no straggler'}")
        for line in recs[0].get('advice', []): print(f'  advice: {line[:400]}')
    return 0

if __name__ == '__main__': sys.exit(main())
