"""The charts in a real notebook: a fresh Jupyter kernel runs a profiled fit, and each plot cell shows its figure once, as an image."""
import json, sys, pytest
nbformat = pytest.importorskip('nbformat')
pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')
from nbclient import NotebookClient
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

SETUP = '''\
from fastai.test_utils import synth_learner
from fastai.callback.progress import *  # `learn.no_bar()`
import fastxtend_prof.all
learn = synth_learner(n_trn=4).profile(show_report=False)
with learn.no_bar(), learn.no_logging(): learn.fit(1)'''
PLOTS = {'breakdown': 'learn.plot_profile()', 'timeline': 'learn.plot_profile_timeline()',
         'display': 'fig = learn.plot_profile()\ndisplay(fig)'}

def _kernel(tmp_path):
    "A kernel manager for a fresh 'python3' kernel running this interpreter, whatever kernels the machine has installed"
    d = tmp_path/'kernels'/'python3'
    d.mkdir(parents=True)
    spec = dict(argv=[sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'], display_name='Python 3', language='python')
    (d/'kernel.json').write_text(json.dumps(spec))
    return KernelManager(kernel_name='python3', kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path/'kernels')]))

def test_plots_display_as_images(tmp_path, monkeypatch):
    # A user's kernel has no MPLBACKEND (ipykernel then defaults to the inline backend) and its own IPython profile:
    # the test suite's MPLBACKEND=Agg is not inherited, nor is this machine's profile (startup files, config).
    monkeypatch.delenv('MPLBACKEND', raising=False)
    monkeypatch.setenv('IPYTHONDIR', str(tmp_path/'ipython'))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SETUP)] + [nbformat.v4.new_code_cell(s) for s in PLOTS.values()])
    NotebookClient(nb, km=_kernel(tmp_path), timeout=300, resources={'metadata': {'path': str(tmp_path)}}).execute()
    for (name, src), cell in zip(PLOTS.items(), nb.cells[1:]):
        kinds = [(o.output_type, sorted(o.get('data', {}))) for o in cell.outputs]
        pngs = [o for o in cell.outputs if 'image/png' in o.get('data', {})]
        assert len(pngs) == 1, f'{name} cell {src!r}: expected one image/png output, got outputs {kinds}'

REPORT_CELLS = {'styled': 'learn.profile()\nwith learn.no_bar(), learn.no_logging(): learn.fit(1)',
                'markdown': 'learn.profile(markdown=True)\nwith learn.no_bar(), learn.no_logging(): learn.fit(1)',
                'value': 'learn.simple_profile_report'}

def test_report_displays_in_a_notebook(tmp_path, monkeypatch):
    "The report renders (a table, or markdown when asked), and its text form is the plain-text report, never a Styler's repr"
    monkeypatch.setenv('IPYTHONDIR', str(tmp_path/'ipython'))
    cells = [nbformat.v4.new_code_cell(SETUP)] + [nbformat.v4.new_code_cell(s) for s in REPORT_CELLS.values()]
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, km=_kernel(tmp_path), timeout=300, resources={'metadata': {'path': str(tmp_path)}}).execute()
    outs = {name: [o for o in cell.outputs if o.get('data')] for name, cell in zip(REPORT_CELLS, nb.cells[1:])}
    (styled,), (md,), (value,) = outs['styled'], outs['markdown'], outs['value']
    assert '<h4>Simple Profiler report</h4>' in styled.data['text/html'] and '<table' in styled.data['text/html']
    text = styled.data['text/plain']
    assert text.startswith('Simple Profiler report\nPhase') and 'Styler' not in text and '...' not in text
    assert 'forward' in text and 'iteration' in text
    assert md.data['text/markdown'].startswith('**Simple Profiler report**\n\n| Phase | Action | Step |')
    assert '<table' in value.data['text/html'] and value.data['text/plain'].startswith('Phase')
