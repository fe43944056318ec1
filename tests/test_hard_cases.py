"""Hard cases of the Simple Profiler on real fastai Learners: gradient accumulation, cancellations, exceptions,
missing/empty validation, validate/get_preds/lr_find, repeated fits, mixed precision, dishonest loaders, CSV,
argument checking and `show_training_loop`.

Every test counts batches independently of the profiler (a logging callback, a wrapped optimizer) and checks
the partition: for each phase, the top-level rows (draw + batch + other + warmup) add up to the phase's time."""
import contextlib, inspect, io, math, os, warnings
import pandas as pd, pytest, torch
from pathlib import Path
from fastcore.basics import noop
from fastai.learner import Learner
from fastai.data.core import DataLoaders
from fastai.callback.core import (Callback, CancelBatchException, CancelEpochException, CancelFitException,
                                  CancelStepException, CancelBackwardException)
from fastai.test_utils import synth_learner, synth_dbunch, RegModel
from fastai.callback.progress import ProgressCallback
from fastxtend_prof.features.flops import FLOP_COLS
from fastai.callback.training import GradientAccumulation, ShortEpochCallback
from fastai.callback.fp16 import MixedPrecision
import fastai.callback.schedule  # noqa: F401  (Learner.lr_find)
from fastxtend_prof.all import *  # registers `before_draw` and patches `Learner.profile`
from fastxtend_prof.core import events
from fastxtend_prof.profiler.simpleprofiler import SimpleProfilerCallback, SimpleProfilerPostCallback
from conftest import row, calls, BatchLog, RaiseAt, LyingDL

N_TRN, N_VAL = 10, 2  # synth_learner's batches of 16
TOP = ('draw', 'batch', 'other', 'warmup')
TRAIN_SUB = ('forward', 'loss', 'backward', 'opt_step', 'zero_grad')
PROFILE_PARAMS = inspect.signature(Learner.profile).parameters

# ---------------------------------------------------------------------------------------------------------- helpers
def mk(**kw):
    "A quiet `synth_learner`: no progress bar, no printed metrics"
    learn = synth_learner(**kw)
    learn.remove_cb(ProgressCallback)
    learn.logger = noop
    return learn

def prof(learn, **kw):
    kw.setdefault('show_report', False)
    return learn.profile(**kw)

def total(df, phase, step): return float(row(df, phase, step)['Total Time'])
def phases(df): return set(df.Phase)

def check_partition(df, rel=0.01):
    "Each phase's top-level rows add up to that phase's span (fit/train, fit/valid) within `rel`"
    for ph in ('train', 'valid'):
        rows = df[df.Phase == ph]
        if rows.empty: continue
        assert sorted(rows[rows.Step.isin(TOP)].Step) == sorted(TOP)
        top = rows[rows.Step.isin(TOP + ('last_draw', 'trace'))]['Total Time'].sum()  # `trace`: batches an instrument ran in (FLOP counting); `last_draw`: each loop's last draw
        span = total(df, 'fit', ph)
        assert span > 0
        assert top == pytest.approx(span, rel=rel), f'{ph}: top-level rows {top} vs phase time {span}'
    assert (df['Total Time'] >= 0).all()
    assert (df['Number of Calls'] >= 0).all()

def check_phase_counts(df, phase, steady, warm, subs=None):
    "`steady` non-warmup batches in draw/batch/other, `warm` in warmup, sub-step counts as given in `subs`"
    for s in ('draw', 'batch', 'other'): assert calls(df, phase, s) == steady, (phase, s)
    assert calls(df, phase, 'warmup') == warm
    for s, n in (subs or {}).items(): assert calls(df, phase, s) == n, (phase, s)

def pair_attached(learn):
    return (sum(isinstance(cb, SimpleProfilerCallback) for cb in learn.cbs),
            sum(isinstance(cb, SimpleProfilerPostCallback) for cb in learn.cbs))

def assert_removed(learn):
    assert pair_attached(learn) == (0, 0)
    assert not events.listens_before_draw(learn)

def assert_normal_profile(learn, n_trn=N_TRN, n_val=N_VAL):
    "A second, profiled, one-epoch fit works and counts every batch"
    prof(learn)
    learn.fit(1)
    df = learn.simple_profile_results
    check_phase_counts(df, 'train', n_trn-1, 1, {s: n_trn-1 for s in TRAIN_SUB})
    check_phase_counts(df, 'valid', n_val-1, 1, {'predict': n_val-1, 'loss': n_val-1})
    check_partition(df)
    assert_removed(learn)

