"""Finding the straggler that DDP hides, by when each rank arrives: gloo ranks on the CPU, each a fastai `Learner` whose
model is wrapped in `DistributedDataParallel`, rank 1 given 30 ms of extra time (slept) per train batch in one step at a time
(the Learners of `benchmarks/ddp_straggler.py`). Each world size runs once per module: every case is one fit of the
same process group.

Every rank's host clock is shifted by a fake offset (through `make_recorder`, the seam that gives the recorder the clock
every mark reads), so the analysis only works if the offsets are measured and taken off; the test checks they are
recovered."""
import argparse, multiprocessing, os, pickle, sys, time, traceback
from datetime import timedelta
from pathlib import Path
import pytest, torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import row
from test_applications import adult_like, state, differences

sys.path.insert(0, str(Path(__file__).parents[1]/'benchmarks'))
import ddp_straggler as bench  # noqa: E402  (its Learners: the delays in draw, forward, backward compute, opt_step)

SLOW = bench.SLOW
DELAY = 0.08  # s of extra time per train batch on rank 1, slept (`--sleep`): a spun delay took the cores the other ranks
# needed under CI's load, and the rule's bar, a quarter of the others' iteration, grows with the load while the delay does
# not (3 ranks beside 2 spinning processes and 2 other test processes: a 10 ms spin came out 5.5 ms late against a 36 ms
# iteration, not named; in a loaded CI run with more work beside it, a 30 ms sleep came out 20.6 ms late against a 123 ms
# iteration, under its bar of 31 ms)
TURN = 0.2  # s the changing straggler sleeps in half its batches
WORK = 0.03  # s every rank's forward sleeps per batch: without it the tiny model's iteration is mostly the loop's own
# overhead, which load stretches unevenly: with 5 ms, in a loaded CI run, the balanced run's rank 0 came in last in every
# batch, 8.6 ms late against a 37 ms iteration, over the rule's bar (a quarter of the rest: 7.1 ms), and was named
CASES = ('none', 'draw', 'forward', 'backward', 'opt_step')
EVENTS = ('backward', 'opt_step')  # also timed the `sync='events'` way
OFFSETS = (0., 0.25, -1.5)  # s: each rank's fake clock offset
TURNS = {2: (0, 1), 3: (1, 2)}  # the ranks slow in forward in the first and the second half of the epoch
RUN_LIMIT = 240  # s: a launch that takes longer has hung
PRELOAD = ['fastxtend_prof.all', 'torch._dynamo', 'fastai.learner', __name__]

def _show(t):
    "An arrival table in full, for a failure's message"
    return 'no arrival table' if t is None else (f"{t.to_string()}\niteration {t.attrs['iteration_s']*1e3:.2f} ms, {t.attrs['steady']} batches, "
                                                 f"spread after a sync {t.attrs['exit_spread']*1e3:.2f} ms")

def _fit(learn, epochs=1, profiling=False):
    "Profiled epochs (all in one report with `profiling`); what this rank saw"
    if profiling:
        with learn.profiling(show_report=False):
            for _ in range(epochs): learn.fit(1)
    else:
        learn.profile(show_report=False)
        learn.fit(epochs)
    r = learn.profile_result
    adv = [(a.rule, a.evidence.get('rank'), a.evidence.get('step')) for a in r.advice]
    import pandas as pd
    from fastxtend_prof.features.arrivals import arrival_text
    text = arrival_text(r.arrivals) if isinstance(r.arrivals, pd.DataFrame) else ''
    return dict(advice=adv, table=r.arrivals, results=r.results, merged=r.merged_results, text=text)

