"""Loggers: the registry and hub through real profiled fits, wandb (offline and disabled) and TensorBoard with the real
packages, read back from what they wrote."""
import inspect, json, os, struct, time
from pathlib import Path
import numpy as np, pytest
from fastai.learner import Learner
from fastai.callback.core import Callback
from fastai.test_utils import synth_learner
from fastai.callback.progress import *  # noqa: F401,F403  (learn.no_bar)
from fastai.callback.schedule import *  # noqa: F401,F403  (learn.lr_find)
from fastxtend_prof.core.recorder import Phase, BEFORE_DRAW, BEFORE_BATCH, AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, POST_AFTER_BATCH, SAMPLES, FLAGS, NO_STEP
from fastxtend_prof.core.saved import RESULT_COLS
from fastxtend_prof.features.flops import FLOP_COLS
from fastxtend_prof.features.live import LIVE_KEYS
from fastxtend_prof.features.loggers import (KNOWN_LOGGERS, Logger, LoggerHub, register_logger, check_logger_callback,
                                    fastai_wandb_bug_4173)
import fastxtend_prof.features.loggers as loggers
import fastxtend_prof.profiler.simpleprofiler  # noqa: F401  (adds Learner.profile)

EPOCHS, N_TRAIN = 2, 10  # synth_learner: 10 train batches of 16 an epoch, 2 valid


def profiled(learn, logger_callback='auto', log_every=10):
    return learn.profile(show_report=False, logger_callback=logger_callback, log_every=log_every)

def fit(learn, n=EPOCHS):
    with learn.no_bar(): learn.fit(n)


class ProbeCallback(Callback):
    "A fastai callback for a test logger to pair with (`learn.probe`); `stand_aside` makes it skip the fit"
    def __init__(self, stand_aside=False): self.stand_aside = stand_aside
    def before_fit(self):
        if self.stand_aside: self.run = False

class Probe(Logger):
    "Records every call with what it was given"
    instances = []
    def __init__(self, cb):
        super().__init__(cb)
        self.live_calls, self.fit_calls = [], []
        Probe.instances.append(self)
    def live(self, learn, values): self.live_calls.append((learn.train_iter, values))
    def after_fit(self, learn, results, report): self.fit_calls.append((results, report))

@pytest.fixture
def probe():
    Probe.instances.clear()
    register_logger('probe', Probe)
    yield
    KNOWN_LOGGERS.pop('probe', None)


def expected_window(m, end, n, starts, warmup=1):
    "Independent recomputation of the live values for train batches `end-n..end-1` of the recorded matrix `m`"
    idx = np.arange(end - n, end)
    run_start = np.array([max(s for s in starts if s <= i) for i in idx])
    rows = m[idx[idx - run_start >= warmup]]
    spans = dict(draw=(BEFORE_DRAW, BEFORE_BATCH), batch=(BEFORE_BATCH, POST_AFTER_BATCH), forward=(BEFORE_BATCH, AFTER_PRED), loss=(AFTER_PRED, AFTER_LOSS),
                 backward=(BEFORE_BACKWARD, BEFORE_STEP), opt_step=(BEFORE_STEP, AFTER_STEP))
    out = {}
    for s, (a, b) in spans.items():
        ok = ~np.isnan(rows[:, a]) & ~np.isnan(rows[:, b])
        if s == 'opt_step': ok &= (rows[:, FLAGS].astype(int) & NO_STEP) == 0
        d = rows[ok, b] - rows[ok, a]
        out[f'duration/train_{s}'] = d.mean()
        out[f'samples_per_second/train_{s}'] = rows[ok, SAMPLES].sum()/d.sum()
    return out


def test_custom_logger_gets_both_hooks_with_the_right_values(probe):
    learn = profiled(synth_learner(cbs=ProbeCallback()), 'probe', log_every=3)
    fit(learn)
    (p,) = Probe.instances
    assert p.cb is learn.probe
    assert [t for t, _ in p.live_calls] == [3, 6, 9, 12, 15, 18]        # every 3 train batches of 20
    rec = learn.profile_result.recorder
    m, starts = rec.tables[Phase.TRAIN].matrix(), [r[0] for r in rec.tables[Phase.TRAIN].runs]
    assert starts == [0, N_TRAIN]
    for t, values in p.live_calls:
        assert set(values) == set(LIVE_KEYS)
        exp = expected_window(m, t, 3, starts)
        assert values == pytest.approx(exp, rel=1e-12)
    assert len(p.fit_calls) == 1
    results, report = p.fit_calls[0]
    assert results is learn.simple_profile_results and report is learn.simple_profile_report