def steady(log, warmup=1):
    "Non-warmup batches of `log` (each loop's first `warmup` are warmup): every loop starts at iter 0 here"
    return [b for b in log if b[1] >= warmup]

def spy_opt(learn):
    "Create the optimizer and wrap its `step`/`zero_grad` to log the `(epoch, iter)` of every real call"
    learn.create_opt()
    log = dict(step=[], zero_grad=[])
    for name in ('step', 'zero_grad'):
        f = getattr(learn.opt, name)
        def wrapped(*a, _f=f, _n=name, **k):
            log[_n].append((learn.epoch, learn.iter))
            return _f(*a, **k)
        setattr(learn.opt, name, wrapped)
    return log

def params(learn): return [p.detach().clone() for p in learn.model.parameters()]
def changed(before, learn): return any(not torch.equal(a, b) for a, b in zip(before, learn.model.parameters()))

def keep_raw_values():
    return [True, False] if 'keep_raw' in PROFILE_PARAMS else [None]

def raw_kw(keep_raw): return {} if keep_raw is None else dict(keep_raw=keep_raw)

# ------------------------------------------------------------------------------------------ 1. gradient accumulation
@pytest.mark.parametrize('keep_raw', keep_raw_values())
def test_gradient_accumulation_counts_only_real_steps(keep_raw):
    # batches of 16, n_acc=48: the optimizer steps on every third batch (iters 2, 5, 8), never on the warmup batch
    learn, log = mk(), BatchLog()
    opt_log = spy_opt(learn)
    prof(learn, **raw_kw(keep_raw))
    learn.fit(1, cbs=[log, GradientAccumulation(n_acc=48)])
    df = learn.simple_profile_results
    assert len(log.train) == N_TRN and len(log.valid) == N_VAL
    stepped = steady(opt_log['step'])
    assert [i for _, i in stepped] == [2, 5, 8]  # the independent count: real optimizer steps after warmup
    n = len(steady(log.train))
    check_phase_counts(df, 'train', n, 1, dict(forward=n, loss=n, backward=n,
                                              opt_step=len(stepped), zero_grad=len(steady(opt_log['zero_grad']))))
    assert calls(df, 'train', 'opt_step') == calls(df, 'train', 'zero_grad') == 3
    assert calls(df, 'train', 'opt_step') < calls(df, 'train', 'backward')
    check_phase_counts(df, 'valid', N_VAL-1, 1)
    check_partition(df)
    assert_removed(learn)

# ----------------------------------------------------------------------------------------------- 2. cancellations
class CancelBatchAt(Callback):
    def __init__(self, iters): self.iters = set(iters)
    def before_batch(self):
        if self.training and self.iter in self.iters: raise CancelBatchException()

class CancelEpochAt(Callback):
    def __init__(self, it): self.it = it
    def after_batch(self):
        if self.training and self.iter == self.it: raise CancelEpochException()

class CancelFitAt(Callback):
    def __init__(self, epoch, it): self.epoch_, self.it = epoch, it
    def after_batch(self):
        if self.training and self.epoch == self.epoch_ and self.iter == self.it: raise CancelFitException()

class CancelStepAt(Callback):
    def __init__(self, iters): self.iters = set(iters)
    def before_step(self):
        if self.iter in self.iters: raise CancelStepException()

class CancelBackwardAt(Callback):
    def __init__(self, iters): self.iters = set(iters)
    def before_backward(self):
        if self.iter in self.iters: raise CancelBackwardException()

@pytest.mark.parametrize('keep_raw', keep_raw_values())
def test_cancel_batch_in_before_batch(keep_raw):
    learn, log = mk(), BatchLog()
    opt_log = spy_opt(learn)
    prof(learn, **raw_kw(keep_raw))
    learn.fit(1, cbs=[log, CancelBatchAt({2, 5})])
    df = learn.simple_profile_results
    assert len(log.train) == N_TRN
    ran = len(steady(log.train)) - 2  # batches 2 and 5 never reached the model
    check_phase_counts(df, 'train', N_TRN-1, 1, dict(loss=ran, backward=ran, opt_step=len(steady(opt_log['step'])),
                                                     zero_grad=len(steady(opt_log['zero_grad']))))
    assert len(steady(opt_log['step'])) == ran == 7
    assert calls(df, 'train', 'loss') <= calls(df, 'train', 'forward') <= calls(df, 'train', 'batch')
    check_phase_counts(df, 'valid', N_VAL-1, 1)
    check_partition(df)
    assert_removed(learn)
    assert_normal_profile(learn)