def _ddp_tabular(profiled):
    "fastai's tabular application (test_applications' data and Learner) under DDP, `fit_one_cycle` from one seed: its `state`"
    from fastai.tabular.all import TabularDataLoaders, tabular_learner, Categorify, FillMissing, Normalize
    from fastai.metrics import accuracy
    from fastai.callback.progress import ProgressCallback
    from fastai.torch_core import set_seed
    from torch.nn.parallel import DistributedDataParallel
    set_seed(1, reproducible=True)
    dls = TabularDataLoaders.from_df(adult_like(), y_names='salary', cat_names=['workclass', 'education'], cont_names=['age', 'hours'],
                                     procs=[Categorify, FillMissing, Normalize], bs=64, num_workers=0, device='cpu')
    learn = tabular_learner(dls, layers=[32, 16], metrics=accuracy)
    learn.remove_cb(ProgressCallback)
    learn.model = DistributedDataParallel(learn.model)
    if profiled: learn.profile(show_report=False)
    with learn.no_logging(): learn.fit_one_cycle(2, 1e-2)
    return state(learn)

def _worker(rank, world, port, out, cases):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    rec = {}
    try:
        import functools
        from fastxtend_prof.profiler import simpleprofiler
        from fastxtend_prof.features import arrivals, distributed
        from fastxtend_prof.core.recorder import make_recorder
        from fastai.torch_core import set_seed
        from conftest import recorder_with
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        off = OFFSETS[rank]
        clock = lambda: time.perf_counter() + off
        simpleprofiler.make_recorder = functools.partial(make_recorder, clock=clock)
        dist.init_process_group('gloo', rank=rank, world_size=world, timeout=timedelta(seconds=60))
        a = argparse.Namespace(batches=20, bs=8, delay=DELAY, work=WORK, sleep=True)
        for case in cases: rec[case] = _fit(bench.learner(rank, case, a))
        with recorder_with(clock, mode='events'):  # sync='events': the timelines are the device timer's (events that read the clock)
            for case in EVENTS: rec[f'events {case}'] = _fit(bench.learner(rank, case, a))
        rec['profiling forward'] = _fit(bench.learner(rank, 'forward', a), epochs=2, profiling=True)  # two fits, one report
        from fastai.callback.core import Callback
        class Turns(Callback):
            """The straggler changes halfway through the epoch: `TURNS[world]` are slow in forward, one after the other (each costs
            the run half its delay per batch on average). A sleep, not a spin: in CI, with every core busy, a spinning straggler
            took the core the other ranks needed, so they were late too. And 200 ms (`TURN`): the bar is a quarter of the
            others' iteration, which load stretches (45 ms on two busy cores, 80 ms beside four spinning processes, 144 ms
            in a loaded CI run with more work beside it), while the rank is late by only about half its sleep on average: a
            20 ms sleep made it 8.7 ms late, 40 ms 15.4 ms, and 80 ms 35.9 ms against a bar of 36 ms"""
            def before_batch(self):
                if self.training and rank == TURNS[world][self.iter >= a.batches//2]: time.sleep(TURN)
        learn = bench.learner(rank, 'none', a)
        learn.add_cb(Turns())
        rec['turns'] = _fit(learn)
        learn = bench.learner(rank, 'draw', a)
        learn.model.register_comm_hook(None, allreduce_hook)  # the user's own hook: left as it is
        rec['own hook draw'] = _fit(learn)
        rec['own hook kept'] = [h for h, _ in learn.model._comm_hooks] == [allreduce_hook]
        learn = bench.learner(rank, 'draw', a)
        learn.profile(show_report=False, arrivals=False)
        learn.fit(1)
        r = learn.profile_result
        rec['switched off'] = dict(hooks=list(learn.model._comm_hooks), table=r.arrivals, results=r.results,
                                   advice=[(x.rule, x.evidence.get('rank'), x.evidence.get('step')) for x in r.advice])
        def toy(profiled):  # the same seed, profiled or not: the same weights and losses, bit for bit
            set_seed(0)
            learn = bench.learner(rank, 'none', a)
            if profiled: learn.profile(show_report=False)
            learn.fit(2)
            return state(learn)
        rec['identical'] = differences(toy(False), toy(True))
        rec['tabular'] = differences(_ddp_tabular(False), _ddp_tabular(True))
        # last, as it leaves the ranks' counts of profiled fits apart: only rank 0 profiles; it must give up, not hang
        arrivals.HANDSHAKE_TIMEOUT, distributed.GATHER_TIMEOUT = 1., 1.
        learn = bench.learner(rank, 'none', a)
        t0 = time.perf_counter()
        rec['rank 0 alone'] = _fit(learn) if rank == 0 else learn.fit(1)
        rec['rank 0 alone s'] = time.perf_counter() - t0
    except BaseException: rec['error'] = traceback.format_exc()
    finally:
        if dist.is_initialized(): dist.destroy_process_group()
        Path(out, f'rank{rank}.pkl').write_bytes(pickle.dumps(rec))

def _launch(path, world):
    multiprocessing.set_forkserver_preload(PRELOAD)
    t0 = time.monotonic()
    ctx = mp.start_processes(_worker, args=(world, bench.free_port(), str(path), CASES), nprocs=world, join=False, start_method='forkserver')
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() - t0 > RUN_LIMIT: pytest.fail(f'{world} ranks still running after {RUN_LIMIT} s: a rank hangs')
    finally:
        for p in ctx.processes:
            if p.is_alive(): p.kill()
    recs = {r: pickle.loads(Path(path, f'rank{r}.pkl').read_bytes()) for r in range(world)}
    for r, rec in recs.items(): assert 'error' not in rec, f'rank {r} failed:\n{rec["error"]}'
    return recs

@pytest.fixture(scope='module', params=[2, 3], ids=['2 ranks', '3 ranks'])
def runs(request, tmp_path_factory):
    return request.param, _launch(tmp_path_factory.mktemp(f'arrivals{request.param}'), request.param)

@pytest.mark.parametrize('case', CASES[1:])
def test_the_slow_rank_and_step_are_named(runs, case):
    "30 ms in rank 1's draw, forward, backward compute or optimizer step: rank 0's advice names rank 1 and that step, no other rank"
    world, recs = runs
    got = [(r, s) for rule, r, s in recs[0][case]['advice'] if rule == 'straggler_rank']
    assert got == [(SLOW, case)], f'{case}: {got}\n{_show(recs[0][case]["table"])}'
    t = recs[0][case]['table']
    assert t.set_index('Rank').Late.idxmax() == SLOW and t.Late.max() > 0.5*DELAY
    assert (t.Waited <= t.attrs['iteration_s']).all(), f'a wait longer than the iteration\n{_show(t)}'
    assert t.attrs['data_parallel'] is True and 'not data-parallel' not in recs[0][case]['text']

def test_a_balanced_run_names_nobody(runs):
    world, recs = runs
    assert [a for a in recs[0]['none']['advice'] if a[0] == 'straggler_rank'] == [], _show(recs[0]['none']['table'])

def test_the_clock_offsets_are_recovered(runs):
    "Each rank's fake offset, as rank 0 received it, within the accuracy the measurement states (and a 1 ms floor)"
    world, recs = runs
    for case in CASES:
        t = recs[0][case]['table']
        acc = t.attrs['accuracy']
        for r in range(world):
            err = abs(t.attrs['offsets'][r] - (OFFSETS[r] - OFFSETS[0]))
            assert err <= max(acc, 1e-3), f'{case}: rank {r} offset off by {err*1e6:.0f} µs (accuracy {acc*1e6:.0f} µs)'

def test_comm_wait_splits_backward(runs):
    "Every rank has a `comm_wait` row under backward; rank 1's backward compute shows apart from the others' waiting"
    world, recs = runs
    for r in range(world):
        res = recs[r]['backward']['results']
        w, b = row(res, 'train', 'comm_wait'), row(res, 'train', 'backward')
        assert w.Action == 'backward' and 0 < w['Mean Duration'] <= b['Mean Duration']
        if r == SLOW: assert b['Mean Duration'] - w['Mean Duration'] > 0.8*DELAY  # its own compute
        else: assert w['Mean Duration'] > 0.5*DELAY  # waiting for rank 1
    merged = recs[0]['backward']['merged']
    assert len(merged[(merged.Phase == 'train') & (merged.Step == 'comm_wait')]) == 1

def test_profiling_keeps_the_weights_bit_identical(runs):
    "The same seed, profiled or not, through the arrival hook: the same weights, on the toy model and on fastai's tabular application"
    world, recs = runs
    for r in range(world):
        assert recs[r]['identical'] == [], f'rank {r}: profiling changed the DDP run: {recs[r]["identical"][:5]}'
        assert recs[r]['tabular'] == [], f'rank {r}: profiling changed the DDP tabular run: {recs[r]["tabular"][:5]}'

@pytest.mark.parametrize('case', [f'events {c}' for c in EVENTS] + ['profiling forward'])
def test_device_timelines_and_several_fits(runs, case):
    "With `sync='events'` (device events read against an anchor) and over two fits in `learn.profiling()`: the same verdicts"
    world, recs = runs
    got = [(r, s) for rule, r, s in recs[0][case]['advice'] if rule == 'straggler_rank']
    assert got == [(SLOW, case.split()[-1])], f'{case}: {got}\n{_show(recs[0][case]["table"])}'
    if case == 'profiling forward': assert recs[0][case]['table'].attrs['steady'] >= 2*(20 - 1)

def test_a_hook_of_the_users_own_is_left_alone(runs):
    "The user's DDP hook stays the only one; the draw straggler is still named, and the note says what is not timed"
    world, recs = runs
    assert all(recs[r]['own hook kept'] for r in range(world))
    r0 = recs[0]['own hook draw']
    assert [(r, s) for rule, r, s in r0['advice'] if rule == 'straggler_rank'] == [(SLOW, 'draw')]
    assert any('own DDP communication hook' in n for n in r0['table'].attrs['notes'])
    assert not (r0['results'].Step == 'comm_wait').any()

def test_a_rank_that_does_not_profile_costs_a_timeout_not_a_hang(runs):
    world, recs = runs
    r0 = recs[0]['rank 0 alone']
    assert r0['table'] is None and not [a for a in r0['advice'] if a[0] == 'straggler_rank']
    assert recs[0]['rank 0 alone s'] < 20

def test_arrivals_false_leaves_the_model_alone(runs):
    "`learn.profile(arrivals=False)`: no hook, no comm_wait, no arrival table; the rule on step durations still names the draw straggler"
    world, recs = runs
    for r in range(world):
        off = recs[r]['switched off']
        assert off['hooks'] == [] and off['table'] is None and not (off['results'].Step == 'comm_wait').any()
    assert [(r, s) for rule, r, s in recs[0]['switched off']['advice'] if rule == 'straggler_rank'] == [(SLOW, 'draw')]

def test_a_straggler_that_changes_names_both(runs):
    "One rank slow for the first half of the epoch, another for the second: both named, in `forward`, each last in about half the batches"
    world, recs = runs
    r0 = recs[0]['turns']
    got = sorted((r, s) for rule, r, s in r0['advice'] if rule == 'straggler_rank')
    assert got == [(r, 'forward') for r in TURNS[world]], f'{got}\n{_show(r0["table"])}'
    share = r0['table'].set_index('Rank')['Last Share']
    assert all(0.3 <= share[r] <= 0.7 for r in TURNS[world]), _show(r0['table'])

# ------------------------------------------------------------------ ranks that are not data-parallel, under torchrun
# Two gloo ranks launched by `torchrun`, each the benchmark's Learner with its model left unwrapped (no DDP: as when
# fastai's `distrib_ctx` does not wrap it, or users sync gradients by hand). No all-reduce runs; the ranks meet only
# where fastai's `Recorder` gathers each batch's loss from every rank, after the batch (`other`).
NO_DDP = r'''
import argparse, pickle, sys
from pathlib import Path
import torch, torch.distributed as dist
out, bench_dir, delay, work = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
sys.path.insert(0, bench_dir)
import ddp_straggler as bench
import fastxtend_prof.all  # noqa: F401
from fastxtend_prof.features.arrivals import arrival_text
torch.set_num_threads(1)
dist.init_process_group('gloo')  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, rec = dist.get_rank(), {}
for case in ('none', 'forward'):
    learn = bench.learner(rank, case, argparse.Namespace(batches=20, bs=8, delay=delay, work=work, sleep=True, ddp=False))
    learn.profile(show_report=False)
    learn.fit(1)
    r = learn.profile_result
    rec[case] = dict(model=type(learn.model).__name__, results=r.results, table=r.arrivals, text=arrival_text(r.arrivals) if rank == 0 else '',
                     advice=[(a.rule, a.evidence.get('rank'), a.evidence.get('step'), a.evidence.get('others_wait_in')) for a in r.advice])
dist.destroy_process_group()
Path(out, f'rank{rank}.pkl').write_bytes(pickle.dumps(rec))
'''

@pytest.fixture(scope='module')
def no_ddp(tmp_path_factory):
    "Both ranks' records of a balanced fit and one with rank 1 slow in forward (`DELAY`, slept), the models not wrapped in DDP"
    import subprocess
    d = tmp_path_factory.mktemp('no_ddp')
    (d/'no_ddp.py').write_text(NO_DDP)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(root), os.environ.get('PYTHONPATH')])),
           'PYTHONWARNINGS': 'ignore::FutureWarning', 'OMP_NUM_THREADS': '1'}
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(bench.free_port()),
                        str(d/'no_ddp.py'), str(d), str(root/'benchmarks'), str(DELAY), str(WORK)],
                       capture_output=True, text=True, timeout=RUN_LIMIT, cwd=d, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {r: pickle.loads((d/f'rank{r}.pkl').read_bytes()) for r in range(2)}

