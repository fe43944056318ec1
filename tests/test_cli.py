"The command line, end to end in a subprocess: files written, exit codes."
import os, re, subprocess, sys
from pathlib import Path
import pandas as pd, pytest, torch

def run(*args, cwd):
    return subprocess.run([sys.executable, '-m', 'fastxtend_prof', *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=dict(os.environ, PYTHONWARNINGS='ignore', MPLBACKEND='Agg'))

def test_one_demo_run_writes_its_files_and_prints_each_epoch(tmp_path):
    """One demo run (each costs a training: one run checks what four did): the demo's options given before `demo` apply,
    as after it; `--csv out/` (a path ending in '/') is a folder for the default name and `--plot new/chart.png` makes its
    folder; files get the umask's permissions, as open() gives; where each went is said once, under
    the report; `--trace` writes its trace without kineto's misleading error line on a CPU; `--no-progress` prints each epoch as named, rounded values, never fastai's raw recorder list; on the CPU,
    host timing and no sync note"""
    (tmp_path/'out').mkdir()
    p = run('--trace', '--epochs', '1', '--num-workers', '0', '--device', 'cpu', '--no-progress', '--csv', 'out/', '--plot', 'new/chart.png',
            'demo', cwd=tmp_path)   # `--trace` first: it takes an optional path, and would take `demo` for one
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path/'profile_trace.json').is_file()
    # a CUDA build of torch on a machine without a GPU: kineto printed `ERROR: ... gpuGetDeviceCount failed with code 35` at
    # the trace window's end, which reads as a failure; the window starts it quiet there
    assert 'gpuGetDeviceCount' not in p.stderr and 'ERROR' not in p.stderr, p.stderr[-2000:]
    assert 'Simple Profiler report' in p.stdout and "sync='" not in p.stdout
    csv, png = tmp_path/'out'/'simple_profile.csv', tmp_path/'new'/'chart.png'   # `new` made
    res = pd.read_csv(csv)
    assert {'draw', 'forward', 'backward', 'opt_step'} <= set(res.Step)
    assert res[(res.Phase == 'fit') & (res.Step == 'epoch')]['Number of Calls'].item() == 1   # --epochs 1, given before `demo`
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and png.stat().st_size > 5000
    umask = os.umask(0o22); os.umask(umask)
    assert {f.stat().st_mode & 0o777 for f in (csv, png)} == {0o666 & ~umask}
    assert f'results to {csv}' in p.stdout and f'chart to {png}' in p.stdout
    lines = p.stdout.splitlines()
    assert not [l for l in lines if re.match(r'\[\d+, ', l)], p.stdout   # fastai's raw list; the advice's '[warning]' lines may start with '['
    epochs = [l for l in lines if l.startswith('epoch ')]
    num = r'\d+\.?\d*(e-\d+)?'
    assert len(epochs) == 1 and re.fullmatch(rf'epoch 1/1  train_loss {num}  valid_loss {num}  accuracy {num}  time \d\d:\d\d', epochs[0]), p.stdout
    assert lines.index(epochs[-1]) < next(i for i, l in enumerate(lines) if 'Simple Profiler report' in l)  # epochs, then the report

def test_bad_option_exits_2(tmp_path):
    bad = [['demo', '--epochs', '0'], ['demo', '--sync', 'gpu'], ['demo', '--bs', 'many'], ['demo', '--no-such-option'],
           ['demo', '--device', 'tpu'], ['--device', 'gpu'], ['demo', '--slow-data', 'nan'], ['demo', '--slow-data', 'inf'],
           ['--bs', 'abc', 'demo'], ['--epochs', '-1'], ['--epochs', '-1', 'demo'], ['bogus'], ['--bs', '2', 'bogus']]
    for args in bad:  # before, after or without a subcommand: one line, no usage block
        p = run(*args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.returncode)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith('fastxtend-prof'), (args, p.stderr)

@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has CUDA: --device cuda is valid here')
def test_device_cuda_without_a_gpu_exits_2_before_training(tmp_path):
    p = run('demo', '--device', 'cuda', '--no-progress', cwd=tmp_path)
    assert p.returncode == 2 and 'Traceback' not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('fastxtend-prof: error:') and 'no CUDA device' in p.stderr, p.stderr
    assert 'Simple Profiler report' not in p.stdout   # refused before any training