def test_cancel_epoch_mid_epoch():
    learn, log = mk(), BatchLog()
    prof(learn)
    learn.fit(2, cbs=[log, CancelEpochAt(4)])
    df = learn.simple_profile_results
    assert len(log.train) == 2*5 and log.valid == []  # each epoch stops after iter 4, before validation
    assert calls(df, 'fit', 'fit') == 1 and calls(df, 'fit', 'epoch') == 2 and calls(df, 'fit', 'train') == 2
    check_phase_counts(df, 'train', len(steady(log.train)), 2, {s: 8 for s in TRAIN_SUB})
    assert 'valid' not in phases(df)
    check_partition(df)
    assert_removed(learn)
    assert_normal_profile(learn)

def test_cancel_fit_mid_epoch():
    learn, log = mk(), BatchLog()
    prof(learn)
    learn.fit(3, cbs=[log, CancelFitAt(1, 4)])
    df = learn.simple_profile_results
    assert len(log.train) == N_TRN + 5 and len(log.valid) == N_VAL  # epoch 0 whole, epoch 1 up to iter 4, no epoch 2
    assert calls(df, 'fit', 'epoch') == 2 and calls(df, 'fit', 'train') == 2 and calls(df, 'fit', 'valid') == 1
    check_phase_counts(df, 'train', len(steady(log.train)), 2, {s: 13 for s in TRAIN_SUB})
    check_phase_counts(df, 'valid', N_VAL-1, 1)
    check_partition(df)
    assert_removed(learn)
    assert_normal_profile(learn)

def test_cancel_train_short_epoch():
    learn, log = mk(n_val=4), BatchLog()
    prof(learn)
    learn.fit(1, cbs=[log, ShortEpochCallback(pct=0.5, short_valid=True)])
    df = learn.simple_profile_results
    assert len(log.train) == 6 and len(log.valid) == 3  # train stops after iter 5 (5/10), valid after iter 2 (2/4)
    check_phase_counts(df, 'train', 5, 1, {s: 5 for s in TRAIN_SUB})
    check_phase_counts(df, 'valid', 2, 1, {'predict': 2, 'loss': 2})
    assert calls(df, 'fit', 'train') == calls(df, 'fit', 'valid') == 1
    check_partition(df)
    assert_removed(learn)
    assert_normal_profile(learn, n_val=4)

def test_cancel_step_and_backward():
    # CancelStepException: no optimizer step, but fastai still zeroes the gradients; CancelBackwardException: no backward
    learn, log = mk(), BatchLog()
    opt_log = spy_opt(learn)
    prof(learn)
    learn.fit(1, cbs=[log, CancelStepAt({0, 3, 6}), CancelBackwardAt({4, 7})])
    df = learn.simple_profile_results
    n = len(steady(log.train))
    stepped, zeroed = steady(opt_log['step']), steady(opt_log['zero_grad'])
    assert len(stepped) == n - 2 and len(zeroed) == n
    check_phase_counts(df, 'train', n, 1, dict(forward=n, loss=n, backward=n-2, opt_step=len(stepped),
                                               zero_grad=len(zeroed)))
    check_partition(df)
    assert_removed(learn)

def test_samples_per_second_counts_the_whole_phase():
    "Control for the test below: with nothing cancelled the throughput rows count 16 samples a batch; the other rows have none"
    learn = prof(mk())
    learn.fit(1)
    df = learn.simple_profile_results
    for s in ('iteration', 'draw', 'batch'):
        r = row(df, 'train', s)
        assert r['Samples/Second'] == pytest.approx(16*(N_TRN-1)/r['Total Time'], rel=1e-9)
    for s in TRAIN_SUB + ('other', 'warmup'): assert math.isnan(row(df, 'train', s)['Samples/Second']), s

