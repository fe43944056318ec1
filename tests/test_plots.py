"""Plots: the breakdown bars and the per-batch timeline drawn from a real profiled fit, checked through the artists' data."""
import time
import numpy as np, pytest
from fastai.test_utils import synth_learner
from fastai.callback.core import Callback, CancelStepException
from fastai.callback.progress import *  # noqa: F403  (`learn.no_bar()`)
import fastxtend_prof.profiler.simpleprofiler  # noqa: F401  (adds Learner.profile)
from fastxtend_prof.core.recorder import Phase
from fastxtend_prof.verdicts.plots import timeline_frame, plot_profile, plot_timeline, save_plots, SEGMENTS, BETWEEN, DRAW_PARTS, segment_names, LEGEND_MIN_SHARE
from matplotlib.patches import StepPatch
import matplotlib.pyplot as plt

EPOCHS, N_TRAIN, N_VALID = 2, 10, 2  # synth_learner: 160 train, 32 valid samples, batches of 16

def profiled(warmup=1, cbs=()):
    learn = synth_learner(cbs=list(cbs)).profile(show_report=False, warmup=warmup)
    with learn.no_bar(), learn.no_logging(): learn.fit(EPOCHS, 1e-2)
    return learn

@pytest.fixture(scope='module')
def learn(): return profiled()

def totals(learn):
    r = learn.simple_profile_results
    return {(p, s): t for p, s, t in zip(r.Phase, r.Step, r['Total Time'])}

def bar_widths(fig):
    return {p.get_gid(): p.get_width() for p in fig.axes[0].patches if p.get_gid()}

def test_breakdown_bars_are_the_results(learn):
    fig, t = learn.plot_profile(), totals(learn)
    ax, w = fig.axes[0], bar_widths(fig)
    for phase in ('train', 'valid'):
        segs = segment_names({s: v for (p, s), v in t.items() if p == phase}, phase)
        assert segs[:3] == list(DRAW_PARTS)  # a split draw: its parts in place of `draw`
        assert sum(w[f'{phase}:{s}'] for s in DRAW_PARTS) == pytest.approx(t[(phase, 'draw')], abs=1e-12)
        assert [g for g in w if g.startswith(phase + ':')] == [f'{phase}:{s}' for s in segs]
        for s in segs:
            if s != BETWEEN: assert w[f'{phase}:{s}'] == pytest.approx(t[(phase, s)], abs=1e-12)
        subs = sum(t[(phase, s)] for s in segs if s in ('forward', 'predict', 'loss', 'backward', 'opt_step', 'zero_grad'))
        assert w[f'{phase}:{BETWEEN}'] == pytest.approx(max(t[(phase, 'batch')] - subs, 0), abs=1e-12)
        assert w[f'{phase}:{BETWEEN}'] >= 0
        # the bar is the whole phase: its segments add up to the phase's span in the report
        assert sum(v for g, v in w.items() if g.startswith(phase + ':')) == pytest.approx(t[('fit', phase)], abs=1e-9)
    # segments follow each other without gaps or overlaps
    train = [p for p in ax.patches if (p.get_gid() or '').startswith('train:')]
    assert all(a.get_x() + a.get_width() == pytest.approx(b.get_x(), abs=1e-15) for a, b in zip(train, train[1:]))
    # percentage labels: of the phase, each inside its own segment as drawn
    texts = {x.get_text() for x in ax.texts}
    fig.draw_without_rendering()
    patches = {p.get_gid(): p.get_window_extent() for p in ax.patches if p.get_gid()}
    labels = [(patches[x.get_gid()], x.get_window_extent()) for x in ax.texts if x.get_gid() in patches]
    assert labels and all(seg.x0 < lab.x0 and lab.x1 < seg.x1 for seg, lab in labels)
    big = max((s for s in DRAW_PARTS + SEGMENTS[Phase.TRAIN][1:]), key=lambda s: w[f'train:{s}'])
    assert f"{100*w[f'train:{big}']/t[('fit', 'train')]:.0f}%" in texts
    # the legend: what can be seen (at least 1% of a bar), in the bars' order; the note under it names the rest
    share = {}
    for g, v in w.items(): share[g.split(':')[1]] = max(share.get(g.split(':')[1], 0), v/t[('fit', g.split(':')[0])])
    segs = list(dict.fromkeys(g.split(':')[1] for g in w))
    assert segs == [*DRAW_PARTS, 'forward', 'loss', 'backward', 'opt_step', 'zero_grad', BETWEEN, 'other', 'last_draw', 'warmup', 'predict']
    legend = [x.get_text() for x in ax.get_legend().get_texts()]
    assert legend == [s for s in segs if share[s] >= LEGEND_MIN_SHARE]
    small = [s for s in segs if share[s] < LEGEND_MIN_SHARE]
    note = next(x.get_text() for x in ax.texts if x.get_gid() == 'note')
    assert note.endswith(f"every bar: {', '.join(small)}") if small else 'not in the legend' not in note
    assert [x.get_text() for x in ax.get_yticklabels()] == ['train', 'valid']

