"""Several fits in one call: `learn.profiling()` reports `fine_tune`'s frozen and unfrozen fits as one profile; the
one-fit default says under its report when the next fit ran unprofiled; a fit that fails inside the block still reports."""
import pytest
from fastai.callback.core import Callback
from fastai.callback.schedule import *  # noqa: F401,F403  (fine_tune)
from fastai.test_utils import synth_learner
import fastxtend_prof.all  # noqa: F401  (Learner.profile, Learner.profiling)
from fastxtend_prof.profiler.simpleprofiler import SimpleProfilerCallback, SimpleProfilerPostCallback
from conftest import calls

N_TRN = 4

def attached(learn): return [cb for cb in learn.cbs if isinstance(cb, (SimpleProfilerCallback, SimpleProfilerPostCallback))]

def test_profiling_reports_the_whole_fine_tune():
    learn = synth_learner(n_trn=N_TRN)
    with learn.no_logging(), learn.profiling(show_report=False): learn.fine_tune(2, freeze_epochs=1)
    res = learn.simple_profile_results
    assert calls(res, 'fit', 'fit') == 2 and calls(res, 'fit', 'epoch') == 3  # the frozen epoch and the two unfrozen ones
    assert calls(res, 'train', 'batch') == 3*(N_TRN - 1)  # every epoch's train batches but its warmup one
    assert '2 fits' in learn.profile_result.title and attached(learn) == []

def test_one_fit_default_says_when_the_next_fit_ran_unprofiled(capsys):
    learn = synth_learner(n_trn=N_TRN).profile(plain=True)
    with learn.no_logging(): learn.fine_tune(2, freeze_epochs=1)
    out = capsys.readouterr().out
    assert calls(learn.simple_profile_results, 'fit', 'epoch') == 1  # the frozen fit only
    assert 'this fit is not profiled' in out and 'learn.profiling()' in out
    assert learn.profile_result.title.endswith('a later fit ran unprofiled')

def test_separate_fits_later_are_not_flagged(capsys, monkeypatch):
    from fastxtend_prof.profiler import simpleprofiler
    monkeypatch.setattr(simpleprofiler, '_SOON_S', 0.0)  # the next fit comes "later", as a new cell would
    learn = synth_learner(n_trn=N_TRN).profile(show_report=False)
    with learn.no_logging(): learn.fit(1); learn.fit(1)
    assert 'not profiled' not in capsys.readouterr().out and not learn.profile_result.title.endswith('unprofiled')

class Boom(Callback):
    def __init__(self): self.fits = 0
    def before_fit(self): self.fits += 1
    def after_batch(self):
        if self.fits == 2 and self.training and self.iter == 2: raise RuntimeError('boom')

def test_a_failing_fit_inside_profiling_reports_what_was_recorded():
    learn = synth_learner(n_trn=N_TRN, cbs=Boom())
    with pytest.raises(RuntimeError, match='boom'), learn.no_logging(), learn.profiling(show_report=False):
        learn.fit(1); learn.fit(1)
    assert calls(learn.simple_profile_results, 'fit', 'fit') == 2 and 'partial' in learn.profile_result.title
    assert attached(learn) == []

def test_get_preds_inside_the_fits_of_profiling_is_not_recorded():
    class Preds(Callback):
        def after_train(self): self.learn.get_preds()
    learn = synth_learner(n_trn=N_TRN, n_val=2, cbs=Preds())
    with learn.no_logging(), learn.profiling(show_report=False): learn.fit(1); learn.fit(1)
    res = learn.simple_profile_results
    assert calls(res, 'fit', 'fit') == 2 and calls(res, 'valid', 'draw') == 2*(2 - 1)  # the fits' own valid loops, warmup apart
