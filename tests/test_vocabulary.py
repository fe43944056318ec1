"""Step and phase names come from `recorder.py` only: no module spells one as a string literal.

`Step` and `Phase` are str-Enums, so `Step.DRAW` works wherever `'draw'` did (dict keys, pandas filters, comparisons);
a typo in a member is an AttributeError where a typo in a string is a silent miss. This test reads every module of the
package (recorder.py, which defines the names, and the generated `_modidx.py` aside) with `ast` and lists each bare string
constant equal to a step or phase name. Not counted: docstrings and other lone string statements, the literal text of
f-strings (messages quote names freely; what is inside their `{}` is code and is counted), attribute names given to
`getattr`/`hasattr`/`setattr`/`delattr`, and the few entries of `ALLOWED`, each an option key that merely equals a name."""
import ast, pathlib
import pytest
from fastxtend_prof.core.recorder import Step, Phase

PKG = pathlib.Path(__file__).resolve().parent.parent/'fastxtend_prof'
SKIP = {'core/recorder.py', '_modidx.py'}
NAMES = {m.value for m in Step} | {m.value for m in Phase}
ATTR_FUNCS = {'getattr', 'hasattr', 'setattr', 'delattr'}

# (module, enclosing function or class, value): why that literal is not a step or phase name
ALLOWED = {
    ('autorun.py', '_wrap_learner', 'fit'): "the name of the method `Learner.fit` that `fastxtend-prof run` wraps",
    ('autorun.py', 'uninstall', 'fit'): "the name of the method `Learner.fit` that `fastxtend-prof run` puts back",
    ('digits.py', 'demo', 'trace'): "the `trace` option of `learn.profile`, a dict key of its keyword arguments",
    ('cli.py', '_outputs', 'trace'): "the `--trace` option's argparse name (`a.trace`)",
    ('core/saved.py', '', 'warmup'): "`META_FIELDS`' field for the `warmup` option, and its label in the warning that it differs",
    ('verdicts/compare.py', 'compare', 'warmup'): "the metadata key for the `warmup` option of this fit, which the `Baseline` feature compares with the saved run's",
    ('verdicts/plots.py', '', 'epoch'): "`timeline_frame`'s `epoch` column: the index of the loop a batch ran in, not the `epoch` span",
    ('core/saved.py', '', 'epoch'): "`TIMELINE_INDEX`: the saved timeline's `epoch` column, `timeline_frame`'s, not the `epoch` span",
    ('verdicts/plots.py', 'plot_timeline', 'epoch'): "the `gid` of the dashed lines where an epoch starts",
    ('features/flops.py', '_fake_memo', 'forward'): "a module's `forward` attribute (`model.forward = torch.compile(model.forward)`), not the step",
    ('features/flops.py', '_eager_forwards', 'forward'): "a module's `forward` attribute (`model.forward = torch.compile(model.forward)`), not the step",
    ('core/events.py', 'watched_fit', 'fit'): "the name of `Learner.fit` among fastai's originals that `install` keeps",
    ('core/events.py', 'uninstall', 'fit'): "the name of `Learner.fit` among fastai's originals that `install` keeps",
    ('profiler/simpleprofiler.py', '_check_options', 'warmup'): "the `warmup` option of `learn.profile`",
    ('tune/noise_find.py', 'noise_find', 'warmup'): "the `warmup` option of `learn.noise_find`, named in its error",
    ('profiler/simpleprofiler.py', '', 'warmup'): "the `warmup` option, which fastxtend's `drop_first_batch` sets (`_ALIASES`)",
    ('profiler/simpleprofiler.py', 'SimpleProfilerCallback', 'draw'): "the `draw` mark of the recorder's `MARKS`, which `before_draw` hands over",
    ('features/trace.py', 'files', 'trace'): "the file of the `trace` option, among the files a profile writes",
    ('features/trace.py', 'Trace', 'trace'): "the `Trace` feature's name: the `trace` option of `learn.profile` and `ProfileResult.trace`",
    ('tune/search.py', '_check_find', 'warmup'): "the `warmup` option of `learn.speed_find`",
    ('features/stages.py', '', 'batch'): "`PER_BATCH`, the unit of the loader stages' `Per` column: a stage runs once per item or once per batch",
}

def _skipped(tree) -> set:
    "ids of the constants that are not values: lone string statements (docstrings) and the literal text of f-strings"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant): out.add(id(node.value))
        elif isinstance(node, ast.JoinedStr): out.update(id(v) for v in node.values if isinstance(v, ast.Constant))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)): out.add(id(node.args[1]))
    return out

def _owners(tree) -> dict:
    "id of every node -> the name of the innermost function or class around it ('' at module level)"
    out = {}
    def visit(node, owner):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else owner
            out[id(child)] = name
            visit(child, name)
    visit(tree, '')
    return out

def literals(source:str, fname:str) -> list:
    "`(line, value, owner)` of each string constant in `source` equal to a step or phase name, less the skipped and allowed ones"
    tree = ast.parse(source)
    skipped, owners = _skipped(tree), _owners(tree)
    found = [(n.lineno, n.value, owners.get(id(n), '')) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in NAMES and id(n) not in skipped]
    return sorted(f for f in found if (fname, f[2], f[1]) not in ALLOWED)

MODULES = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob('*.py') if p.relative_to(PKG).as_posix() not in SKIP)

@pytest.mark.parametrize('fname', MODULES)
def test_no_step_or_phase_literals(fname):
    found = literals((PKG/fname).read_text(), fname)
    assert not found, (f'{len(found)} step/phase name(s) as string literals; use `Step.X`/`Phase.X` or a list from recorder.py:\n'
                       + '\n'.join(f'  fastxtend_prof/{fname}:{line}: {value!r} (in {owner or "module"})' for line, value, owner in found))

def test_the_allow_list_is_used():
    "Every `ALLOWED` entry still matches a literal: a stale entry would quietly allow a new one"
    for fname, owner, value in ALLOWED:
        tree = ast.parse((PKG/fname).read_text())
        owners = _owners(tree)
        assert any(isinstance(n, ast.Constant) and n.value == value and owners.get(id(n)) == owner for n in ast.walk(tree)), (fname, owner, value)

def test_it_catches_a_literal():
    "A step name used as a value is caught, whether a dict key, a comparison, a list item or inside an f-string's `{}`"
    src = '''
"""A module docstring that says draw"""
def f(df, r):
    "train: a docstring"
    a = df[df.Step == 'draw']
    b = r['forward']
    c = ('loss', 'other')
    msg = f'the draw took {r["batch"]}'
    ok = getattr(r, 'train', None), f'valid {a}', 'drawn'
'''
    assert [(line, v) for line, v, _ in literals(src, 'x.py')] == [(5, 'draw'), (6, 'forward'), (7, 'loss'), (7, 'other'), (8, 'batch')]
