"""`fastxtend-prof run`: profiling a script that knows nothing of the profiler, end to end in real processes.

The scripts here are written to a temporary folder and run through `python -m fastxtend_prof.autorun` (what
`fastxtend-prof run` calls), through `torchrun` with the environment variable, and under IPython with `%load_ext`.
Each test says what it catches when the code it guards is broken."""
import os, re, socket, subprocess, sys, textwrap
from pathlib import Path
import pytest

TIMEOUT = 300  # s: a run that takes longer has hung (they take seconds, most of it importing torch and fastai)
ROOT = Path(__file__).resolve().parents[1]
SITE_DIR = ROOT/'fastxtend_prof'/'_autorun_site'
REPORT = 'Simple Profiler report'

def env(**extra):
    "The environment for a child: this checkout's package first (as `PYTHONPATH=.` does), no figure windows"
    e = {**os.environ, 'MPLBACKEND': 'Agg', 'PYTHONWARNINGS': 'ignore::FutureWarning'}
    e['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
    e.pop('FASTXTEND_PROF', None)
    e.update(extra)
    return e

def run(*args, cwd=None, **kw):
    "`fastxtend-prof run ARGS` in a fresh process"
    return subprocess.run([sys.executable, '-m', 'fastxtend_prof.autorun', *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd, env=env(**kw))

def write(path:Path, src:str) -> Path:
    path.write_text(textwrap.dedent(src).lstrip())
    return path

# --------------------------------------------------------------------------------------------- a real fastai script
# A `@call_parse` script as users keep them: vision on PNG files in class folders, its own arguments, lr_find, one
# fit_one_cycle and a fine_tune (two fits), get_preds; it prints its arguments and a checksum of the final weights.
# A small CNN, not a resnet: 3 fits of a resnet18 took over a minute on two busy cores.
TRAIN = '''
    import hashlib
    from fastcore.script import call_parse
    from fastai.vision.all import *

    @call_parse
    def main(path:str, # Image folders train/ and valid/
             epochs:int=1, # Epochs
             bs:int=16): # Batch size
        set_seed(42, reproducible=True)
        dls = ImageDataLoaders.from_folder(path, train='train', valid='valid', bs=bs, num_workers=0)
        model = nn.Sequential(ConvLayer(3, 16, stride=2), ConvLayer(16, 32, stride=2), nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(32, dls.c))
        learn = Learner(dls, model, metrics=accuracy)
        with learn.no_bar(), learn.no_logging():
            learn.lr_find(num_it=4, show_plot=False)
            learn.fit_one_cycle(epochs, 1e-3)
            learn.fine_tune(epochs, 1e-3)
            learn.get_preds()
        digest = hashlib.sha1(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
        print(f'script: epochs={epochs} bs={bs} weights={digest}')
'''

@pytest.fixture(scope='module')
def digits(tmp_path_factory):
    "120 of scikit-learn's 8x8 digits as 16x16 RGB PNG files in train/<label> and valid/<label>"
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    root = tmp_path_factory.mktemp('digits')
    d = load_digits()
    for i, (img, y) in enumerate(zip(d.images[:120], d.target[:120])):
        folder = root/('valid' if i % 5 == 0 else 'train')/str(y)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img*16).clip(0, 255).astype(np.uint8)).resize((16, 16)).convert('RGB').save(folder/f'{i}.png')
    write(root/'train.py', TRAIN)
    return root

@pytest.fixture(scope='module')
def profiled(digits, tmp_path_factory):
    "The script run through `fastxtend-prof run --out DIR`"
    out = tmp_path_factory.mktemp('runs')/'prof_runs'
    return out, run('--out', out, digits/'train.py', digits, '--epochs', '1', '--bs', '16')