def test_timeline_series_are_the_batches(learn):
    tl = timeline_frame(learn.profile_result.recorder)
    train = tl[tl.phase == 'train'].reset_index(drop=True)
    assert len(train) == EPOCHS*N_TRAIN and (tl.phase == 'valid').sum() == EPOCHS*N_VALID
    fig = learn.plot_profile_timeline()
    ax = fig.axes[0]
    series = [a for a in ax.patches if isinstance(a, StepPatch)]
    assert [a.get_gid() for a in series] == [s for s in SEGMENTS[Phase.TRAIN] if s not in ('warmup', 'last_draw')]  # per batch: no loop's last draw
    bottom = np.zeros(len(train))
    for a in series:
        d = a.get_data()
        assert len(d.values) == len(train) and np.array_equal(d.edges, np.arange(len(train) + 1))
        np.testing.assert_allclose(d.baseline, bottom, atol=1e-15)  # stacked on the previous step
        if a.get_gid() != BETWEEN: np.testing.assert_allclose(d.values - bottom, train[a.get_gid()].fillna(0), atol=1e-12)
        bottom = d.values
    np.testing.assert_allclose(bottom, train.total, atol=1e-12)  # the stack tops out at each batch's time
    warm = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if p.get_gid() == 'warmup']
    assert warm == [(0, 1), (N_TRAIN, N_TRAIN + 1)]
    # the hatch sits on its batch's bar, as tall as it, and lets the bar's colours through
    assert [(p.get_y(), p.get_height()) for p in ax.patches if p.get_gid() == 'warmup'] == [(0, train.total[0]), (0, train.total[N_TRAIN])]
    assert all(p.get_facecolor()[3] == 0 for p in ax.patches if p.get_gid() == 'warmup')
    assert [l.get_xdata()[0] for l in ax.lines if l.get_gid() == 'epoch'] == [N_TRAIN]
    assert 'warmup' in [x.get_text() for x in ax.get_legend().get_texts()]

def test_warmup_two_and_valid_timeline():
    learn = profiled(warmup=2)
    tl = timeline_frame(learn.profile_result.recorder)
    assert tl[tl.phase == 'train'].warmup.tolist() == ([True]*2 + [False]*(N_TRAIN-2))*EPOCHS
    ax = plot_timeline(learn.profile_result.recorder).axes[0]
    assert [(p.get_x(), p.get_width()) for p in ax.patches if p.get_gid() == 'warmup'] == [(i, 1) for i in (0, 1, N_TRAIN, N_TRAIN + 1)]
    valid = plot_timeline(learn.profile_result.recorder, phase='valid').axes[0]
    series = [a for a in valid.patches if isinstance(a, StepPatch)]
    assert [a.get_gid() for a in series] == [s for s in SEGMENTS[Phase.VALID] if s not in ('warmup', 'last_draw')]
    assert all(len(a.get_data().values) == EPOCHS*N_VALID for a in series)
    # with warmup=2 every valid batch is warmup: each hatch is exactly its bar, not the axes' height
    total = tl[tl.phase == 'valid'].total.to_numpy()
    hatches = [(p.get_x(), p.get_y(), p.get_height()) for p in valid.patches if p.get_gid() == 'warmup']
    assert hatches == [(i, 0, total[i]) for i in range(EPOCHS*N_VALID)]
    np.testing.assert_allclose([h for *_, h in hatches], series[-1].get_data().values, atol=1e-12)

class Nap(Callback):
    "A callback that sleeps 5 ms in `after_batch`, ordered before or after fastai's Recorder"
    def __init__(self, order): self.order = order
    def after_batch(self): time.sleep(0.005)

@pytest.mark.parametrize('order,where', [(0, BETWEEN), (100, 'other')])
def test_after_batch_work_is_between_steps_or_other(order, where):
    "What the legend's note says: callbacks' after_batch work before the Recorder is `between steps`, after it `other`"
    learn = profiled(cbs=[Nap(order)])
    for phase in ('train', 'valid'):
        tl = timeline_frame(learn.profile_result.recorder)
        steady = ~tl[tl.phase == phase].warmup.to_numpy()
        ax = plot_timeline(learn.profile_result.recorder, phase=phase).axes[0]
        seg = {a.get_gid(): a.get_data().values - a.get_data().baseline for a in ax.patches if isinstance(a, StepPatch)}
        assert (seg[where][steady] >= 0.005).all(), (phase, where, seg[where])   # a sleep takes at least its time
        other = 'other' if where == BETWEEN else BETWEEN
        # ... and the other segment holds none of it. Were the nap charged to it, every batch's would hold at least the nap;
        # a busy machine can stall a batch, not every one (the median of the 2 steady valid batches once came out 13 ms, one
        # batch stalled 25 ms): so the least of them is under half the nap
        assert np.min(seg[other][steady]) < 0.5*0.005, (phase, other, seg[other])
    note = next(x.get_text() for x in ax.texts if x.get_gid() == 'note')
    assert note.startswith(f"{BETWEEN}: a batch's time outside its steps") and "after_batch" in note