@pytest.mark.parametrize('keep_raw', keep_raw_values())
def test_samples_per_second_survives_a_cancel_in_after_batch(keep_raw):
    learn = prof(mk(), **raw_kw(keep_raw))
    learn.fit(1, cbs=ShortEpochCallback(pct=0.5, short_valid=False))
    df = learn.simple_profile_results
    n = row(df, 'train', 'batch')['Number of Calls'] + row(df, 'train', 'warmup')['Number of Calls']
    fit_train = row(df, 'fit', 'train')
    assert fit_train['Samples/Second'] == pytest.approx(16*n/fit_train['Total Time'])  # the cancelled batch's samples count
    for s in ('iteration', 'draw', 'batch'):
        r = row(df, 'train', s)
        assert r['Samples/Second'] == pytest.approx(16*r['Number of Calls']/r['Total Time']), s

# ----------------------------------------------------------------------------------------------- 3. real exceptions
class FailingModel(RegModel):
    "RegModel that raises on its `n`-th call (once)"
    def __init__(self, n): super().__init__(); self.n, self.calls, self.raised = n, 0, None
    def forward(self, x):
        self.calls += 1
        if self.calls == self.n:
            self.raised = RuntimeError(f'model failed on call {self.n}')
            raise self.raised
        return super().forward(x)

def _fault_case(kind):
    "(learner, fit cbs, expected exception type, a function giving the raised object) for each kind of fault"
    if kind == 'model':
        m = FailingModel(5)  # the 5th train batch (iter 4)
        return mk(model=m), [], RuntimeError, lambda: m.raised
    if kind == 'after_pred':
        cb = RaiseAt('after_pred', lambda: RuntimeError('boom in after_pred'), it=4)
        return mk(), [cb], RuntimeError, lambda: cb.raised
    cb = RaiseAt('after_batch', KeyboardInterrupt, it=4)
    return mk(), [cb], KeyboardInterrupt, lambda: cb.raised

@pytest.mark.parametrize('kind', ['model', 'after_pred', 'keyboard_interrupt'])
def test_exception_mid_epoch(kind, capsys):
    # the same fault without the profiler, for the message fastai gives it
    plain, plain_cbs, etype, _ = _fault_case(kind)
    with pytest.raises(etype) as plain_exc: plain.fit(1, cbs=plain_cbs)

    learn, cbs, etype, raised = _fault_case(kind)
    log = BatchLog()
    learn.profile(show_report=True, plain=True)
    capsys.readouterr()
    with pytest.raises(etype) as exc: learn.fit(1, cbs=[log] + cbs)
    assert exc.value is raised()  # the very object raised, not a wrapper
    assert type(exc.value) is type(plain_exc.value)
    assert str(exc.value) == str(plain_exc.value)
    if kind == 'model': assert str(exc.value) == 'model failed on call 5'
    out = capsys.readouterr().out
    assert 'partial' in out and type(exc.value).__name__ in out

    df = learn.simple_profile_results
    assert len(log.train) == 5 and log.valid == []  # batches 0..4 started; the fault is in batch 4
    check_phase_counts(df, 'train', 4, 1)
    assert calls(df, 'fit', 'fit') == calls(df, 'fit', 'epoch') == calls(df, 'fit', 'train') == 1
    completed = 3 if kind != 'keyboard_interrupt' else 4  # forward of batch 4 failed / batch 4 fully ran
    for s in ('loss', 'backward', 'opt_step', 'zero_grad'): assert calls(df, 'train', s) == completed, s
    assert 'valid' not in phases(df)
    check_partition(df)
    assert_removed(learn)

    before = params(learn)
    learn.fit(1)  # plain fit: fastai's own loop
    assert changed(before, learn)
    assert learn.simple_profile_results is df  # not profiled
    assert_normal_profile(learn)

# ------------------------------------------------------------------------------------ 4. no / empty validation set
def _train_only_learner():
    dls = synth_dbunch()
    return mk(data=DataLoaders(dls.train))

