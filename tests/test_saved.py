"""The saved run (`fastxtend_prof.core.saved`) as users meet it: a file from anywhere never crashes the reader or the tools
(hypothesis mutates a real file; every shape the issue listed, and more, through `report` and `compare`: one line, exit
2, no traceback, within 5 s, a damaged baseline named as the baseline), files of the previous version still open, the
page's headline is the rate the run trained at, and writing a run's file needs neither the page nor the comparison."""
import base64, copy, json, os, re, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np, pandas as pd, pytest, torch
from hypothesis import HealthCheck, given, settings, strategies as st
import jsonschema
from fastai.data.core import DataLoaders
from fastai.data.load import DataLoader
from fastai.learner import Learner
from fastai.losses import MSELossFlat
from fastai.test_utils import RegModel
from fastai.callback.core import Callback
from fastai.callback.progress import ProgressCallback  # noqa: F401  (adds `learn.no_bar`)
import fastxtend_prof.all  # noqa: F401
from fastxtend_prof.core.saved import SCHEMA, MAX_BYTES, MAX_VALUES, ProfileFileError, SavedProfile, load_profile, migrate, profile_from_doc, save_profile
from fastxtend_prof.verdicts.compare import compare_profiles, comparison_text
from fastxtend_prof.verdicts.page import profile_page

DATA = Path(__file__).parent/'data'
V2, V1 = DATA/'v2_stages.json', DATA/'v1_run.json'  # written by the version before the saved-run module (format 2), and a format-1 file
GOOD = json.loads(V2.read_text())
DOC = migrate(copy.deepcopy(GOOD))  # the same run in this version's layout
RUN = load_profile(V2)
def _inlined(o, defs):
    "The schema `o` with each `$ref` to its `defs` replaced by the definition: the same schema, validated several times faster"
    if isinstance(o, dict) and '$ref' in o:  # a reference, and perhaps its description beside it
        return {**_inlined(defs[o['$ref'].split('/')[-1]], defs), **{k: v for k, v in o.items() if k != '$ref'}}
    if isinstance(o, dict): return {k: _inlined(v, defs) for k, v in o.items() if k != '$defs'}
    return [_inlined(x, defs) for x in o] if isinstance(o, list) else o
_SCHEMA = json.loads(SCHEMA.read_text())
VALIDATOR = jsonschema.Draft202012Validator(_inlined(_SCHEMA, _SCHEMA['$defs']))
ENV = dict(os.environ, PYTHONWARNINGS='ignore', MPLBACKEND='Agg')

# ------------------------------------------------------------------------------------------------- fuzzing the reader
def _paths(o, at=()):
    "Every place in a document (lists: their first few items)"
    yield at
    items = o.items() if isinstance(o, dict) else enumerate(o[:4]) if isinstance(o, list) else ()
    for k, v in items: yield from _paths(v, at + (k,))

PLACES = [p for p in _paths(DOC) if p]
LEAVES = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
VALUES = st.recursive(LEAVES, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=12)

NEAR = {int: lambda v: [-v - 1, v + 0.5, str(v), 2**60, None], float: lambda v: [-v - 1e-9, str(v), 1e300, None],
        str: lambda v: ['', v*300, 'x' + v, None, 7], bool: lambda v: [int(v), None]}

def _near(draw, v):
    "A value that is almost `v`: another sign, a fraction, its text, out of range, wrapped, null; any JSON for containers and null"
    kind = type(v) if type(v) in NEAR else None
    return draw(st.sampled_from(NEAR[kind](v))) if kind else draw(VALUES)