class SkipOddSteps(Callback):
    "Gradient accumulation's effect on the loop: the optimizer step of every other batch is cancelled"
    def before_step(self):
        if self.learn.iter % 2: raise CancelStepException()

def test_cancelled_steps_still_add_up():
    learn = profiled(cbs=[SkipOddSteps()])
    t, w = totals(learn), bar_widths(learn.plot_profile())
    steady_steps = EPOCHS*sum(1 for i in range(1, N_TRAIN) if i % 2 == 0)  # batch 0 of each epoch is warmup
    assert learn.simple_profile_results.set_index(['Phase', 'Step']).loc[('train', 'opt_step'), 'Number of Calls'] == steady_steps
    assert w['train:opt_step'] == pytest.approx(t[('train', 'opt_step')], abs=1e-12)
    assert sum(v for g, v in w.items() if g.startswith('train:')) == pytest.approx(t[('fit', 'train')], abs=1e-9)
    tl = timeline_frame(learn.profile_result.recorder)
    train = tl[tl.phase == 'train']
    assert train.opt_step.isna().tolist() == [i % 2 == 1 for i in train.iter]
    top = [a for a in plot_timeline(learn.profile_result.recorder).axes[0].patches if isinstance(a, StepPatch)][-1]
    np.testing.assert_allclose(top.get_data().values, train.total, atol=1e-12)

def test_png_files(learn, tmp_path):
    learn.plot_profile(fname=tmp_path/'a'/'b'/'breakdown.png')
    learn.plot_profile_timeline(fname=tmp_path/'timeline.png')
    for f in (tmp_path/'a'/'b'/'breakdown.png', tmp_path/'timeline.png'):
        assert f.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and f.stat().st_size > 5000
    learn.path = tmp_path
    p = save_plots(learn, 'prof/run.png', timeline_name='prof/run_timeline.png')
    assert p == tmp_path/'prof'/'run.png' and p.stat().st_size > 5000
    assert (tmp_path/'prof'/'run_timeline.png').stat().st_size > 5000
    learn.plot_profile(fname=tmp_path/'breakdown.svg')
    assert (tmp_path/'breakdown.svg').read_text().lstrip().startswith('<?xml')

def test_no_pyplot_state_and_given_axes(learn):
    before = plt.get_fignums()
    learn.plot_profile(); learn.plot_profile_timeline()
    assert plt.get_fignums() == before  # nothing registered with pyplot: nothing shown, nothing leaked
    from matplotlib.figure import Figure
    fig = Figure(); ax1, ax2 = fig.subplots(1, 2)
    assert plot_profile(learn.simple_profile_results, ax=ax1) is fig
    assert plot_timeline(learn.profile_result.recorder, ax=ax2) is fig
    assert len(ax1.patches) > 0 and len(ax2.patches) > 0

def test_clear_errors_before_profiling(tmp_path):
    learn = synth_learner(path=tmp_path)
    for f in (learn.plot_profile, learn.plot_profile_timeline, lambda: save_plots(learn, 'x.png')):
        with pytest.raises(RuntimeError, match=r'learn.profile\(\)'): f()
    assert not (tmp_path/'x.png').exists()
    with pytest.raises(ValueError, match="'train' or 'valid'"): plot_timeline(profiled().profile_result.recorder, phase='fit')

def test_keep_raw_false():
    learn = synth_learner().profile(show_report=False, keep_raw=False)
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    t, w = totals(learn), bar_widths(learn.plot_profile())  # the breakdown needs only the results
    assert w['train:backward'] == pytest.approx(t[('train', 'backward')], abs=1e-12)
    with pytest.raises(ValueError, match='keep_raw=True'): learn.plot_profile_timeline()