def test_auto_picks_attached_callbacks_only(probe):
    learn = synth_learner()
    assert LoggerHub.create(learn, 'auto') is None                      # nothing attached: no hub, nothing per batch
    assert LoggerHub.create(learn, 'wandb') is None                     # the reference's default, without WandbCallback
    assert LoggerHub.create(learn, ['tensorboard', 'probe']) is None
    learn.add_cb(ProbeCallback())
    assert LoggerHub.create(learn, 'auto').names == ['probe']
    assert LoggerHub.create(learn, None) is None


def test_nothing_is_logged_on_nonzero_rank(probe, monkeypatch):
    learn = synth_learner(cbs=ProbeCallback())
    monkeypatch.setenv('RANK', '1')
    assert LoggerHub.create(learn, 'auto') is None
    profiled(learn, 'probe', log_every=2)
    fit(learn, 1)
    assert Probe.instances == []


def test_callback_standing_aside_gets_no_live_values(probe):
    learn = profiled(synth_learner(cbs=ProbeCallback(stand_aside=True)), 'probe', log_every=2)
    fit(learn, 1)
    (p,) = Probe.instances
    assert p.live_calls == []


def test_lr_find_validate_get_preds_log_nothing(probe):
    learn = profiled(synth_learner(cbs=ProbeCallback()), 'probe', log_every=1)
    with learn.no_bar():
        learn.lr_find(num_it=4, show_plot=False)
        learn.validate(); learn.get_preds()
    assert Probe.instances == []
    fit(learn, 1)
    assert len(Probe.instances[0].live_calls) == N_TRAIN - 1            # the first batch is warmup: nothing to log


def test_failing_logger_warns_once_and_training_goes_on(probe):
    class Broken(Probe):
        def live(self, learn, values):
            super().live(learn, values)
            raise RuntimeError('dashboard down')
    register_logger('probe', Broken)
    learn = profiled(synth_learner(cbs=ProbeCallback()), 'probe', log_every=2)
    with pytest.warns(UserWarning, match='dashboard down'): fit(learn)
    assert len(Probe.instances[0].live_calls) == 1                      # switched off after the first failure
    assert Probe.instances[0].fit_calls == []
    assert len(learn.simple_profile_results)


def test_unknown_names_fail_listing_the_known_ones(probe):
    with pytest.raises(ValueError, match=r"unknown logger 'wandbb'.*'wandb', 'tensorboard', 'probe'"): check_logger_callback('wandbb')
    with pytest.raises(ValueError, match='logger_callback'): check_logger_callback(3)
    with pytest.raises(ValueError, match='log_every'): LoggerHub.create(synth_learner(), 'auto', log_every=0)
    assert check_logger_callback(('probe', 'wandb')) == ('probe', 'wandb')


# ---- wandb, the real package, offline --------------------------------------------------------------------------------

def read_wandb(path, timeout=20.):
    "`({step: {key: value}}, summary)` from an offline run's `.wandb` file, once its `exit` record is written"
    deadline = time.monotonic() + timeout
    from google.protobuf.message import DecodeError
    while True:  # wandb.finish() can return before wandb-core has written the whole file
        try: history, summary, done = _read_wandb(path)
        except DecodeError:  # caught a record half-written: read again
            if time.monotonic() > deadline: raise
            history, summary, done = {}, {}, False
        if done or time.monotonic() > deadline: return history, summary
        time.sleep(0.1)