def _change(draw, doc):
    "One change to `doc` in place, of a kind a damaged or hand-edited file has"
    how = draw(st.sampled_from(['cell', 'row', 'place', 'field', 'distribution']))
    rows = doc['results'] if isinstance(doc.get('results'), list) else []
    if how == 'cell' and rows:  # one results cell almost right
        r = rows[draw(st.integers(0, len(rows) - 1))]
        if isinstance(r, dict) and r:
            k = draw(st.sampled_from(sorted(r)))
            r[k] = _near(draw, r[k])
    elif how == 'row' and rows:  # a row twice, a row gone, a key gone from a row
        i = draw(st.integers(0, len(rows) - 1))
        op = draw(st.sampled_from(['twice', 'drop', 'key']))
        if op == 'twice': rows.insert(draw(st.integers(0, len(rows))), copy.deepcopy(rows[i]))
        elif op == 'drop': del rows[i]
        elif isinstance(rows[i], dict) and rows[i]: del rows[i][draw(st.sampled_from(sorted(rows[i])))]
    elif how == 'field':  # a whole field of the file replaced or gone
        k = draw(st.sampled_from(['format', 'metadata', 'report', 'columns', 'results', 'distributions', 'ranks', 'tables']))
        if draw(st.booleans()): doc.pop(k, None)
        else: doc[k] = draw(VALUES)
    elif how == 'distribution' and isinstance(doc.get('distributions'), dict) and doc['distributions']:
        d = doc['distributions'][draw(st.sampled_from(sorted(doc['distributions'])))]
        if isinstance(d, dict) and d:
            k = draw(st.sampled_from(sorted(d)))
            d[k] = d[k][:draw(st.integers(0, 8))] if isinstance(d[k], str) and draw(st.booleans()) else _near(draw, d[k])
    else:  # anywhere at all
        *parent, key = draw(st.sampled_from(PLACES))
        o = doc
        try:
            for k in parent: o = o[k]
            old = o[key]
        except (KeyError, IndexError, TypeError): return  # a place an earlier change removed
        if isinstance(o, dict) and draw(st.booleans()): del o[key]
        else: o[key] = _near(draw, old)

@st.composite
def damaged_docs(draw):
    "The good run's document with one to three changes: a results cell almost right, a row twice or gone, a field replaced, a distribution cut, anything anywhere"
    doc = copy.deepcopy(DOC)
    for _ in range(draw(st.integers(1, 3))): _change(draw, doc)
    return doc

def _read(text) -> SavedProfile|None:
    "The run in a file holding `text` (bytes or str), or None when the reader refused it with its one error"
    with tempfile.TemporaryDirectory() as d:
        p = Path(d)/'run.json'
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        try: return load_profile(p)
        except ProfileFileError as e:
            assert str(e).startswith(repr(str(p))) and '\n' not in str(e), str(e)   # one line, naming the file
            return None

def _tools_take(run:SavedProfile):
    "Every tool reads `run`: the comparison (either side) and its text, and the page; a `ValueError` that says why is the only other outcome"
    for base, new in ((RUN, run), (run, RUN)):
        try: comparison_text(compare_profiles(base, new))
        except ValueError: pass
    profile_page(run)

@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(damaged_docs())
def test_a_damaged_run_is_refused_in_one_line_or_read_by_every_tool(doc):
    "A real file with one to three places changed: the reader refuses it with one `ProfileFileError`, or reads it and then every tool takes it; what it reads, the shipped schema accepts"
    run = _read(json.dumps(doc))
    if run is None: return
    assert VALIDATOR.is_valid(doc), next(VALIDATOR.iter_errors(doc)).message   # the reader is at least as strict as the schema it ships
    _tools_take(run)

def _places(o, at=()):
    "Every place in a document: each cell of three results rows (the fit's, the train iteration's, the last valid one's), the first two items of other lists"
    items = o.items() if isinstance(o, dict) else ((i, o[i]) for i in ((0, 4, len(o) - 1) if at == ('results',) else range(min(2, len(o))))) if isinstance(o, list) else ()
    for k, v in items:
        yield at + (k,)
        yield from _places(v, at + (k,))