def test_breakdown_legend_leaves_out_what_cannot_be_seen():
    "A step under 1% of every bar is a sliver: left out of the legend, named in the note; 1% of one bar is enough to stay"
    import pandas as pd
    steps = dict(train=dict(draw=.3, forward=.2, loss=.001, backward=.3, opt_step=.1, zero_grad=.0005, batch=.6015, other=.098, warmup=0.),
                 valid=dict(draw=.5, predict=.4, loss=.05, batch=.45, other=.05, warmup=0.))  # loss: 0.1% of train, 5% of valid
    res = pd.DataFrame([(p, s, v) for p, st in steps.items() for s, v in st.items()], columns=['Phase', 'Step', 'Total Time'])
    ax = plot_profile(res).axes[0]
    assert [x.get_text() for x in ax.get_legend().get_texts()] == ['draw', 'forward', 'loss', 'backward', 'opt_step', 'other', 'predict']
    note = next(x.get_text() for x in ax.texts if x.get_gid() == 'note')
    assert note.endswith('not in the legend, under 1% of every bar: zero_grad, between steps, warmup'), note
    assert {p.get_gid() for p in ax.patches} >= {'train:zero_grad', 'train:warmup'}   # still drawn, just not listed

def test_compare_chart_gives_each_step_its_colour(learn):
    "forward (train) and predict (valid) in two colours; each step the same colour in base and new"
    from fastxtend_prof.verdicts.compare import plot_comparison
    ax = plot_comparison(learn, learn).axes[0]
    color = {p.get_gid(): p.get_facecolor() for p in ax.patches if p.get_gid()}
    assert color['train:base:forward'] != color['valid:base:predict']
    assert all(color[g] == color[g.replace(':base:', ':new:')] for g in color if ':base:' in g)
    legend = {x.get_text(): h.get_facecolor() for x, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    assert legend['forward'] != legend['predict']

@pytest.mark.parametrize('n', [1, 2, 8])
def test_tune_chart_legend_is_inside_the_figure(n):
    "The speed_find chart's legend lies wholly inside the figure, for short figures too (it used to fall off the bottom)"
    import pandas as pd
    from fastxtend_prof.tune.search import SpeedResult
    sps = 100. + 50*np.arange(n)
    trials = pd.DataFrame({'Change': ['start'] + [f'num_workers={i}' for i in range(1, n)], 'Samples/s': sps, 'Samples/s Low': sps - 10,
                           'Samples/s High': sps + 10, 'Accepted': [True]*n, 'Predicted': 64/(sps*0.9)})
    fig = SpeedResult(trials, [], 'verdict', start={'bs': 64}).plot()
    fig.draw_without_rendering()  # one layout, as saving the figure makes (later layouts pulled the old legend back in)
    leg = fig.axes[0].get_legend()
    e, f = leg.get_window_extent(), fig.bbox
    assert [x.get_text() for x in leg.get_texts()] == ['predicted']
    assert f.x0 <= e.x0 and e.x1 <= f.x1 and f.y0 <= e.y0 and e.y1 <= f.y1, (e, f)

def test_every_chart_gives_a_step_one_colour(learn):
    """The PNG charts, the report page's overview, timeline and distributions and the history page colour each step from
    one map (`report.STEP_COLORS`); the timeline's warmup markers take their line's colour"""
    from matplotlib.colors import to_hex
    from fastxtend_prof.verdicts.report import STEP_COLORS
    from fastxtend_prof.verdicts.page import overview_figure, timeline_figure, timeline_series, distribution_figure
    from fastxtend_prof.verdicts.history import history, history_figure
    from fastxtend_prof.core.saved import profile_of
    prof, seen = profile_of(learn), {}
    def saw(chart, name, colour):
        if name in STEP_COLORS: seen.setdefault(name, {})[chart] = colour if colour is None else to_hex(colour)
    for p in learn.plot_profile().axes[0].patches:
        if p.get_gid(): saw('png breakdown', p.get_gid().split(':')[1], p.get_facecolor())
    for a in plot_timeline(learn.profile_result.recorder).axes[0].patches:
        if isinstance(a, StepPatch): saw('png timeline', a.get_gid(), a.get_facecolor())
    for t in overview_figure(prof.results).data: saw('page overview', t.name, t.marker.color)
    for t in timeline_figure(timeline_series(prof))[0].data:
        saw('page timeline warmup' if t.name.endswith(': warmup') else 'page timeline', t.legendgroup,
            t.marker.color if t.name.endswith(': warmup') else t.line.color)
    for t in distribution_figure(prof).data: saw('page distribution', t.name, t.marker.color)
    for t in history_figure(history([prof, prof])).data: saw('history page', t.name, t.line.color)
    charts = {c for v in seen.values() for c in v}
    assert len(charts) == 7, charts
    for name, by in seen.items():
        assert set(by.values()) == {to_hex(STEP_COLORS[name])}, (name, by)
    assert {'draw', 'forward', 'backward'} <= {n for n, by in seen.items() if len(by) >= 5}