def test_script_profiled_fit_by_fit(profiled):
    "A report per fit (fit_one_cycle, then fine_tune's two: 3), none for lr_find or get_preds; the script's own output, exit 0; files per fit"
    out, p = profiled
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(REPORT) == 3, p.stdout
    assert 'script: epochs=1 bs=16 weights=' in p.stdout  # its arguments reached it, its output is there
    files = sorted(f.name for f in out.iterdir())
    assert files == [f'fit{n}.{ext}' for n in (1, 2, 3) for ext in ('csv', 'json', 'png')]
    for n in (1, 2, 3):  # the report names the files it wrote, each fit its own
        assert re.search(rf'Saved: .*{re.escape(str(out/f"fit{n}.csv"))}.*{re.escape(str(out/f"fit{n}.json"))}', p.stdout)
    from fastxtend_prof.core.saved import load_json
    assert load_json(out/'fit3.json')[0].query("Phase == 'fit' and Step == 'fit'")['Number of Calls'].iloc[0] == 1

def test_script_run_observed_only(digits, profiled):
    "The same seed gives bit-identical weights under `run` and under plain `python`: profiling changed nothing in the run"
    _, p = profiled
    plain = subprocess.run([sys.executable, str(digits/'train.py'), str(digits), '--epochs', '1', '--bs', '16'], capture_output=True,
                           text=True, timeout=TIMEOUT, env=env())
    assert plain.returncode == 0, plain.stderr
    assert REPORT not in plain.stdout
    weights = lambda s: re.search(r'weights=(\w+)', s).group(1)
    assert weights(p.stdout) == weights(plain.stdout)

# ----------------------------------------------------------------------------------- how the script ends is its own
def test_exception_is_the_scripts(tmp_path):
    "An uncaught exception: exit 1 and the script's traceback, its file and line, without runpy's or this package's frames"
    s = write(tmp_path/'broken.py', '''
        import sys
        def inner(): raise ValueError('broke on purpose ' + ' '.join(sys.argv[1:]))
        inner()
    ''')
    p = run(s, 'a', 'b')
    assert p.returncode == 1
    assert p.stderr.startswith('Traceback (most recent call last):\n'), p.stderr
    assert f'File "{s}", line 3, in <module>' in p.stderr and f'File "{s}", line 2, in inner' in p.stderr
    assert p.stderr.rstrip().endswith('ValueError: broke on purpose a b')
    assert 'runpy' not in p.stderr and 'autorun' not in p.stderr

def test_exit_status_is_the_scripts(tmp_path):
    "sys.exit(3) exits 3; sys.exit('msg') prints msg and exits 1, as python does; the output before it is there"
    s = write(tmp_path/'leave.py', '''
        import sys
        print('before exit')
        sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
    ''')
    p = run(s, '3')
    assert (p.returncode, p.stdout, p.stderr) == (3, 'before exit\n', '')
    p = run(s, 'giving up')
    assert (p.returncode, p.stderr) == (1, 'giving up\n')

SAME_AS_PYTHON = '''
    import os, signal, sys, warnings
    warnings.warn("the script's own warning", FutureWarning)
    warnings.warn('a deprecation in __main__', DeprecationWarning)
    print('argv', sys.argv, 'file', __file__, 'name', __name__)
    print('globals', sorted((k, type(v).__name__) for k, v in globals().items()), __package__, __spec__)
    print('main', sys.modules['__main__'].__dict__ is globals(), 'path0', sys.path[0], 'filters', len(warnings.filters))
    os.chdir(sys.argv[1])
    print('cwd', os.getcwd())
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    os.kill(os.getpid(), signal.SIGUSR1)
    print('signal', got, signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    import fastai.basics  # torch warns of `torch.jit.script` as fastai imports: python shows it, so must run
    sys.exit(3)
'''