def test_no_validation_set_fails_like_fastai():
    plain = _train_only_learner()
    with pytest.raises(Exception) as plain_exc: plain.fit(1)
    learn = prof(_train_only_learner())
    with pytest.raises(type(plain_exc.value)) as exc: learn.fit(1)
    assert type(exc.value) is type(plain_exc.value) and str(exc.value) == str(plain_exc.value)
    df = learn.simple_profile_results  # the train loop ran before fastai looked for dls[1]
    check_phase_counts(df, 'train', N_TRN-1, 1, {s: N_TRN-1 for s in TRAIN_SUB})
    assert 'valid' not in phases(df) and 'valid' not in set(df.Step)
    check_partition(df)
    assert_removed(learn)

@pytest.mark.parametrize('keep_raw', keep_raw_values())
def test_empty_validation_set(keep_raw):
    learn, log = mk(n_val=0), BatchLog()
    assert len(learn.dls.valid) == 0
    prof(learn, **raw_kw(keep_raw))
    learn.fit(2, cbs=log)
    df = learn.simple_profile_results
    assert log.valid == []
    check_phase_counts(df, 'train', 2*(N_TRN-1), 2, {s: 2*(N_TRN-1) for s in TRAIN_SUB})
    assert 'valid' not in phases(df)
    if 'valid' in set(df.Step): assert calls(df, 'fit', 'valid') == 2  # the (empty) loop ran each epoch
    assert not df.drop(columns=['Duration Std Dev', 'P90 Duration', 'P99 Duration', 'Samples/Second', *FLOP_COLS], errors='ignore')[
        df.Phase == 'train'].isna().any().any()  # the FLOP columns hold numbers on the rows they measure only
    check_partition(df)
    assert_removed(learn)

# ------------------------------------------------------------------------------------ 5. validate / get_preds / lr_find
def test_validate_and_get_preds_untouched(capsys):
    learn = mk()
    ref_v = learn.validate()
    ref_p = learn.get_preds()
    ref_pl = learn.get_preds(with_loss=True, with_input=True)
    capsys.readouterr()

    learn.profile(show_report=True, plain=True)  # a report would print: none must
    v = learn.validate()
    p = learn.get_preds()
    pl = learn.get_preds(with_loss=True, with_input=True)
    out = capsys.readouterr().out
    assert 'Simple Profiler' not in out and out == ''
    assert type(v) is type(ref_v) and list(v) == pytest.approx(list(ref_v))
    assert len(p) == len(ref_p) and all(torch.equal(a, b) for a, b in zip(p, ref_p))
    assert len(pl) == len(ref_pl) and all(torch.equal(a, b) for a, b in zip(pl, ref_pl))
    assert pair_attached(learn) == (1, 1)
    assert not hasattr(learn, 'simple_profile_results')

    learn.fit(1)
    out = capsys.readouterr().out
    assert out.count('Simple Profiler report') == 1
    df = learn.simple_profile_results
    check_phase_counts(df, 'train', N_TRN-1, 1)
    check_phase_counts(df, 'valid', N_VAL-1, 1)
    check_partition(df)
    assert_removed(learn)

def test_lr_find_is_not_profiled(tmp_path):
    learn = prof(mk(path=tmp_path))
    learn.lr_find(num_it=5, show_plot=False)
    assert pair_attached(learn) == (1, 1)
    assert not hasattr(learn, 'simple_profile_results')
    learn.fit(1)
    df = learn.simple_profile_results
    assert calls(df, 'fit', 'epoch') == 1
    check_phase_counts(df, 'train', N_TRN-1, 1)
    assert_removed(learn)

def test_get_preds_inside_a_profiled_fit():
    "A callback calling `get_preds` in `after_train` neither records the nested pass nor stops the profile"
    class Preds(Callback):
        def after_train(self): self.out = self.learn.get_preds()
    learn = prof(mk())
    learn.fit(2, cbs=Preds())
    df = learn.simple_profile_results
    check_phase_counts(df, 'train', 2*(N_TRN-1), 2)
    check_phase_counts(df, 'valid', 2*(N_VAL-1), 2)  # the nested get_preds passes are not in the valid rows
    assert calls(df, 'fit', 'fit') == 1 and calls(df, 'fit', 'epoch') == 2
    check_partition(df)
    assert_removed(learn)

