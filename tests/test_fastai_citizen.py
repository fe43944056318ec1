"""The profiler follows fastai's conventions: the pair passed to one fit (`fit(cbs=...)`, `fit_one_cycle(cbs=...)`), a profiler
re-armed from `after_fit`, function-style `before_draw` listeners, fastai's own loop whenever nothing records, and warnings
shown as often as without the profiler."""
import os, re, subprocess, sys, textwrap
import pytest
from fastai.callback.core import Callback
from fastai.callback.schedule import *  # noqa: F401,F403  (fit_one_cycle)
from fastai.learner import Learner
from fastai.test_utils import synth_learner
import fastxtend_prof.all  # noqa: F401  (Learner.profile)
from fastxtend_prof.core import events
from fastxtend_prof.profiler.simpleprofiler import SimpleProfilerCallback, SimpleProfilerPostCallback, IDLE
from conftest import calls

PAIR = (SimpleProfilerCallback, SimpleProfilerPostCallback)
N_TRN, N_VAL = 4, 2  # batches of 16 in synth_learner

def attached(learn): return [cb for cb in learn.cbs if isinstance(cb, PAIR)]

@pytest.mark.parametrize('how', ['fit', 'fit_one_cycle'])
def test_pair_passed_to_one_fit_reports_and_leaves(how):
    learn = synth_learner(n_trn=N_TRN, n_val=N_VAL)
    pair = [SimpleProfilerCallback(show_report=False), SimpleProfilerPostCallback()]
    with learn.no_logging(): getattr(learn, how)(1, cbs=pair)
    assert calls(learn.simple_profile_results, 'train', 'batch') == N_TRN - 1  # the first is the warmup
    assert attached(learn) == [] and learn not in events._WATCH
    assert all(cb._session is IDLE for cb in pair)

def test_profiler_rearmed_in_after_fit_reports_every_fit():
    class Rearm(Callback):
        def after_fit(self): self.learn.profile(show_report=False)
    learn = synth_learner(n_trn=N_TRN, n_val=N_VAL, cbs=Rearm()).profile(show_report=False)
    results = []
    for _ in range(3):
        with learn.no_logging(): learn.fit(1)
        results.append(learn.profile_result)
        assert len(attached(learn)) == 2  # re-armed for the next fit
    assert len({id(r) for r in results}) == 3
    assert all(calls(r.results, 'train', 'batch') == N_TRN - 1 for r in results)

def test_function_style_before_draw_is_called_like_a_subclass():
    n = []
    class Counter(Callback):
        def __init__(self): self.k = 0
        def before_draw(self): self.k += 1
    fn, sub = synth_learner(n_trn=N_TRN, n_val=N_VAL, cbs=Callback(before_draw=lambda self: n.append(1))), synth_learner(n_trn=N_TRN, n_val=N_VAL, cbs=Counter())
    for learn in (fn, sub):
        with learn.no_logging(): learn.fit(1)
    assert len(n) == sub.counter.k == (N_TRN + 1) + (N_VAL + 1)  # each batch's draw and the one that finds the loader empty

class EventLog(Callback):
    "Logs every event fastai dispatches (it implements none, so it never asks for `before_draw`)"
    def __init__(self): self.log = []
    def __call__(self, name):
        self.log.append(name)
        return super().__call__(name)

@pytest.mark.parametrize('call', ['validate', 'get_preds'])
def test_attached_but_not_recording_runs_fastais_own_loop(call, monkeypatch):
    learn = synth_learner(n_trn=N_TRN, n_val=N_VAL, cbs=EventLog()).profile(show_report=False)
    own = []
    orig = Learner.__dict__['_fxp_originals']['all_batches']
    monkeypatch.setitem(Learner.__dict__['_fxp_originals'], 'all_batches', lambda self: own.append(1) or orig(self))
    getattr(learn, call)()
    assert own == [1]  # fastai's all_batches ran, not the loop that draws itself
    assert 'before_draw' not in learn.event_log.log and 'before_batch' in learn.event_log.log
    assert len(attached(learn)) == 2 and not hasattr(learn, 'simple_profile_results')  # still waiting for the fit
    with learn.no_logging(): learn.fit(1)
    assert learn.event_log.log.count('before_draw') == (N_TRN + 1) + (N_VAL + 1)  # a recording fit does get it