def test_every_place_almost_right_is_refused_or_read():
    "Each place of a real file, in turn, almost right (another sign, a fraction, its text, out of range, wrapped, null, gone): refused in one error, or read, matching the schema, and taken by the tools"
    seen = {'refused': 0, 'read': 0}
    for *parent, key in _places(DOC):
        o = DOC
        for k in parent: o = o[k]
        old = o[key]
        for v in [*(NEAR[type(old)](old) if type(old) in NEAR else [None, 'x', 0, [], {}]), 'gone']:
            doc = copy.deepcopy(DOC)
            at = doc
            for k in parent: at = at[k]
            if v == 'gone' and isinstance(at, dict): del at[key]
            elif v != 'gone': at[key] = v
            try: run = profile_from_doc(json.loads(json.dumps(doc)), 'run.json')  # the file's format read and moved first, as `load_profile` does
            except ProfileFileError as e:
                assert '\n' not in str(e), str(e)
                seen['refused'] += 1
                continue
            assert VALIDATOR.is_valid(doc), (parent, key, v, next(VALIDATOR.iter_errors(doc)).message)  # what the reader takes, the schema does
            if seen['read'] % 20 == 0:  # every twentieth run read: the tools take it (the hypothesis tests above run them on every one)
                for base, new in ((RUN, run), (run, RUN)):
                    try: compare_profiles(base, new)
                    except ValueError: pass
            seen['read'] += 1
    assert seen['refused'] > 500 and seen['read'] > 300, seen

@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(VALUES, st.dictionaries(st.sampled_from(['format', 'metadata', 'report', 'columns', 'results', 'distributions', 'ranks', 'tables']),
                                         VALUES, min_size=1).map(lambda d: {**d, 'format': d.get('format', 'fastxtend_prof.results/3')})))
def test_any_json_is_a_run_or_one_error(doc):
    run = _read(json.dumps(doc))
    if run is not None: _tools_take(run)

@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=200) | st.binary(max_size=50).map(lambda b: json.dumps(GOOD).encode()[:len(b)*97]))
def test_any_bytes_are_a_run_or_one_error(data):
    run = _read(data)
    if run is not None: _tools_take(run)

def test_what_is_written_is_read_back_and_matches_the_schema(tmp_path):
    "A run written and read again: the same results, metadata, words, distributions; the file validates against the shipped schema"
    back = load_profile(save_profile(RUN, tmp_path/'a'/'b'/'run.json'))  # its folders made
    VALIDATOR.validate(json.loads((tmp_path/'a'/'b'/'run.json').read_text()))
    pd.testing.assert_frame_equal(back.results, RUN.results)
    assert (back.metadata, back.title, back.advice, back.lines) == (RUN.metadata, RUN.title, RUN.advice, RUN.lines)
    assert back.distributions.keys() == RUN.distributions.keys()
    for k, d in RUN.distributions.items(): np.testing.assert_array_equal(back.distributions[k], d)   # float32 both ways: exact

def test_a_run_has_no_room_for_undeclared_attributes():
    "`SavedProfile` declares its fields (slots): `speed_find`'s worker count is the run's metadata, not an attribute hung on it"
    with pytest.raises(AttributeError): RUN.workers = 3