def _read_wandb(path):
    "History, summary and whether the run's `exit` record is there, from a `.wandb` file (a leveldb-style log of protobuf records)"
    from wandb.proto import wandb_internal_pb2 as pb
    data, block, pos, chunks = Path(path).read_bytes(), 32768, 7, []
    assert data[:4] == b':W&B', 'not a wandb run file'
    history, summary, done = {}, {}, False
    key = lambda item: item.key or '/'.join(item.nested_key)
    while pos + 7 <= len(data):
        if block - pos % block < 7: pos += block - pos % block; continue  # a block's zero-padded tail
        _, n, kind = struct.unpack('<IHB', data[pos:pos+7])
        if n == 0 and kind == 0: break
        chunks.append(data[pos+7:pos+7+n]); pos += 7 + n
        if kind not in (1, 4): continue  # FIRST/MIDDLE chunk of a record that goes on in the next block
        r = pb.Record(); r.ParseFromString(b''.join(chunks)); chunks = []
        if r.HasField('history'):
            history.setdefault(r.history.step.num, {}).update({key(i): json.loads(i.value_json) for i in r.history.item})
        elif r.HasField('summary'):
            summary.update({key(i): json.loads(i.value_json) for i in r.summary.update})
        elif r.HasField('exit'): done = True
    return history, summary, done


def wandb_env(monkeypatch, tmp_path, mode):
    "wandb configured by the environment (`WANDB_MODE`, `WANDB_DIR`) for one test"
    wandb = pytest.importorskip('wandb')
    wandb.teardown()  # wandb reads the environment once per process: forget an earlier test's settings
    for k, v in dict(WANDB_MODE=mode, WANDB_DIR=str(tmp_path), WANDB_SILENT='true', WANDB_CONSOLE='off').items(): monkeypatch.setenv(k, v)
    return wandb

@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    wandb = wandb_env(monkeypatch, tmp_path, 'offline')
    yield wandb
    if wandb.run is not None: wandb.finish()
    wandb.teardown()


def run_wandb_fit(wandb, log_every=5, via_profile=False, flops=False, stages=False):
    from fastai.callback.wandb import WandbCallback
    run = wandb.init(project='fastxtend-prof-tests')
    run_dir = Path(run.dir).parent
    assert run.settings.mode == 'offline' and Path(os.environ['WANDB_DIR']) in run_dir.parents
    learn = synth_learner(cbs=WandbCallback(log_preds=False))
    if via_profile: learn.profile(show_report=False, logger_callback='wandb', log_every=log_every, flops=flops, stages=stages)
    else: profiled(learn, 'wandb', log_every=log_every)
    with learn.no_bar():
        learn.lr_find(num_it=4, show_plot=False)  # nothing may be logged for these
        learn.get_preds()
        learn.fit(EPOCHS)
    wandb.finish()
    return learn, run_dir


def check_wandb_run(learn, run_dir, log_every=5, flops=False, stages=False):
    "What the offline run holds; `flops`: the fit counted FLOPs (`flops=True`, off by default), whose columns reach the table and summary; `stages`: the loader's stages, a table of their own"
    history, summary = read_wandb(next(run_dir.glob('run-*.wandb')))
    live = {s: row for s, row in history.items() if any(k.startswith('samples_per_second/train_') for k in row)}
    n = EPOCHS*N_TRAIN
    # WandbCallback's step of the k-th train batch of the fit is k-1: the profile's values share its rows
    assert sorted(live) == list(range(log_every-1, n, log_every))
    for row in live.values():
        assert set(LIVE_KEYS) <= set(row) and 'train_loss' in row
        assert all(v > 0 for k, v in row.items() if k in LIVE_KEYS)
    tables = {p.name.split('_')[2] for p in (run_dir/'files'/'media'/'table').glob('simple_profile_*.table.json')}
    assert tables == {'report', 'results', *(['stages'] if stages else [])}
    if stages:
        t = json.loads(next((run_dir/'files'/'media'/'table').glob('simple_profile_stages_*.table.json')).read_text())
        payload = learn.profile_result.payload('stages')
        assert t['columns'] == list(payload.columns) and len(t['data']) == len(payload) and {'collate', 'item'} <= {r[1] for r in t['data']}
    res_file = next((run_dir/'files'/'media'/'table').glob('simple_profile_results_*.table.json'))
    t = json.loads(res_file.read_text())
    assert t['columns'] == [*RESULT_COLS, *(FLOP_COLS if flops else ())] and len(t['data']) == len(learn.simple_profile_results)
    r = learn.simple_profile_results.set_index(['Phase', 'Step'])
    assert summary['profile/train/forward_mean_s'] == pytest.approx(r.loc[('train', 'forward'), 'Mean Duration'])
    assert summary['profile/train/batch_samples_per_s'] == pytest.approx(r.loc[('train', 'batch'), 'Samples/Second'])
    assert summary['profile/fit/fit_mean_s'] == pytest.approx(r.loc[('fit', 'fit'), 'Mean Duration'])
    if flops: assert summary['profile/train/forward_flops'] == r.loc[('train', 'forward'), 'FLOPs']  # 0: synth_learner's model runs no matmul
    else: assert not any(k.endswith(('_flops', '_mfu')) for k in summary)  # FLOPs are off by default: no FLOP column, no FLOP summary


