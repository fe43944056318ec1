"""Code written for fastxtend 0.1.7's profiler runs unchanged with fastxtend_prof: the same script, only the import line
differs, runs under both and prints a report."""
import importlib.util, subprocess, sys, textwrap
import pytest

SCRIPT = textwrap.dedent('''
    from fastai.basics import *
    from fastai.callback.schedule import *
    from fastai.test_utils import synth_learner
    {import_line}
    learn = synth_learner(n_trn=8, n_val=2)
    learn.profile(mode=ProfileMode.Simple, plain=True, drop_first_batch=True, rolling_average=5)
    with learn.no_logging(): learn.fit_one_cycle(1, 1e-3)
    res = learn.profile_results
    print('ROWS', len(res), 'STEPS', ' '.join(sorted(set(res.Action) & {{'draw', 'forward', 'backward', 'opt_step', 'step'}})))
    print('REPORT', isinstance(learn.profile_report, pd.DataFrame))
    learn.profile('simple', show_report=False)
    with learn.no_logging(): learn.fit(1)
    print('AGAIN', len(learn.profile_results) > 0)
''')

IMPORTS = {'fastxtend_prof': 'from fastxtend_prof.all import *',
           'fastxtend': 'from fastxtend.callback.profiler import *\nfrom fastxtend.callback.utils import LogDispatch; defaults.callbacks.append(LogDispatch)'}

@pytest.mark.parametrize('lib', ['fastxtend_prof', 'fastxtend'])
def test_fastxtend_script_runs_unchanged(lib, tmp_path):
    if lib == 'fastxtend' and importlib.util.find_spec('fastxtend') is None: pytest.skip('fastxtend 0.1.7 not installed: the script is checked against ours only')
    script = tmp_path/'train.py'
    script.write_text(SCRIPT.format(import_line=IMPORTS[lib].replace('\n', '\n')))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert 'STEPS backward draw forward opt_step step' in out and 'AGAIN True' in out, out[-2000:]
    if lib == 'fastxtend_prof':
        assert 'Simple Profiler report' in out and 'REPORT True' in out
        assert "fastxtend's" not in p.stderr  # no complaint about the fastxtend-style arguments