# -------------------------------------------------------------------------------------------- the command line's view
@pytest.fixture(scope='module')
def shapes(tmp_path_factory) -> dict:
    "The files of the issue (11 that crashed `report`/`compare` in 7 ways) and more: name -> path"
    d = tmp_path_factory.mktemp('shapes')
    def mut(change):
        doc = copy.deepcopy(GOOD)
        change(doc)
        return json.dumps(doc)
    n = GOOD['distributions']['train/draw']['n']
    texts = {
        'nested_10000': '[' * 10_000 + ']' * 10_000, 'nested_objects': '{"a":' * 5_000 + '1' + '}' * 5_000,
        'format_only': '{"format": "fastxtend_prof.results/2"}', 'no_columns': mut(lambda d: d.pop('columns')),
        'metadata_list': mut(lambda d: d.update(metadata=[1, 2])), 'distributions_list': mut(lambda d: d.update(distributions=['x'])),
        'words_numbers': mut(lambda d: d['metadata'].update(report={'title': 1, 'advice': [2], 'lines': 3})),
        'columns_mismatch': mut(lambda d: d.update(columns=[c.lower() for c in d['columns']])),
        'results_missing': mut(lambda d: d.pop('results')), 'results_not_rows': mut(lambda d: d.update(results=[[1, 2, 3]])),
        'empty': '', 'whitespace': '   \n', 'not_json': 'Phase,Step\nfit,fit\n', 'a_list': '[1, 2, 3]', 'a_string': '"run"',
        'foreign': '{"traceEvents": []}', 'newer': mut(lambda d: d.update(format='fastxtend_prof.results/99')),
        'nan': json.dumps(GOOD).replace('"warmup": 1', '"warmup": NaN'), 'infinity': json.dumps(GOOD).replace('"warmup": 1', '"warmup": -Infinity'),
        'huge_number': json.dumps(GOOD).replace('"warmup": 1', '"warmup": 1e400'), 'huge_integer': json.dumps(GOOD).replace('"warmup": 1', '"warmup": ' + '7'*5000),
        'duplicate_rows': mut(lambda d: d['results'].append(d['results'][4])), 'negative_time': mut(lambda d: d['results'][4].update({'Total Time': -1.0})),
        'bad_base64': mut(lambda d: d['distributions']['train/draw'].update(float32='@@@@')), 'short_base64': mut(lambda d: d['distributions']['train/draw'].update(n=n + 9)),
        'bad_summary': mut(lambda d: d['distributions'].update({'train/draw': dict(kind='summary', n=3, total=1, mean=1, m2=0, min=0, max=1, samples=0, bins=[99999], counts=[3])})),
        'stages_damaged': mut(lambda d: d['metadata']['stages'].update(rows=[{'Phase': 'train'}])), 'deep_metadata': mut(lambda d: d['metadata'].update(x=json.loads('[' * 200 + ']' * 200))),
        'phase_unknown': mut(lambda d: d['results'][0].update(Phase='<script>')), 'step_a_number': mut(lambda d: d['results'][5].update(Step=7)),
    }
    out = {}
    for name, t in texts.items():
        out[name] = d/f'{name}.json'
        out[name].write_text(t)
    out['utf16'] = d/'utf16.json'; out['utf16'].write_bytes(json.dumps(GOOD).encode('utf-16'))
    out['binary'] = d/'binary.json'; out['binary'].write_bytes(bytes(range(256))*4)
    many = {**GOOD, 'metadata': {**GOOD['metadata'], 'x': [0]*(MAX_VALUES - 10_000)}, 'distributions': []}  # all of it read, then refused at its end
    out['many_values'] = d/'many_values.json'; out['many_values'].write_text(json.dumps(many))
    out['too_many_values'] = d/'too_many_values.json'; out['too_many_values'].write_text('[' + '{},'*MAX_VALUES + '{}]')
    out['a_pipe'] = d/'a_pipe.json'; os.mkfifo(out['a_pipe'])  # no writer: reading it would wait for ever
    out['too_large'] = d/'too_large.json'
    with open(out['too_large'], 'wb') as f: f.truncate(MAX_BYTES + 1)  # sparse: no disk, no time, refused by its size
    out['a_folder'] = d/'a_folder.json'; out['a_folder'].mkdir()
    out['missing'] = d/'missing.json'
    return out

LIGHT = """import sys, contextlib, io, json, time
from fastxtend_prof.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    t0 = time.process_time()  # the command's own CPU time: the wall time is the machine's load's
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try: rc = main(argv)
        except BaseException as e: rc = 'raised ' + repr(e)
    out.append([argv, rc, err.getvalue(), time.process_time() - t0])
print(json.dumps(out))"""