WARN_SCRIPT = textwrap.dedent('''
    import sys
    from fastai.test_utils import synth_learner
    from fastai.callback.core import Callback
    import fastxtend_prof.all
    class Shadow(Callback):
        def after_fit(self): self.n_epoch = 0   # fastai warns: "You are shadowing an attribute (n_epoch) that exists in the learner"
    for _ in range(3):
        learn = synth_learner(n_trn=4, cbs=Shadow())
        if sys.argv[1] == 'profiled': learn.profile(show_report=True, plain=True, logger_callback=None)
        with learn.no_logging(): learn.fit(1)
''')

def test_a_profiled_fit_shows_fastais_warnings_as_often_as_a_plain_one(tmp_path):
    "Python shows a warning once per place by default; building the report must not reset that memory"
    script = tmp_path/'warn.py'
    script.write_text(WARN_SCRIPT)
    count = lambda how: subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, check=True,
                                       cwd=tmp_path).stderr.count('You are shadowing an attribute')
    plain, profiled = count('plain'), count('profiled')
    assert plain > 0 and profiled == plain

TRACEBACK_SCRIPT = textwrap.dedent('''
    import sys
    from fastai.basics import *
    from fastai.test_utils import synth_learner
    if sys.argv[1] != 'fastai': from fastxtend_prof.all import *
    class Bad(nn.Module):
        def __init__(self): super().__init__(); self.a = nn.Parameter(torch.zeros(1))
        def forward(self, x): raise ValueError('the model failed')
    learn = synth_learner(n_trn=4)
    if sys.argv[1] == 'after-profiled':  # a profiled fit first: its note on an unprofiled next fit is pending
        with learn.no_logging(): learn.profile(show_report=False).fit(1)
    if sys.argv[1] == 'profiled': learn.profile(show_report=False)
    learn.model = Bad()
    with learn.no_logging(): learn.fit(1)
''')

def traceback_frames(tmp_path, *hows):
    """For each of `hows`, `(file, function)` of every frame in the traceback that plain python prints when the script's fit
    fails. The scripts run at once, each in its own process: one after the other they took 57-79 s of a loaded CI run"""
    script = tmp_path/'tb.py'
    script.write_text(TRACEBACK_SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path) for how in hows]
    frames = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 1 and 'ValueError: the model failed' in err, err
        frames.append(re.findall(r'^  File "(.+)", line \d+, in (\S+)$', err, re.M))
    return frames

def test_an_unprofiled_failing_fit_shows_fastais_traceback(tmp_path):
    "Importing the package changes no frame of a fit that nothing profiles: the traceback is fastai's own"
    fastai_only, unprofiled, after_profiled, profiled = traceback_frames(tmp_path, 'fastai', 'unprofiled', 'after-profiled', 'profiled')
    assert ('fit', 'all_batches', 'forward') == tuple(n for _, n in fastai_only if n in ('fit', 'all_batches', 'forward'))
    assert unprofiled == fastai_only and after_profiled == fastai_only
    ours = [(os.path.basename(f), n) for f, n in profiled if 'fastxtend_prof' in f]
    assert ours == [('events.py', 'all_batches_with_draw')]  # a profiled fit runs the loop that emits before_draw

class FailAt(Callback):
    "Raises in `after_loss` of the train batch `at`"
    def __init__(self, at): self.at = at
    def after_loss(self):
        if self.training and self.iter == self.at: raise RuntimeError('failed at a batch')

def test_a_fit_that_enters_no_added_cbs_is_watched_by_a_wrapper():
    "With a `Learner.fit` that does not run in `added_cbs`, the watch wraps `fit`: a fit that dies still ends its profile"
    fastai_fit = Learner.fit
    def fit(self, *args, **kwargs): return fastai_fit(self, *args, **kwargs)  # another library's wrapper, without `functools.wraps`
    events.uninstall()
    Learner.fit = fit
    try:
        events.install()
        assert Learner.fit.__wrapped__ is fit and Learner.added_cbs is events._orig('added_cbs')
        learn = synth_learner(n_trn=N_TRN, n_val=N_VAL, cbs=FailAt(2)).profile(show_report=False)
        with pytest.raises(RuntimeError, match='failed at a batch'), learn.no_bar(): learn.fit(1)
        assert 'partial: the fit stopped with RuntimeError' in learn.profile_result.title
        assert calls(learn.simple_profile_results, 'train', 'batch') == 2  # batch 0 is the warmup; batch 2 counts up to its failure
        assert attached(learn) == [] and learn not in events._WATCH
    finally:
        events.uninstall()
        Learner.fit = fastai_fit
        events.install()
    assert Learner.fit is fastai_fit