def test_script_sees_the_python_it_would_under_python(tmp_path):
    """As typed, `fastxtend-prof run SCRIPT` (the CLI's entry, not autorun's): the same stdout, stderr and exit status as
    `python SCRIPT`: its warnings shown (the CLI's filter for torch's FutureWarning once hid them, process-wide), the
    same warning filters, `__file__` absolute and the globals Python gives a script (runpy gave a relative one, no
    loader), `sys.argv` as given, the working folder it moves to, its signal handlers; importing the CLI changes no filter"""
    s = write(tmp_path/'same.py', SAME_AS_PYTHON)
    e = env()
    del e['PYTHONWARNINGS']  # the filters python starts with
    go = lambda *pre: subprocess.run([sys.executable, *pre, s.name, str(tmp_path)], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=e)
    plain, profiled = go(), go('-m', 'fastxtend_prof', 'run')
    assert plain.returncode == 3 and "FutureWarning: the script's own warning" in plain.stderr and 'torch.jit.script' in plain.stderr
    assert (profiled.returncode, profiled.stdout, profiled.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    quiet = subprocess.run([sys.executable, '-c', 'import warnings; f = list(warnings.filters); import fastxtend_prof.cli; assert warnings.filters == f, warnings.filters[:2]'],
                           capture_output=True, text=True, timeout=TIMEOUT, env=e)
    assert quiet.returncode == 0, quiet.stderr

def test_bad_command_lines(tmp_path):
    "Bad options, a missing script or module, an --out that can't be written: one line on stderr, exit 2, nothing run"
    s = write(tmp_path/'ran.py', 'open(__file__ + ".ran", "w").close()\n')
    (tmp_path/'a_file').write_text('')
    for args in (['--bogus', s], [], ['--out'], [tmp_path/'missing.py'], ['--out', tmp_path/'a_file'/'sub', s],
                 ['--no-report', s], ['-m', 'no_such_module_xyz'], ['--env', s]):
        p = run(*args)
        assert p.returncode == 2 and p.stdout == '', (args, p)
        assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith('fastxtend-prof run: error: '), (args, p.stderr)
    assert not Path(str(s) + '.ran').exists()
    p = run('--help')
    assert p.returncode == 0 and 'usage: fastxtend-prof run' in p.stdout

def test_module_form(tmp_path):
    "`-m MODULE args`: run as `python -m` (found from the working folder, sys.argv[0] its file), its fit profiled"
    write(tmp_path/'mytrain.py', '''
        import sys
        from fastai.test_utils import synth_learner
        print('argv', sys.argv[1:], sys.argv[0].endswith('mytrain.py'), __name__)
        learn = synth_learner()
        with learn.no_logging(): learn.fit(1)
    ''')
    # as the console script `fastxtend-prof` runs it: from a file in another folder (bin/), which Python puts in sys.path[0]
    (tmp_path/'bin').mkdir()
    entry = write(tmp_path/'bin'/'fastxtend-prof', 'import sys\nfrom fastxtend_prof.autorun import main\nsys.exit(main())\n')
    p = subprocess.run([sys.executable, entry, '-m', 'mytrain', '--lr', '0.1'], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=env())
    assert p.returncode == 0, p.stderr
    assert "argv ['--lr', '0.1'] True __main__" in p.stdout
    assert p.stdout.count(REPORT) == 1

# ------------------------------------------------------------------------------------------- in this process: no trace
def test_in_process_run_leaves_no_trace(tmp_path, capsys):
    "After `main([...])`: Learner.fit is fastai's again, no import hook stays, sys.argv and sys.path are as before; with `--no-report`, each fit says where its files went (it printed nothing)"
    from fastai.learner import Learner
    from fastxtend_prof import autorun
    fit, argv, path, meta = Learner.fit, sys.argv[:], sys.path[:], sys.meta_path[:]
    s = write(tmp_path/'tiny.py', '''
        from fastai.learner import Learner
        from fastai.test_utils import synth_learner
        assert getattr(Learner.fit, '_fxp_autorun', False)  # the hook is in place while the script runs
        learn = synth_learner()
        with learn.no_logging(): learn.fit(1)
        assert learn.profile_result is not None
    ''')
    assert autorun.main(['--no-report', '--out', tmp_path/'out', s]) == 0
    assert sorted(p.name for p in (tmp_path/'out').iterdir())[:2] == ['fit1.csv', 'fit1.json']
    err = capsys.readouterr().err
    assert f"fastxtend-prof: fit 1 profiled, its files: {tmp_path/'out'/'fit1.json'}, {tmp_path/'out'/'fit1.csv'}" in err, err
    assert Learner.fit is fit and autorun.installed() is None
    assert (sys.argv, sys.path, sys.meta_path) == (argv, path, meta)

def test_users_own_profile_kept(tmp_path):
    "A Learner its user profiles keeps their options for every fit (no second profile); lr_find and get_preds get none"
    from fastai.test_utils import synth_learner
    import fastai.callback.schedule  # noqa: F401  (lr_find)
    import fastxtend_prof.all  # noqa: F401  (learn.profile)
    from fastxtend_prof import autorun
    autorun.install(out=str(tmp_path))
    try:
        mine = synth_learner(path=tmp_path).profile(show_report=False, save_csv=True, csv_name='mine.csv')
        other = synth_learner(path=tmp_path/'other')  # lr_find saves the model there
        with mine.no_logging(), other.no_logging():
            mine.fit(1)
            mine.fit(1)  # the user's profile covered the first fit only: the hook doesn't take the second
            other.lr_find(num_it=3, show_plot=False)
            other.get_preds()
            assert autorun.installed().n == 0
            other.fit(1)
    finally: autorun.uninstall()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ['fit1.csv', 'fit1.json', 'fit1.png', 'mine.csv']

# ----------------------------------------------------------------------------------- launchers: the environment variable
DDP = '''
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from fastcore.basics import noop
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.learner import Learner
    from fastai.losses import MSELossFlat
    from fastai.test_utils import RegModel

    class Items(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.x = torch.randn(n, 1, generator=g)
            self.y = 2*self.x + 1
        def __len__(self): return len(self.x)
        def __getitem__(self, i): return self.x[i], self.y[i]

    torch.set_num_threads(1)
    dist.init_process_group('gloo')  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    dls = DataLoaders(DataLoader(Items(8*16, rank), bs=16, shuffle=True, num_workers=0), DataLoader(Items(2*16, 9), bs=16, num_workers=0),
                      device='cpu')
    learn = Learner(dls, RegModel(), loss_func=MSELossFlat(), lr=1e-2)
    learn.model = DistributedDataParallel(learn.model)
    learn.logger = noop
    learn.fit(1)
    print(f'rank {rank} trained', flush=True)
    dist.destroy_process_group()
'''

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def exported_env(out, chain_dir):
    "The environment `eval \"$(fastxtend-prof run --env --out OUT)\"` gives, with another `sitecustomize` in `chain_dir` after ours"
    p = run('--env', '--out', out)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f'export PYTHONPATH={SITE_DIR}') and lines[1] == f"export FASTXTEND_PROF='--out {out}'"
    e = env(FASTXTEND_PROF=f'--out {out}')
    e['PYTHONPATH'] = os.pathsep.join([str(SITE_DIR), str(chain_dir), e['PYTHONPATH']])
    return e