def test_help_lists_every_option(tmp_path):
    "`demo --help` lists the demo's options; `--help` the commands, and where the demo's options are (it led with them)"
    p = run('demo', '--help', cwd=tmp_path)
    assert p.returncode == 0
    for opt in ('--epochs', '--bs', '--num-workers', '--slow-data', '--warmup', '--device', '--sync', '--csv', '--plot', '--trace',
                '--save-json', '--html', '--no-progress'):
        assert opt in p.stdout, opt
    top = ' '.join(run('--help', cwd=tmp_path).stdout.split())
    assert '{demo,compare,tune,noise,report,history,guide,run}' in top and 'run SCRIPT [args...] or run -m MODULE [args...]' in top, top
    assert 'fastxtend-prof demo --help' in top and '--epochs' not in top, top

LIGHT = """import sys, contextlib, io
from fastxtend_prof.cli import main
rcs = []
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for argv in {argvs!r}:
        try: rcs.append(main(argv))
        except SystemExit as e: rcs.append(e.code)
print(rcs, sorted(m for m in ('torch', 'fastai') if m in sys.modules))"""

def run_light(argvs, cwd):
    "`main(argv)` for each of `argvs` in one fresh process: the exit codes, and which of torch and fastai got imported"
    p = subprocess.run([sys.executable, '-c', LIGHT.format(argvs=argvs)], capture_output=True, text=True, timeout=300, cwd=cwd,
                       env=dict(os.environ, PYTHONWARNINGS='ignore', MPLBACKEND='Agg'))
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip()

def test_help_and_bad_options_import_neither_torch_nor_fastai(tmp_path):
    "`--help`, bad options and the output checks made before training cost no torch or fastai import (seconds on a busy laptop)"
    argvs = [['--help'], ['demo', '--help'], ['compare', '--help'], ['tune', '--help'], ['demo', '--epochs', '0'], ['--bogus'], ['bogus'],
             ['tune', '--allow', 'bf16'], ['--plot', '/dev/null/x.png'], ['compare', 'a.json', 'b.json', '--step', 'train/draw'],
             ['compare', str(tmp_path/'missing.json'), 'b.json'], ['report', str(tmp_path/'missing.json')], ['report', 'new.json', 'base.json'],
             ['history', 'a.json', '--step', 'train/forward'], ['history', str(tmp_path/'missing.json'), 'b.json'], ['history', '--help'], ['guide']]
    assert run_light(argvs, tmp_path) == f'{[0, 0, 0, 0] + [2]*11 + [0, 0]} []'