def test_every_damaged_file_is_one_line_and_exit_2_for_report_and_compare(shapes, tmp_path):
    """Each shape as the run, as the new run and as the baseline of `report` and `compare`: exit 2, one line naming the file
    and its role, within 5 s of the command's CPU time (its wall time, 5.20 s once on a machine at load 10, is the load's)"""
    good = str(V2)
    argvs = [argv for p in map(str, shapes.values()) for argv in
             (['report', p, '-o', str(tmp_path/'page.html')], ['report', good, '--baseline', p, '-o', str(tmp_path/'page.html')],
              ['compare', good, p], ['compare', p, good])]
    done = subprocess.run([sys.executable, '-c', LIGHT, json.dumps(argvs)], capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    for argv, rc, err, seconds in json.loads(done.stdout):
        role = ('baseline' if '--baseline' in argv else 'profile') if argv[0] == 'report' else 'base' if argv[1] != good else 'new'
        assert rc == 2 and len(err.splitlines()) == 1 and 'Traceback' not in err, (argv, rc, err)
        assert err.startswith(f'fastxtend-prof {argv[0]}: error: `{role}`: '), (argv, err)
        assert seconds < 5, (argv, seconds)
    assert not (tmp_path/'page.html').exists()

@pytest.mark.parametrize('shape', ['nested_10000', 'metadata_list', 'columns_mismatch', 'too_large'])
def test_a_damaged_file_in_a_fresh_process(shapes, tmp_path, shape):
    """The command as a user runs it, interpreter start included: one line on stderr, exit 2, within 5 s of the command's
    own CPU time (its wall time is the machine's load's: 5.04 s in a loaded run of the suite); importing torch and fastai
    alone would cost more than that"""
    import resource
    cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))
    p = shapes[shape]
    for argv in (['report', p, '-o', tmp_path/'x.html'], ['compare', V2, p]):
        t0 = cpu()
        done = subprocess.run([sys.executable, '-m', 'fastxtend_prof', *map(str, argv)], capture_output=True, text=True, timeout=60, env=ENV)
        seconds = cpu() - t0
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and str(p) in done.stderr, done.stderr
        assert seconds < 5, seconds