# ------------------------------------------------------------------------------------------------ 6. fit twice
def test_second_fit_not_profiled_then_reprofile():
    learn = prof(mk())
    prof(learn)  # profiling twice before a fit keeps a single pair
    assert pair_attached(learn) == (1, 1)
    before = params(learn)
    learn.fit(1)
    assert changed(before, learn)
    first = learn.simple_profile_results
    snapshot = first.copy()

    before = params(learn)
    learn.fit(1)
    assert changed(before, learn)  # the second fit trains
    assert learn.simple_profile_results is first
    pd.testing.assert_frame_equal(first, snapshot)
    assert_removed(learn)

    prof(learn)
    learn.fit(2)
    df = learn.simple_profile_results
    assert df is not first
    assert calls(df, 'fit', 'fit') == 1 and calls(df, 'fit', 'epoch') == 2
    assert calls(df, 'fit', 'train') == calls(df, 'fit', 'valid') == 2
    check_phase_counts(df, 'train', 2*(N_TRN-1), 2, {s: 2*(N_TRN-1) for s in TRAIN_SUB})
    check_phase_counts(df, 'valid', 2*(N_VAL-1), 2)
    check_partition(df)

# ---------------------------------------------------------------------------------------------- 7. mixed precision
@pytest.mark.filterwarnings('ignore')
def test_mixed_precision_on_cpu():
    plain = mk()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            plain.fit(1, cbs=MixedPrecision())
    except Exception as e: pytest.skip(f'fastai MixedPrecision fails on CPU without the profiler: {e!r}')
    learn, log = mk(), BatchLog()
    opt_log = spy_opt(learn)
    prof(learn)
    learn.fit(1, cbs=[log, MixedPrecision()])
    df = learn.simple_profile_results
    assert len(log.train) == N_TRN
    n = N_TRN - 1
    check_phase_counts(df, 'train', n, 1, dict(forward=n, loss=n, backward=n, opt_step=len(steady(opt_log['step'])),
                                               zero_grad=len(steady(opt_log['zero_grad']))))
    check_phase_counts(df, 'valid', N_VAL-1, 1)
    check_partition(df)
    assert_removed(learn)

# ------------------------------------------------------------------------------------------- 8. dishonest loaders
class NoLenDL:
    "Wraps a loader as a plain iterable: no `__len__`"
    def __init__(self, dl): self.dl = dl
    def __iter__(self): return iter(self.dl)
    def __getattr__(self, k): return getattr(self.dl, k)

@pytest.mark.parametrize('n,claimed', [(3, 10), (4, 1000)])
def test_loader_len_claims_more_than_it_yields(n, claimed):
    learn, log = mk(), BatchLog()
    learn.dls.loaders[0] = LyingDL(learn.dls.train, n, claimed)
    assert len(learn.dls.train) == claimed
    prof(learn)
    learn.fit(2, cbs=log)
    df = learn.simple_profile_results
    assert len(log.train) == 2*n
    check_phase_counts(df, 'train', 2*(n-1), 2, {s: 2*(n-1) for s in TRAIN_SUB})
    check_phase_counts(df, 'valid', 2*(N_VAL-1), 2)
    check_partition(df)
    assert_removed(learn)

def test_valid_iterable_without_len():
    learn, log = mk(n_val=3), BatchLog()
    learn.dls.loaders[1] = NoLenDL(learn.dls.valid)
    with pytest.raises(TypeError): len(learn.dls.valid)
    prof(learn)
    learn.fit(1, cbs=log)
    df = learn.simple_profile_results
    assert len(log.valid) == 3
    check_phase_counts(df, 'valid', 2, 1, {'predict': 2, 'loss': 2})
    check_phase_counts(df, 'train', N_TRN-1, 1)
    check_partition(df)
    assert_removed(learn)

def test_train_iterable_without_len_fails_like_fastai():
    "fastai's TrainEvalCallback needs `n_iter` in training: without the profiler it fails too (at `len`)"
    plain = mk()
    plain.dls.loaders[0] = NoLenDL(plain.dls.train)
    with pytest.raises(TypeError): plain.fit(1)
    learn = mk()
    learn.dls.loaders[0] = NoLenDL(learn.dls.train)
    prof(learn)
    with pytest.raises(TypeError): learn.fit(1)
    assert hasattr(learn, 'simple_profile_results')
    assert calls(learn.simple_profile_results, 'train', 'warmup') == 1
    assert_removed(learn)