@pytest.mark.parametrize('opt,name', [('--csv', 'r.csv'), ('--plot', 'c.png'), ('--trace', 't.json'), ('--save-json', 'p.json')])
def test_unwritable_output_exits_2_before_training(tmp_path, opt, name):
    "A file that can't be written is one line and exit 2, before any training, and never reported as saved"
    blocker = tmp_path/'not_a_folder'
    blocker.write_text('')
    p = run('demo', '--epochs', '1', '--num-workers', '0', '--device', 'cpu', '--no-progress', opt, str(blocker/name), cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('fastxtend-prof: error: ' + opt), p.stderr
    assert 'Simple Profiler report' not in p.stdout and 'saved' not in p.stdout.lower()  # nothing trained, nothing claimed

@pytest.mark.parametrize('args', [['demo', '--csv', 'f/r.csv'], ['demo', '--plot', 'f/c.png'], ['demo', '--trace', 'f/t.json'],
                                  ['demo', '--save-json', 'f/sub/p.json'], ['--plot', 'f/'], ['compare', 'a.json', 'b.json', '--plot', 'f/c.png'],
                                  ['tune', '--plot', 'f/t.png'], ['report', 'a.json', '-o', 'f/p.html']])
def test_a_path_that_cannot_be_written_is_refused_before_training(tmp_path, args):
    "A file where a folder would be: one line and exit 2, naming the option, before anything is read or trained; nothing made"
    (tmp_path/'f').write_text('')
    p = run(*args, '--device', 'cpu', cwd=tmp_path) if args[0] in ('demo', 'tune') or args[0].startswith('-') else run(*args, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith('fastxtend-prof') and "'f' is not a folder" in lines[0], p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ['f'] and p.stdout == ''

def test_outputs_make_their_folders(tmp_path):
    "Every output option takes a path and makes its missing folders, as `learn.profile`'s files do (the demo's: `test_one_demo_run_writes_its_files_and_prints_each_epoch`)"
    run_json = Path(__file__).parent/'data'/'v2_stages.json'
    p = run('report', run_json, '-o', 'pages/new/run.html', cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path/'pages'/'new'/'run.html').is_file(), p.stderr
    p = run('compare', run_json, run_json, '--plot', 'charts/cmp.png', cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path/'charts'/'cmp.png').read_bytes()[:4] == b'\x89PNG', p.stderr

def test_bad_number_message_names_what_is_allowed(tmp_path):
    p = run('demo', '--bs', 'abc', cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].endswith("argument --bs: must be a positive integer, got 'abc'"), p.stderr

def test_help_says_what_no_progress_prints(tmp_path):
    p = run('demo', '--help', cwd=tmp_path)
    assert 'one line per epoch' in ' '.join(p.stdout.split()), p.stdout

def test_tune_bad_options_are_one_line_before_training(tmp_path):
    bad = [['tune', '--max-time', '0'], ['tune', '--batches', '1'], ['tune', '--allow', 'bf16'], ['tune', '--no-such-option'],
           ['tune', '--slow-data', '-1'], ['tune', '--plot', str(tmp_path/'f'/'x.png')],
           ['tune', '--sync', 'gpu']]  # the trials time steps as the demo does: its choices
    (tmp_path/'f').write_text('')  # a file where the chart's folder would be
    for args in bad:
        p = run(*args, cwd=tmp_path)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith('fastxtend-prof tune: error:'), (args, p.stderr)
        assert 'speed_find' not in p.stdout  # refused before any trial

def test_tune_fixes_the_slow_data_demo(tmp_path):
    "A data-bound demo (a sleep per batch, 0.02 s failed on two busy cores: the worker helped nothing): the tuner keeps more workers and prints the table and how to keep them"
    p = run('tune', '--slow-data', '0.1', '--device', 'cpu', '--batches', '30', '--plot', 'tune.png', cwd=tmp_path)  # 0.1 s: the wait outweighs a busy machine's slower compute
    assert p.returncode == 0, p.stderr[-3000:]
    assert 'speed_find: faster with num_workers=' in p.stdout and 'To keep what speed_find found:' in p.stdout, p.stdout
    # predicted, against the best so far (its range only from a record of this machine's: `$FASTXTEND_PROF_SPEED_RECORD`)
    assert re.search(r"num_workers=\d+ +\S+ ms \(-\d+%(; \S+ ms to \S+ ms)?\)", p.stdout), p.stdout
    assert (tmp_path/'tune.png').read_bytes()[:4] == b'\x89PNG'

def test_step_without_the_gate_is_refused(tmp_path):
    "`--step` names the row `--fail-on-regression` reads: alone it would change nothing, so it is one line and exit 2"
    p = run('compare', 'a.json', 'b.json', '--step', 'train/nosuch', cwd=tmp_path)
    assert p.returncode == 2 and p.stderr == ('fastxtend-prof compare: error: --step names the row --fail-on-regression reads: '
                                              'give --fail-on-regression PCT too (--step train/nosuch alone changes nothing)\n'), p.stderr

def test_demo_save_json_then_compare(tmp_path):
    "Two demo runs saved with --save-json, then `compare` on them: the comparison from the command line alone, without torch or fastai"
    for name in ('a', 'b'):
        p = run('--epochs', '1', '--bs', '128', '--num-workers', '0', '--device', 'cpu', '--no-progress', '--save-json', f'{name}.json', cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
        assert f'{tmp_path/name}.json' in p.stdout   # the report says where it went
    p = run('compare', 'a.json', 'b.json', cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith('Compared with the baseline: train iteration'), p.stdout + p.stderr
    assert run_light([['compare', 'a.json', 'b.json'], ['compare', 'a.json', 'b.json', '--fail-if-slower', '1000', '--step', 'train/nosuch']],
                     tmp_path) == '[0, 2] []'   # an unknown step is refused with the gate; neither needs torch

def test_html_without_plotly_is_one_line_before_training(tmp_path):
    """`--html` where plotly is not installed (the demo's own environment had none): one line saying what to install, exit
    2, before anything is trained. It was a 24-line traceback after training. plotly is hidden from this process only"""
    (tmp_path/'plotly').mkdir()  # a package that can't be imported stands first on the path: as if plotly were not there
    (tmp_path/'plotly'/'__init__.py').write_text("raise ImportError('no plotly here')\n")
    hide = "import importlib.util as u; f = u.find_spec; u.find_spec = lambda n, *a: None if n.split('.')[0] == 'plotly' else f(n, *a)\n"
    p = subprocess.run([sys.executable, '-c', hide + "import sys; from fastxtend_prof.cli import main; sys.exit(main(sys.argv[1:]))",
                        '--html', 'page.html', '--epochs', '1', '--device', 'cpu', '--no-progress'],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, MPLBACKEND='Agg'))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith('fastxtend-prof: error: --html') and "pip install 'fastxtend-prof[html]'" in lines[0], lines
    assert 'Simple Profiler report' not in p.stdout and not (tmp_path/'page.html').exists()

@pytest.mark.parametrize('argv, said', [
    (['--epochz', '1'], "fastxtend-prof: error: unrecognized arguments: --epochz (did you mean --epochs?)"),  # was "invalid choice: '1'"
    (['demo', '--epoch', '1'], 'fastxtend-prof demo: error: unrecognized arguments: --epoch (did you mean --epochs?) 1'),  # was --epochs, silently
    (['compare', 'a.json', 'b.json', '--fail-if-slowr', '3'], 'unrecognized arguments: --fail-if-slowr (did you mean --fail-if-slower?) 3'),
    (['history', 'x.json', '--formt', 'md'], 'fastxtend-prof history: error: unrecognized arguments: --formt (did you mean --format?) md')])
def test_a_mistyped_option_is_named_with_the_closest_one(argv, said, capsys):
    """A typo before the implicit `demo` is named (argparse took its value for the command: "invalid choice: '1'"), an
    option is taken only whole (`--epoch` ran as `--epochs`), and each unknown option gets the closest known one; one
    line, exit 2, nothing run (the command's own `main`, in this process)"""
    from fastxtend_prof.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and said in err, err

@pytest.mark.parametrize('argv, said', [
    (['histroy', 'runs/'], "invalid choice: 'histroy' (choose from 'demo', 'compare', 'tune', 'noise', 'report', 'history', 'guide', 'run') (did you mean history?)"),
    (['demo', '--device', 'cdua'], "argument --device: invalid choice: 'cdua' (choose from 'auto', 'cpu', 'cuda') (did you mean cuda?)")])
def test_a_mistyped_command_or_choice_is_named_with_the_closest_one(argv, said, capsys):
    "A mistyped command (or a choice of an option) gets the closest one, as a mistyped option does: one line, exit 2"
    from fastxtend_prof.cli import main
    with pytest.raises(SystemExit) as e: main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count('\n') == 1 and said in err, err

@pytest.mark.parametrize('argv', [['history', 'tests/data/wide_mlp', '--fail-on-regression', '10'], ['guide'],
                                  ['compare', 'tests/data/wide_mlp/r1.json', 'tests/data/wide_mlp/r5.json']])
def test_a_reader_that_closes_the_pipe_costs_no_traceback(argv):
    """`fastxtend-prof history runs/ | head -1`: a reader that had enough closes the pipe; no traceback, and a command's
    verdict keeps its exit status (a gate's 1 is not lost to the pipe; was a BrokenPipeError's traceback and 1 for all)"""
    root = Path(__file__).parents[1]
    whole = subprocess.run([sys.executable, '-m', 'fastxtend_prof', *argv], capture_output=True, text=True, timeout=120, cwd=root)
    p = subprocess.Popen([sys.executable, '-m', 'fastxtend_prof', *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
    p.stdout.close()  # before the interpreter has started: its first write meets a closed pipe
    err = p.stderr.read().decode()
    # a command's verdict (`_emit`) keeps its status; what else met the closed pipe (the guide) exits 1, as Python's own advice has it
    assert p.wait(timeout=120) == (1 if argv[0] == 'guide' else whole.returncode) and err == '', (p.returncode, err[-2000:])
    assert whole.returncode == (1 if argv[0] == 'history' else 0) and whole.stdout, whole.stderr[-2000:]

@pytest.mark.parametrize('cores, workers, omp, want', [(2, 2, None, 1), (4, 2, None, 2), (8, 0, None, 8), (2, 2, '3', 'as it was')])
def test_the_demo_leaves_its_loader_workers_their_cores(monkeypatch, cores, workers, omp, want):
    """On a CPU the demo runs torch on the cores its loader workers leave (at least one): with torch's default threads
    beside 2 workers on a busy 2-core machine, identical demo runs ranged from 4,026 to 359 samples/s. An
    `OMP_NUM_THREADS` the user set is left as it is. (The demo itself stubbed: only its threads are read.)"""
    import os, types, torch
    from fastxtend_prof import cli, digits
    seen, before = {}, torch.get_num_threads()
    if omp is None: monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    else: monkeypatch.setenv('OMP_NUM_THREADS', omp)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(digits, 'demo', lambda **kw: seen.update(threads=torch.get_num_threads()) or types.SimpleNamespace(profile_result=None))
    try:
        torch.set_num_threads(5)
        assert cli.main(['--device', 'cpu', '--num-workers', str(workers)]) == 0
    finally: torch.set_num_threads(before)
    assert seen['threads'] == (5 if want == 'as it was' else want), seen