@pytest.fixture
def chain_dir(tmp_path):
    "A pre-existing `sitecustomize` (as Debian's and conda's are) that logs each process it runs in, by torchrun rank"
    d = tmp_path/'their_site'
    d.mkdir()
    write(d/'sitecustomize.py', '''
        import os
        with open(os.path.join(os.path.dirname(__file__), 'ran.log'), 'a') as f: f.write(os.environ.get('RANK', '-') + chr(10))
    ''')
    return d

def test_torchrun_one_merged_report(tmp_path, chain_dir):
    "torchrun, 2 gloo ranks, DDP, via PYTHONPATH + FASTXTEND_PROF: one merged report (rank 0), one set of files, the other sitecustomize ran in every process"
    s, out = write(tmp_path/'ddp_train.py', DDP), tmp_path/'prof_runs'
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port', str(free_port()), s], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=tmp_path, env=exported_env(out, chain_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'rank 0 trained' in p.stdout and 'rank 1 trained' in p.stdout
    assert p.stdout.count(REPORT) == 1 and f'{REPORT} (2 ranks)' in p.stdout and 'Slowest Rank' in p.stdout
    assert p.stdout.count('Saved: ') == 1
    assert sorted(f.name for f in out.iterdir()) == ['fit1.csv', 'fit1.json', 'fit1.png', 'fit1_ranks.csv']
    ranks = (chain_dir/'ran.log').read_text().split()
    assert {'0', '1'} <= set(ranks) and '-' in ranks  # the launcher and both workers