# ------------------------------------------------------------------------------------------------------ 9. CSV
def test_save_csv_round_trip_and_overwrite(tmp_path):
    target = tmp_path/'prof.csv'
    target.write_text('stale,content\n1,2\n')
    learn = prof(mk(path=tmp_path), save_csv=True, csv_name='prof.csv')
    learn.fit(1)
    df = learn.simple_profile_results
    back = pd.read_csv(target)
    assert list(back.columns) == list(df.columns)
    assert list(df.columns)[:3] == ['Phase', 'Action', 'Step'] and 'Percent of Total' in df.columns
    pd.testing.assert_frame_equal(back, df, check_dtype=False, check_exact=False, rtol=1e-12, atol=0)
    assert sorted(os.listdir(tmp_path)) == ['prof.csv']  # overwritten in place, no temp file left

    learn2 = prof(mk(path=tmp_path), save_csv=True, csv_name=Path('sub')/'dir'/'p.csv')
    learn2.fit(1)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path/'sub'/'dir'/'p.csv'), learn2.simple_profile_results,
                                  check_dtype=False, check_exact=False, rtol=1e-12, atol=0)
    assert sorted(os.listdir(tmp_path/'sub'/'dir')) == ['p.csv']

def test_save_csv_failure_keeps_results(tmp_path):
    learn = prof(mk(path=tmp_path), save_csv=True, csv_name='taken.csv')
    (tmp_path/'taken.csv').mkdir()  # the target becomes a folder after profile() checked it: the write must fail
    with pytest.raises(OSError): learn.fit(1)
    check_phase_counts(learn.simple_profile_results, 'train', N_TRN-1, 1)
    assert_removed(learn)
    assert sorted(os.listdir(tmp_path)) == ['taken.csv'] and os.listdir(tmp_path/'taken.csv') == []

# ------------------------------------------------------------------------------------------------- 10. arguments
BAD_ARGS = [(n, v) for n in ('show_report', 'plain', 'markdown', 'samples_per_second')
                   for v in ('yes', 1, 0, None)]
BAD_ARGS += [('save_csv', v) for v in ('', '  ', 1, 0, None)]  # True, False or a file name, as `save_json`
BAD_ARGS += [('csv_name', v) for v in ('', '   ', 3, None)]
BAD_ARGS += [('logger_callback', v) for v in (3, '', '  ', True)]
BAD_ARGS += [('warmup', v) for v in (-1, 1.5, True, '2', None)]
BAD_ARGS += [('keep_raw', v) for v in ('yes', 1, None)]
BAD_ARGS += [('sync', v) for v in ('fast', None, 1)]

@pytest.mark.parametrize('name,value', BAD_ARGS)
def test_profile_rejects_bad_arguments(name, value):
    if name not in PROFILE_PARAMS: pytest.skip(f'`profile` has no `{name}` parameter')
    learn = mk()
    cbs = list(learn.cbs)
    with pytest.raises(ValueError, match=f'`{name}`'): learn.profile(**{name: value})
    assert list(learn.cbs) == cbs  # nothing attached
    learn.fit(1)  # and the learner still works
    assert not hasattr(learn, 'simple_profile_results')

@pytest.mark.parametrize('kw', [dict(warmup=0), dict(warmup=0, flops=True), dict(warmup=3), dict(logger_callback=None),
                                dict(csv_name=Path('a.csv')), dict(samples_per_second=False)])
def test_profile_accepts_good_arguments(kw):
    learn = prof(mk(), **kw)
    learn.fit(1)
    df = learn.simple_profile_results
    w = kw.get('warmup', 1)
    counted = int(w == 0 and kw.get('flops', False))  # with `flops=True` the fit's first batch is counted: set apart in `trace` when it is not a warmup batch
    check_phase_counts(df, 'train', N_TRN-w-counted, w)
    if counted: assert calls(df, 'train', 'trace') == 1
    else: assert 'trace' not in set(df[df.Phase == 'train'].Step)  # FLOPs are off by default: no batch set apart
    check_phase_counts(df, 'valid', max(N_VAL-w, 0), min(w, N_VAL))
    if kw.get('samples_per_second') is False: assert df['Samples/Second'].isna().all()
    check_partition(df)

# ---------------------------------------------------------------------------------------------- 11. training loop
def _loop_lines(learn):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf): learn.show_training_loop()
    return [l.strip() for l in buf.getvalue().splitlines()]