def test_wandb_offline_history_tables_and_summary(wandb_offline):
    learn, run_dir = run_wandb_fit(wandb_offline)
    check_wandb_run(learn, run_dir)


def test_wandb_disabled(tmp_path, monkeypatch):
    wandb = wandb_env(monkeypatch, tmp_path, 'disabled')
    from fastai.callback.wandb import WandbCallback
    run = wandb.init(project='fastxtend-prof-tests')
    try:
        assert run.settings.mode == 'disabled'
        learn = profiled(synth_learner(cbs=WandbCallback(log_preds=False)), 'auto', log_every=2)
        fit(learn, 1)
    finally:
        wandb.finish(); wandb.teardown()
    assert len(learn.simple_profile_results) and not (tmp_path/'wandb').exists()


def test_fastai_4173_fix_only_where_the_bug_is():
    pytest.importorskip('wandb')
    import fastai.callback.wandb as fw
    loggers.fix_fastai_wandb()
    fn = fw._format_config_value
    if getattr(fn, '_fxp_4173', False):  # patched: fastai's own function must really have the bug
        with pytest.raises(TypeError, match='__dict__'): fn.__wrapped__(True)
    assert not fastai_wandb_bug_4173()
    cfg = synth_learner().gather_args()
    fw._format_config(cfg)  # what WandbCallback.before_fit does: no TypeError


# ---- TensorBoard, the real package ------------------------------------------------------------------------------------

def read_tensorboard(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(log_dir), size_guidance={'scalars': 0, 'tensors': 0})
    ea.Reload()
    return ea


def run_tb_fit(log_dir, log_every=5, via_profile=False, flops=False, stages=False):
    pytest.importorskip('tensorboard')
    from fastai.callback.tensorboard import TensorBoardCallback
    learn = synth_learner(cbs=TensorBoardCallback(log_dir=str(log_dir), trace_model=False, log_preds=False))
    if via_profile: learn.profile(show_report=False, logger_callback='tensorboard', log_every=log_every, flops=flops, stages=stages)
    else: profiled(learn, 'auto', log_every=log_every)
    fit(learn)
    return learn


def check_tb_run(learn, log_dir, log_every=5, flops=False, stages=False):
    "What TensorBoard holds; `flops`: the fit counted FLOPs (`flops=True`, off by default), whose block is a text of its own"
    ea = read_tensorboard(log_dir)
    tags = ea.Tags()
    assert set(LIVE_KEYS) <= set(tags['scalars'])
    steps = [e.step for e in ea.Scalars('samples_per_second/train_batch')]
    assert steps == list(range(log_every, EPOCHS*N_TRAIN+1, log_every))   # learn.train_iter, TensorBoardCallback's step
    assert set(steps) <= {e.step for e in ea.Scalars('train_loss')}
    (text,) = ea.Tensors('simple_profile_report/text_summary')
    md = text.tensor_proto.string_val[0].decode()
    assert 'Simple Profiler report' in md and '| train | loop | iteration |' in md and '|  | draw |' in md and 'forward' in md
    if flops:
        (text,) = ea.Tensors('simple_profile_flops/text_summary')  # the FLOPs block: synth_learner's model runs no matmul
        assert 'FLOPs: none counted' in text.tensor_proto.string_val[0].decode()  # one line, saying why
    if stages:
        (text,) = ea.Tensors('simple_profile_stages/text_summary')  # the loader's stages, a text of their own
        assert 'Loader stages (train' in text.tensor_proto.string_val[0].decode()
    else:  # FLOPs are off by default; on a CPU memory is not tracked: the report is the only text
        assert [t for t in tags['tensors'] if t.startswith('simple_profile_')] == ['simple_profile_report/text_summary']


