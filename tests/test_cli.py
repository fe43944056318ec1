"The command line, end to end in a subprocess: files written, exit codes."
import os, re, subprocess, sys
import pandas as pd, pytest, torch

def run(*args, cwd):
    return subprocess.run([sys.executable, '-m', 'fastxtend_prof', *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=dict(os.environ, PYTHONWARNINGS='ignore', MPLBACKEND='Agg'))

def test_demo_writes_csv_and_chart(tmp_path):
    p = run('demo', '--epochs', '1', '--num-workers', '0', '--device', 'cpu', '--no-progress', '--csv', 'out/res.csv', '--plot', 'out/chart.png', cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert 'Simple Profiler report' in p.stdout and "sync='" not in p.stdout   # on the CPU: host timing, no sync note
    res = pd.read_csv(tmp_path/'out'/'res.csv')
    assert {'draw', 'forward', 'backward', 'opt_step'} <= set(res.Step)
    png = (tmp_path/'out'/'chart.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 5000

def test_bad_option_exits_2(tmp_path):
    bad = [['demo', '--epochs', '0'], ['demo', '--sync', 'gpu'], ['demo', '--bs', 'many'], ['demo', '--no-such-option'],
           ['demo', '--device', 'tpu'], ['--device', 'gpu'], ['demo', '--slow-data', 'nan'], ['demo', '--slow-data', 'inf'],
           ['--bs', 'abc', 'demo']]
    for args in bad:
        p = run(*args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.returncode)
        assert p.stderr.strip().splitlines()[-1].startswith('fastxtend-prof'), p.stderr
        assert 'Traceback' not in p.stderr

@pytest.mark.skipif(torch.cuda.is_available(), reason='this machine has CUDA: --device cuda is valid here')
def test_device_cuda_without_a_gpu_exits_2_before_training(tmp_path):
    p = run('demo', '--device', 'cuda', '--no-progress', cwd=tmp_path)
    assert p.returncode == 2 and 'Traceback' not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith('fastxtend-prof: error:') and 'no CUDA device' in p.stderr
    assert 'Simple Profiler report' not in p.stdout   # refused before any training

def test_help_lists_every_option(tmp_path):
    p = run('demo', '--help', cwd=tmp_path)
    assert p.returncode == 0
    for opt in ('--epochs', '--bs', '--num-workers', '--slow-data', '--warmup', '--device', '--sync', '--csv', '--plot', '--trace', '--no-progress'):
        assert opt in p.stdout, opt

@pytest.mark.parametrize('opt,name', [('--csv', 'r.csv'), ('--plot', 'c.png'), ('--trace', 't.json')])
def test_unwritable_output_exits_2_before_training(tmp_path, opt, name):
    "A file that can't be written is one line and exit 2, before any training, and never reported as saved"
    blocker = tmp_path/'not_a_folder'
    blocker.write_text('')
    p = run('demo', '--epochs', '1', '--num-workers', '0', '--device', 'cpu', '--no-progress', opt, str(blocker/name), cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('fastxtend-prof: error: ' + opt), p.stderr
    assert 'Simple Profiler report' not in p.stdout and 'saved' not in p.stdout.lower()  # nothing trained, nothing claimed

def test_folder_outputs_and_file_modes_follow_the_umask(tmp_path):
    "A path ending in '/' is a folder for the default file name; files get the umask's permissions, as open() gives"
    p = run('demo', '--epochs', '1', '--num-workers', '0', '--device', 'cpu', '--no-progress', '--csv', 'out/', '--plot', 'out/',
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    csv, png = tmp_path/'out'/'simple_profile.csv', tmp_path/'out'/'simple_profile.png'
    assert csv.is_file() and png.is_file()
    umask = os.umask(0o22); os.umask(umask)
    assert {f.stat().st_mode & 0o777 for f in (csv, png)} == {0o666 & ~umask}
    assert f'results to {csv}' in p.stdout and f'chart to {png}' in p.stdout   # said once, under the report

def test_bad_number_message_names_what_is_allowed(tmp_path):
    p = run('demo', '--bs', 'abc', cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].endswith("argument --bs: must be a positive integer, got 'abc'"), p.stderr

def test_options_before_the_subcommand_apply(tmp_path):
    "`fastxtend-prof --epochs 1 ... demo` trains one epoch, as `fastxtend-prof demo --epochs 1 ...` does"
    p = run('--epochs', '1', '--num-workers', '0', '--device', 'cpu', '--no-progress', '--csv', 'r.csv', 'demo', cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    res = pd.read_csv(tmp_path/'r.csv')
    assert res[(res.Phase == 'fit') & (res.Step == 'epoch')]['Number of Calls'].item() == 1

def test_no_progress_prints_one_readable_line_per_epoch(tmp_path):
    "`--no-progress` prints each epoch as named, rounded values, never fastai's raw recorder list"
    p = run('demo', '--epochs', '2', '--num-workers', '0', '--device', 'cpu', '--no-progress', cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert not [l for l in lines if re.match(r'\[\d+, ', l)], p.stdout   # fastai's raw list; the advice's '[warning]' lines may start with '['
    epochs = [l for l in lines if l.startswith('epoch ')]
    assert [l.split()[1] for l in epochs] == ['1/2', '2/2'], p.stdout
    num = r'\d+\.?\d*(e-\d+)?'
    for l in epochs: assert re.fullmatch(rf'epoch \d/2  train_loss {num}  valid_loss {num}  accuracy {num}  time \d\d:\d\d', l), l
    assert lines.index(epochs[-1]) < next(i for i, l in enumerate(lines) if 'Simple Profiler report' in l)  # epochs, then the report

def test_help_says_what_no_progress_prints(tmp_path):
    p = run('demo', '--help', cwd=tmp_path)
    assert 'one line per epoch' in ' '.join(p.stdout.split()), p.stdout

def test_tune_bad_options_are_one_line_before_training(tmp_path):
    bad = [['tune', '--max-time', '0'], ['tune', '--batches', '1'], ['tune', '--allow', 'bf16'], ['tune', '--no-such-option'],
           ['tune', '--slow-data', '-1'], ['tune', '--plot', str(tmp_path/'f'/'x.png')]]
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
    assert re.search(r'num_workers=\d+ +\S+ ms \(-\d+%\)', p.stdout), p.stdout
    assert (tmp_path/'tune.png').read_bytes()[:4] == b'\x89PNG'