@pytest.mark.parametrize('profiled', [False, True])
def test_show_training_loop_lists_before_draw(profiled):
    learn = mk()
    if profiled: prof(learn)
    lines = _loop_lines(learn)
    draws = [i for i, l in enumerate(lines) if l.startswith('- before_draw')]
    assert len(draws) == 1
    assert lines[draws[0]+1].startswith('- before_batch')
    assert lines[draws[0]-1] == 'Start Batch Loop'
    assert ('SimpleProfilerCallback' in lines[draws[0]]) == profiled

# ---------------------------------------------------------------------------------------------------------- misc
def _star(*mods):
    "The namespace `from m import *` builds for each of `mods`, in order"
    ns = {}
    for m in mods: exec(f'from {m} import *', ns)
    return ns

def test_star_import_of_all_brings_the_public_api():
    ns = _star('fastxtend_prof.all')
    for name in ('SimpleProfilerCallback', 'SimpleProfilerPostCallback', 'ProfileResult', 'advise', 'plot_profile', 'register_logger', 'Logger',
                 'Feature', 'register_feature'):
        assert name in ns, name
    for name in ('Recorder', 'TimingRecorder', 'Phase', 'STEP', 'stats', 'fold', 'install', 'FakeClock', 'FakeDevice', 'DATA_BOUND_SHARE',
                 'learner_advice', 'synthetic_run'):
        assert name not in ns, name  # internals stay in their modules

@pytest.mark.parametrize('ours_first', [False, True])
def test_star_import_beside_fastai_changes_no_fastai_name(ours_first):
    "The README's imports, in either order: every fastai name keeps its meaning, and none of ours is a torch name"
    fastai_mods = ('fastai.basics', 'fastai.callback.all')
    fastai_ns = _star(*fastai_mods)
    ns = _star('fastxtend_prof.all', *fastai_mods) if ours_first else _star(*fastai_mods, 'fastxtend_prof.all')
    assert [k for k, v in fastai_ns.items() if ns[k] is not v] == []
    assert not set(_star('fastxtend_prof.all')) & set(dir(torch)) - {'__builtins__'}
    exec('class MyCB(Callback): order = Recorder.order + 1', ns)  # the user code that broke when ours hid fastai's Recorder
    assert ns['MyCB'].order == ns['Recorder'].order + 1

def test_callback_attributes_keep_their_identity_during_a_fit(tmp_path):
    "The pair's state is one session object and the handlers bound to it (`_events`), set in Pre's `before_fit`; no attribute of either callback changes until the fit ends"
    from fastxtend_prof.profiler.simpleprofiler import IDLE, FitSession
    snaps = []
    class Snap(Callback):
        order = 0  # after Pre's before_fit, which opens the session
        def snap(self):
            pair = [cb for cb in self.learn.cbs if isinstance(cb, (SimpleProfilerCallback, SimpleProfilerPostCallback))]
            snaps.append([{k: id(v) for k, v in vars(cb).items() if k != 'run'} for cb in pair])  # fastai sets `run` after `after_fit`
            assert all(isinstance(cb.__dict__.get('_session'), FitSession) for cb in pair)
    for e in ('before_fit', 'before_epoch', 'before_train', 'before_draw', 'before_batch', 'after_pred', 'after_loss', 'before_backward',
              'after_backward', 'before_step', 'after_step', 'after_batch', 'after_train', 'before_validate', 'after_validate',
              'after_epoch', 'after_fit'): setattr(Snap, e, Snap.snap)
    learn = synth_learner(n_trn=4, n_val=2, path=tmp_path, cbs=Snap()).profile(show_report=False, trace=dict(wait=0, warmup=0, active=2))
    pair = [cb for cb in learn.cbs if isinstance(cb, (SimpleProfilerCallback, SimpleProfilerPostCallback))]
    with learn.no_bar(): learn.fit(2)
    assert len(snaps) > 50 and all(s == snaps[0] for s in snaps)
    assert all(cb._session is IDLE and '_events' not in vars(cb) for cb in pair) and SimpleProfilerCallback._stateattrs == ('_session', '_events')
    assert type(learn.profile_result.recorder).__name__ == 'TimingRecorder' and learn.profile_result.trace['batches'] == [0, 1]
