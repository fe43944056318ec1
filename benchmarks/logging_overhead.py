"""What the live logging costs per train batch.

The claim (issue 3): with no logger attached, live logging adds no more than 5 µs per batch on average. With no logger
attached, `LoggerHub.create` returns None once per fit, and the profiler's Post callback is left with one `is None`
test per batch. This measures, in one run:

1. micro: `LoggerHub.create` with `logger_callback='auto'` and no logger callback attached (once per fit), and the
   per-batch guard the callbacks run when it returned None;
2. micro: with a do-nothing logger attached, `hub.after_train_batch` per batch for `log_every=10` (the default: a
   countdown on 9 batches of 10, the rolling window on the 10th) and `log_every=1` (the window every batch);
3. end to end: seconds per train batch of a profiled fit with `logger_callback=None` and with `'auto'` and no logger
   attached, alternated in rotating order, and the same comparison between two identical configurations (A/A), which
   is the noise floor.

Usage: python benchmarks/logging_overhead.py [--batches 400] [--repeats 9]"""
import argparse, statistics, timeit, types
import torch
from fastai.learner import Learner
from fastai.data.core import DataLoaders
from fastai.callback.progress import *  # noqa: F401,F403  (no_bar)
from fastai.optimizer import SGD
from fastxtend_prof.core.recorder import TimingRecorder, Phase, Step, AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH
import fastxtend_prof.profiler.simpleprofiler  # noqa: F401  (adds Learner.profile)
from fastxtend_prof.features.loggers import LoggerHub, Logger, register_logger, KNOWN_LOGGERS


def per_call(stmt, n, repeat=5):
    "Best-of-`repeat` seconds per call of `stmt` run `n` times"
    return min(timeit.repeat(stmt, number=n, repeat=repeat))/n


def make_learner(n_batches, bs=8):
    x = torch.randn(n_batches*bs, 4); y = x.sum(1, keepdim=True)
    ds = list(zip(x, y))
    dls = DataLoaders.from_dsets(ds, ds[:bs], bs=bs, shuffle=False, num_workers=0, device=torch.device('cpu'))
    return Learner(dls, torch.nn.Linear(4, 1), loss_func=torch.nn.functional.mse_loss, opt_func=SGD, lr=1e-3)


def profiled(learn, logger_callback): return learn.profile(show_report=False, logger_callback=logger_callback)


def fit_per_batch(learn, logger_callback):
    profiled(learn, logger_callback)
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    return r.loc[('fit', 'train'), 'Total Time']/len(learn.dls.train)


def main(batches=400, repeats=9):
    learn = make_learner(64)
    # 1. no logger attached
    assert LoggerHub.create(learn, 'auto') is None
    create_s = per_call(lambda: LoggerHub.create(learn, 'auto'), 2000)
    cb = types.SimpleNamespace(hub=None, training=True)
    def guard():
        hub = cb.hub
        if hub is not None and cb.training: hub.after_train_batch(None, None)
    guard_s = per_call(guard, 1_000_000)

    # 2. a do-nothing logger attached: the hub's own cost
    class Null(Logger): pass
    register_logger('_null', Null)
    null_cb = types.SimpleNamespace(name='_null', run=True)
    stub = types.SimpleNamespace(_null=null_cb, cbs=[null_cb])
    rec = TimingRecorder(warmup=1)
    rec.start(Step.FIT); rec.start(Step.EPOCH); rec.begin_phase(Phase.TRAIN)
    for _ in range(100):
        rec.draw(); rec.start_batch()
        for s in (AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH): rec.mark(s)
        rec.end_batch(8)
    hub10, hub1 = LoggerHub.create(stub, '_null', 10), LoggerHub.create(stub, '_null', 1)
    hub10_s = per_call(lambda: hub10.after_train_batch(stub, rec), 20_000)
    hub1_s = per_call(lambda: hub1.after_train_batch(stub, rec), 5_000)
    del KNOWN_LOGGERS['_null']

    # 3. end to end, alternated: None vs 'auto' (no logger attached), and None vs None (noise)
    big = make_learner(batches)
    fit_per_batch(big, None)  # warm up
    t = {'none': [], 'auto': [], 'none2': []}
    order = [('none', None), ('auto', 'auto'), ('none2', None)]
    for r in range(repeats):  # rotate the order, so no configuration always runs first
        for k, lc in order[r % 3:] + order[:r % 3]: t[k].append(fit_per_batch(big, lc))
    med = {k: statistics.median(v) for k, v in t.items()}
    diffs = [a - n for a, n in zip(t['auto'], t['none'])]
    noise = [b - n for b, n in zip(t['none2'], t['none'])]

    us = 1e6
    print('1. no logger attached')
    print(f'   LoggerHub.create(learn, "auto") -> None, once per fit:        {create_s*us:8.2f} µs')
    print(f'   per-batch guard (`hub is not None`):                          {guard_s*us:8.3f} µs')
    print('2. a do-nothing logger attached (hub cost, logger I/O excluded)')
    print(f'   hub.after_train_batch, log_every=10 (mean per batch):          {hub10_s*us:8.2f} µs')
    print(f'   hub.after_train_batch, log_every=1 (the rolling window):       {hub1_s*us:8.2f} µs')
    print(f'3. end to end, {batches} train batches a fit, {repeats} alternated fits each')
    print(f'   median per train batch, logger_callback=None:                  {med["none"]*us:8.1f} µs')
    print(f"   median per train batch, logger_callback='auto', none attached: {med['auto']*us:8.1f} µs")
    print(f"   median difference 'auto' - None:                               {statistics.median(diffs)*us:+8.2f} µs")
    print(f'   median difference None - None (noise floor):                   {statistics.median(noise)*us:+8.2f} µs'
          f'  (spread {min(noise)*us:+.1f} .. {max(noise)*us:+.1f})')
    print(f"   fastest fit per batch, None / 'auto' / None again:              "
          f"{min(t['none'])*us:.1f} / {min(t['auto'])*us:.1f} / {min(t['none2'])*us:.1f} µs")
    per_batch_no_logger = guard_s + create_s/batches
    print(f'No logger attached: {per_batch_no_logger*us:.3f} µs per batch on average '
          f'(guard + create amortised over {batches} batches); budget 5 µs: {"OK" if per_batch_no_logger < 5e-6 else "OVER"}')
    return dict(create_s=create_s, guard_s=guard_s, hub10_s=hub10_s, hub1_s=hub1_s, **{f'median_{k}_s': v for k, v in med.items()})


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--batches', type=int, default=400)
    p.add_argument('--repeats', type=int, default=9)
    a = p.parse_args()
    main(a.batches, a.repeats)