def test_files_of_the_previous_version_still_work(tmp_path):
    "Formats 1 and 2 (the version before this module) through the command line: compared (means only for format 1, said so) and paged"
    done = subprocess.run([sys.executable, '-m', 'fastxtend_prof', 'compare', str(V1), str(V2)], capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0 and done.stdout.startswith('Compared with the baseline: train iteration'), done.stdout + done.stderr
    assert 'holds no per-batch durations' in ' '.join(done.stdout.split())   # the text is wrapped to the terminal's width
    page = tmp_path/'sub'/'page.html'  # its folder made
    done = subprocess.run([sys.executable, '-m', 'fastxtend_prof', 'report', str(V2), '--baseline', str(V1), '-o', str(page)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0 and 'Saved: page' in done.stdout, done.stdout + done.stderr
    html = page.read_text()
    assert 'Loader stages (train' in html and 'comparison-table' in html   # the words of a format-2 file, and the comparison

def test_two_runs_in_the_order_of_diff(tmp_path):
    "`compare BASE NEW` and `report NEW --baseline BASE` give the same verdict; a second file without `--baseline` is refused, not guessed"
    slow = copy.deepcopy(DOC)
    raw = slow['distributions']['train/iteration']
    d = np.frombuffer(base64.b64decode(raw['float32']), '<f4')*2  # every iteration twice as long
    raw['float32'] = base64.b64encode(d.astype('<f4').tobytes()).decode()
    for r in slow['results']:
        if r['Phase'] == 'train' and r['Step'] == 'iteration': r.update({'Mean Duration': 2*r['Mean Duration'], 'Samples/Second': r['Samples/Second']/2})
        if r['Phase'] == 'fit' and r['Step'] == 'train': r['Samples/Second'] /= 2  # it trained at half the rate, which the verdict quotes
    (tmp_path/'slow.json').write_text(json.dumps(slow))
    run = lambda *a: subprocess.run([sys.executable, '-m', 'fastxtend_prof', *map(str, a)], capture_output=True, text=True, timeout=120, env=ENV)
    cmp = run('compare', V2, tmp_path/'slow.json', '--within-run')   # one run a side alone is not judged
    said = ' '.join(cmp.stdout.split())  # the text is wrapped to the terminal's width
    assert cmp.returncode == 0 and 'train iteration slower: +100% time' in said and '0.50× the samples/s' in said, cmp.stdout
    rep = run('report', tmp_path/'slow.json', '--baseline', V2, '--within-run', '-o', tmp_path/'p.html')
    assert rep.returncode == 0 and 'train iteration slower: +100% time' in (tmp_path/'p.html').read_text(), rep.stdout + rep.stderr
    two = run('report', tmp_path/'slow.json', V2)
    assert two.returncode == 2 and '--baseline' in two.stderr and len(two.stderr.splitlines()) == 1, two.stderr

# --------------------------------------------------------------------------------------------- the page's headline
class SleepyItems(torch.utils.data.Dataset):
    "Items that take `s` seconds each to load: a data-bound run whatever the machine's load (a sleep can only run long)"
    def __init__(self, n, s): self.x, self.s = torch.linspace(-1, 1, n)[:, None], s
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        time.sleep(self.s)
        return self.x[i], 2*self.x[i] + 1

class TrainClock(Callback):
    "The train phase's wall time and samples, measured apart from the profiler"
    order = -100
    def before_fit(self): self.seconds, self.samples = 0., 0
    def before_train(self): self.t0 = time.perf_counter()
    def after_batch(self):
        if self.training: self.samples += len(self.xb[0])
    def after_train(self): self.seconds += time.perf_counter() - self.t0

def test_the_page_headline_is_the_rate_the_run_trained_at(tmp_path):
    "A loader whose items sleep: the page leads with train samples over train time (within 5%), not the batch step's rate, which is many times higher"
    dls = DataLoaders(DataLoader(SleepyItems(8*12, 2e-3), bs=8, shuffle=True), DataLoader(SleepyItems(16, 0), bs=8), device='cpu')
    clock = TrainClock()
    learn = Learner(dls, RegModel(), loss_func=MSELossFlat(), lr=1e-2, cbs=clock)
    learn.profile(show_report=False, html=tmp_path/'page.html', save_json=tmp_path/'run.json')
    with learn.no_bar(), learn.no_logging(): learn.fit(2)
    truth = clock.samples/clock.seconds
    for page in (tmp_path/'page.html').read_text(), profile_page(tmp_path/'run.json'):
        shown = re.search(r'<div id="headline"><div class="kpi"><b>([\d,]+) samples/s</b>trained at: train samples ÷ train time</div>', page)
        assert shown, page[page.index('<div id="headline">'):][:500]
        rate = float(shown.group(1).replace(',', ''))
        assert abs(rate/truth - 1) < 0.05, (rate, truth)
    model = learn.profile_result.results.query("Phase == 'train' and Step == 'batch'")['Samples/Second'].item()
    assert model > 3*truth, (model, truth)   # what the page showed before: the batch row's rate, far off on a data-bound run

# --------------------------------------------------------------------------------------------- writing a run's file
WRITE = """import sys
sys.modules['fastxtend_prof.verdicts.page'] = None  # the page tool can't be imported: writing the run's JSON must not need it
import torch, fastxtend_prof.all
from fastai.test_utils import synth_learner
learn = synth_learner(n_trn=4)
learn.profile(show_report=False, save_json=sys.argv[1], save_csv=sys.argv[2])
with learn.no_logging(): learn.fit(1)"""

def test_writing_the_files_needs_no_page(tmp_path):
    "`save_json` and `save_csv` (a path, its folders made) write without the page module"
    done = subprocess.run([sys.executable, '-c', WRITE, str(tmp_path/'j'/'run.json'), str(tmp_path/'c'/'run.csv')], capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    run, csv = load_profile(tmp_path/'j'/'run.json'), pd.read_csv(tmp_path/'c'/'run.csv')
    assert list(csv.Step) == list(run.results.Step) and run.metadata['num_workers'] == 0