def test_env_route_is_light_and_chains(tmp_path, chain_dir):
    "With the env set, Python starts with the hook waiting (no fastai, no torch imported) and the other sitecustomize run; a bad value: exit 2"
    e = exported_env(tmp_path/'prof_runs', chain_dir)
    code = ("import sys; print('torch' in sys.modules, 'fastai' in sys.modules, sys.modules['fastxtend_prof.autorun'].installed().out, "
            "sys.modules['sitecustomize'].__file__)")
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=TIMEOUT, env=e)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ['False', 'False', str(tmp_path/'prof_runs'), str(chain_dir/'sitecustomize.py')]
    assert (chain_dir/'ran.log').read_text() == '-\n'
    p = subprocess.run([sys.executable, '-c', 'print("ran")'], capture_output=True, text=True, timeout=TIMEOUT, env={**e, 'FASTXTEND_PROF': '--outt x'})
    assert (p.returncode, p.stdout) == (2, '')
    assert p.stderr.startswith('fastxtend-prof: FASTXTEND_PROF: error: ') and len(p.stderr.splitlines()) == 1
    e.pop('FASTXTEND_PROF')  # the folder alone on PYTHONPATH changes nothing
    p = subprocess.run([sys.executable, '-c', "import sys; print('fastxtend_prof' in sys.modules)"], capture_output=True, text=True, timeout=TIMEOUT, env=e)
    assert (p.returncode, p.stdout) == (0, 'False\n')

def test_package_holds_the_site_folder():
    "The wheel's packages (pyproject's find include) hold `_autorun_site`, or the env route would break once installed"
    import tomllib, setuptools
    include = tomllib.loads((ROOT/'pyproject.toml').read_text())['tool']['setuptools']['packages']['find']['include']
    assert 'fastxtend_prof._autorun_site' in setuptools.find_packages(str(ROOT), include=include)
    assert (SITE_DIR/'sitecustomize.py').is_file()

# ---------------------------------------------------------------------------------------------- %load_ext fastxtend_prof
IPYTHON = '''
    import sys
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic('load_ext', 'fastxtend_prof')
    assert 'torch' not in sys.modules  # loading the extension imports no torch: the hook waits for fastai
    ok = ip.run_cell('from fastai.test_utils import synth_learner\\nlearn = synth_learner()\\nwith learn.no_logging(): learn.fit(1)')
    assert ok.success
    print('--- unloaded', flush=True)
    ip.run_line_magic('unload_ext', 'fastxtend_prof')
    assert ip.run_cell('with learn.no_logging(): learn.fit(1)').success
    print('--- loaded again', flush=True)
    ip.run_line_magic('load_ext', 'fastxtend_prof')
    assert ip.run_cell('with learn.no_logging(): learn.fit(1)').success
'''

def test_load_ext_profiles_every_fit_until_unloaded(tmp_path):
    "%load_ext fastxtend_prof: a report for a fit; after %unload_ext none; loaded again, a report again"
    p = subprocess.run([sys.executable, '-c', textwrap.dedent(IPYTHON)], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=env())
    assert p.returncode == 0, p.stderr
    loaded, unloaded, again = re.split('--- unloaded\n|--- loaded again\n', p.stdout)
    assert (loaded.count(REPORT), unloaded.count(REPORT), again.count(REPORT)) == (1, 0, 1), p.stdout

def test_import_stays_light():
    "`import fastxtend_prof` (what %load_ext does first) and its autorun module import no torch, no fastai"
    code = "import sys, fastxtend_prof, fastxtend_prof.autorun; print(sorted(m for m in ('torch', 'fastai', 'pandas') if m in sys.modules))"
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=TIMEOUT, env=env())
    assert (p.returncode, p.stdout) == (0, '[]\n'), p.stderr