@pytest.mark.parametrize('case', ['none', 'forward'])
def test_no_all_reduce_wait_without_ddp(no_ddp, case):
    "No rank's model is DDP: no `comm_wait` row, no wait placed at an all-reduce, and the lines say the ranks are not data-parallel"
    for r in range(2):
        rec = no_ddp[r][case]
        assert rec['model'] == 'Model' and not (rec['results'].Step == 'comm_wait').any()
    t, text = no_ddp[0][case]['table'], no_ddp[0][case]['text']
    assert t is not None, 'no arrival table'
    assert 'comm_wait' not in t['Waited In'].tolist() and not any('comm_wait' in w for w in t.attrs['waited_in'].values()), _show(t)
    assert 'comm_wait' not in text and 'not data-parallel' in text, text
    assert t.attrs['data_parallel'] is False

def test_a_wait_is_never_longer_than_the_iteration(no_ddp):
    "Rank 1 slow in forward: rank 0 waits for it once per batch, at fastai's gather of the loss (`other`), not a second time at an all-reduce that never ran"
    rec = no_ddp[0]['forward']
    t = rec['table']
    it = t.attrs['iteration_s']
    assert (t.Waited <= it).all(), _show(t)
    w = t.set_index('Rank')
    assert w.at[0, 'Waited In'] == 'other' and w.at[0, 'Waited'] > 0.5*DELAY, _show(t)
    got = [(r, s, where) for rule, r, s, where in rec['advice'] if rule == 'straggler_rank']
    assert got == [(SLOW, 'forward', 'other')], f'{got}\n{_show(t)}'
    assert [a for a in no_ddp[0]['none']['advice'] if a[0] == 'straggler_rank'] == [], _show(no_ddp[0]['none']['table'])