def test_tensorboard_scalars_and_text(tmp_path):
    learn = run_tb_fit(tmp_path)
    check_tb_run(learn, tmp_path)


# ---- through Learner.profile, once the callbacks drive the hub ---------------------------------------------------------


def test_profile_rejects_unknown_logger_at_the_call():
    with pytest.raises(ValueError, match=r"unknown logger 'nope'.*'wandb', 'tensorboard'"):
        synth_learner().profile(logger_callback='nope')

def test_profile_defaults_to_auto_and_takes_lists():
    ps = inspect.signature(Learner.profile).parameters
    assert ps['logger_callback'].default == 'auto' and ps['log_every'].default == 10
    synth_learner().profile(logger_callback=['wandb', 'tensorboard'])
    synth_learner().profile(logger_callback='wandb')
    synth_learner().profile(logger_callback=None)

def test_profile_custom_logger(probe):
    learn = synth_learner(cbs=ProbeCallback()).profile(show_report=False, logger_callback='probe', log_every=4)
    fit(learn)
    (p,) = Probe.instances
    assert [t for t, _ in p.live_calls] == [4, 8, 12, 16, 20] and len(p.fit_calls) == 1
    assert p.fit_calls[0][0] is learn.simple_profile_results

def test_profile_auto_with_no_logger_holds_no_hub():
    learn = synth_learner().profile(show_report=False)
    hubs = []
    orig = LoggerHub.create.__func__
    LoggerHub.create = classmethod(lambda cls, *a, **k: hubs.append(orig(cls, *a, **k)) or hubs[-1])
    try: fit(learn, 1)
    finally: LoggerHub.create = classmethod(orig)
    assert hubs == [None]

def test_profile_wandb_offline(wandb_offline):
    learn, run_dir = run_wandb_fit(wandb_offline, via_profile=True, flops=True, stages=True)
    check_wandb_run(learn, run_dir, flops=True, stages=True)

def test_profile_tensorboard(tmp_path):
    learn = run_tb_fit(tmp_path, via_profile=True, flops=True, stages=True)
    check_tb_run(learn, tmp_path, flops=True, stages=True)


def test_live_values_with_folded_rows():
    "With `keep_raw=False` the recorder folds its rows away every `chunk` batches: the window holds what is still buffered"
    from fastxtend_prof.core.recorder import TimingRecorder, Step, PRE_AFTER_BATCH
    from fastxtend_prof.profiler.testing import FakeClock
    from fastxtend_prof.features.live import live_values, train_window
    if 'keep_raw' not in inspect.signature(TimingRecorder).parameters: pytest.skip('this recorder keeps every row')
    raw, lean = TimingRecorder(warmup=1, clock=FakeClock(step=0.5)), TimingRecorder(warmup=1, clock=FakeClock(step=0.5), keep_raw=False, chunk=4)
    for r in (raw, lean): r.start(Step.FIT); r.start(Step.EPOCH); r.begin_phase(Phase.TRAIN)
    sizes = []
    for i in range(11):
        for r in (raw, lean):
            r.draw(); r.start_batch()
            for slot in (AFTER_PRED, AFTER_LOSS, BEFORE_BACKWARD, BEFORE_STEP, AFTER_STEP, PRE_AFTER_BATCH): r.mark(slot)
            r.end_batch(8 + i)
        k = len(train_window(lean, 3)[0])
        sizes.append(k)
        assert live_values(lean, 3) == live_values(raw, k)
    assert min(sizes) < 3 and max(sizes) == 3  # some windows were cut short by a fold

def test_a_logger_asked_for_by_name_but_not_attached_warns_once():
    learn = synth_learner(n_trn=4).profile(show_report=False, logger_callback='tensorboard')
    with pytest.warns(UserWarning, match="logger_callback='tensorboard': no `tensor_board` callback") as ws, learn.no_bar(): learn.fit(1)
    assert sum('logger_callback=' in str(w.message) for w in ws) == 1
    assert learn.simple_profile_results is not None  # the profile itself is unaffected
