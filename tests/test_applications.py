"""fastai's real applications, profiled the way users train them (issue 22): vision, tabular, text and collaborative
filtering, each on small data made here or shipped with scikit-learn (no downloads, no pretrained weights).

The promise under test: a profiler observes and never changes the run. For each application an unprofiled and a
profiled run (FLOP counting on) from the same seed must end with bit-identical weights and metrics (`learn.recorder.values`). That is
only a fair test when the application itself is deterministic, so a mismatch is judged once more: a second unprofiled
run that differs from the first says the run is not deterministic (a failure of the test's setup, named as such);
one that matches says the profiler changed the run.

Beside identity, each profiled run must have the report's rows (the draw's parts where a fastai loader runs them) and
the parts must add up to the draw. No timing is asserted: the machine may be loaded.

Vision needs torchvision, which imports only beside CUDA builds of torch (`torch==2.14.1` + `torchvision==0.29.1`;
`bash scripts/test.sh` installs them). Without it the vision tests skip, unless `CI` is set: there they must run."""
import os, warnings
import numpy as np, pandas as pd, pytest, torch
from torch import nn
from fastai.basics import set_seed, accuracy, rmse
from fastai.callback.progress import ProgressCallback
import fastxtend_prof.all  # noqa: F401  (adds Learner.profile)
from conftest import row

pytestmark = pytest.mark.apps
SEED = 1
WORKERS = (0, 2)
N_IMAGES = 240  # 192 train (6 batches of 32), 48 valid (2)

@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """torch on one thread for these tests: on a shared 2-core machine two busy threads per process thrash (an AWD_LSTM's
    backward took 0.87 s a batch on two threads under load, 0.06 s on one); both runs of each comparison use the same"""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

def _vision():
    "fastai.vision.all, or a skip (a failure under CI) when torchvision does not import beside this torch"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            import fastai.vision.all as v
        return v
    except Exception as e:  # torchvision's wheel beside torch's CPU build: RuntimeError 'operator torchvision::nms does not exist'
        msg = f'fastai.vision does not import with torch {torch.__version__}: {e!r}'
        if os.environ.get('CI'): pytest.fail(msg + ' (CI must run the vision tests: scripts/test.sh installs torchvision)')
        pytest.skip(msg)

# ------------------------------------------------------------------------------------------------------ the check
def state(learn):
    "What must be identical after the fit: every weight and buffer, and the metrics fastai recorded each epoch"
    sd = {k: v.detach().cpu().clone() for k, v in learn.model.state_dict().items()}
    return sd, [list(map(float, v)) for v in learn.recorder.values]

def differences(a, b) -> list:
    "What differs between two `state`s, as readable lines (empty: bit-identical)"
    (wa, ma), (wb, mb) = a, b
    out = [f'{k}: max |diff| {(wa[k].double() - wb[k].double()).abs().max().item():.3g}' for k in wa if not torch.equal(wa[k], wb[k])]
    if ma != mb: out.append(f'metrics {ma} != {mb}')
    return out

def run(build, train, profile:bool, **profile_kw):
    "Seed, `build()` a Learner, profile it or not, `train(learn)`; the Learner"
    set_seed(SEED, reproducible=True)
    learn = build()
    if profile: learn.profile(show_report=False, **profile_kw)
    learn.remove_cb(ProgressCallback)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # fastai's own warnings (autocast without CUDA, ...) are not under test
        with learn.no_logging(): train(learn)
    return learn

def assert_unchanged(build, train, **profile_kw):
    """An unprofiled and a profiled run of `train` from the same seed end bit-identical; the profiled Learner. The profiled run
    counts FLOPs too (`flops=True`, not a default): the counter copies the model and runs it on fake tensors mid-batch, the part
    of a profile most able to touch a run; and it times the loader's stages (`stages=True`), which wraps the loader's methods
    and runs in its workers; what the defaults do is a part of it"""
    profile_kw = {'flops': True, 'stages': True, **profile_kw}
    plain = state(run(build, train, False))
    learn = run(build, train, True, **profile_kw)
    diff = differences(plain, state(learn))
    if diff:
        again = differences(plain, state(run(build, train, False)))
        assert not again, 'the application is not deterministic, so profiling cannot be judged: ' + '; '.join(again[:5])
        raise AssertionError('profiling changed the run: ' + '; '.join(diff[:5]))
    return learn

TRAIN_ROWS = {'draw', 'batch', 'other', 'warmup', 'forward', 'loss', 'backward', 'opt_step', 'zero_grad'}
VALID_ROWS = {'draw', 'batch', 'other', 'warmup', 'predict', 'loss'}

def assert_report(learn, parts=('wait', 'transfer', 'transforms'), train_rows=TRAIN_ROWS):
    "The results have each phase's rows, with the draw's `parts`, which add up to the draw"
    res = learn.simple_profile_results
    for phase, rows in (('train', train_rows), ('valid', VALID_ROWS)):
        steps = set(res[res.Phase == phase].Step)
        assert rows | set(parts) <= steps, f'{phase}: missing {sorted(rows | set(parts) - steps)}'
        split = res[(res.Phase == phase) & (res.Action == 'draw') & (res.Step != 'draw')]
        assert set(split.Step) == set(parts)
        assert split['Total Time'].sum() == pytest.approx(row(res, phase, 'draw')['Total Time'], rel=1e-9)
        assert (split['Number of Calls'] == row(res, phase, 'draw')['Number of Calls']).all()

# ---------------------------------------------------------------------------------------------------------- vision
@pytest.fixture(scope='module')
def digits_dir(tmp_path_factory):
    "scikit-learn's 8x8 digits as 32x32 RGB PNG files in train/ and valid/ class folders, and 0/1 masks for segmentation"
    from PIL import Image
    from sklearn.datasets import load_digits
    root = tmp_path_factory.mktemp('digits')
    d = load_digits()
    (root/'masks').mkdir()
    for i, (img, y) in enumerate(zip(d.images[:N_IMAGES], d.target[:N_IMAGES])):
        folder = root/('valid' if i % 5 == 0 else 'train')/str(y)
        folder.mkdir(parents=True, exist_ok=True)
        im = Image.fromarray((img*16).clip(0, 255).astype(np.uint8)).resize((32, 32))
        im.convert('RGB').save(folder/f'{i}.png')
        Image.fromarray((np.asarray(im) > 64).astype(np.uint8)).save(root/'masks'/f'{i}.png')
    return root

def image_dls(v, root, num_workers=0):
    "`ImageDataLoaders` from the folders: `Resize` on items, `aug_transforms` and `Normalize` on the batch"
    return v.ImageDataLoaders.from_folder(root, train='train', valid='valid', item_tfms=v.Resize(32), bs=32,
        batch_tfms=[*v.aug_transforms(size=32), v.Normalize.from_stats(*v.imagenet_stats)], num_workers=num_workers)

def resnet(v, root, num_workers=0):
    "A `vision_learner` with a resnet18 body, untrained"
    return lambda: v.vision_learner(image_dls(v, root, num_workers), v.resnet18, pretrained=False, metrics=accuracy)

@pytest.fixture(scope='module')
def profiled_resnet(digits_dir):
    "The workload most fastai users run: image files, `aug_transforms` in the batch pipeline, `fit_one_cycle`; profiled"
    v = _vision()
    return assert_unchanged(resnet(v, digits_dir), lambda l: l.fit_one_cycle(1, 1e-3))

def test_vision_fit_one_cycle(profiled_resnet):
    assert_report(profiled_resnet)

def test_vision_fit_one_cycle_with_workers(digits_dir):
    "The same with 2 loader processes: the items come from the workers, the batch transforms run in the main process"
    v = _vision()
    assert_report(assert_unchanged(resnet(v, digits_dir, num_workers=2), lambda l: l.fit_one_cycle(1, 1e-3)))

def test_vision_augmentation_runs_when_profiled(digits_dir):
    "The train-only batch transforms (`aug_transforms`) and a valid-only one run as often profiled as unprofiled"
    v = _vision()
    calls = {}
    class TrainOnly(v.Transform):
        split_idx, order = 0, 99
        def encodes(self, x:v.TensorImage): calls[self.split_idx] = calls.get(self.split_idx, 0) + 1; return x
    class ValidOnly(TrainOnly): split_idx = 1
    def build():
        dls = v.ImageDataLoaders.from_folder(digits_dir, train='train', valid='valid', item_tfms=v.Resize(32), bs=32, num_workers=0,
            batch_tfms=[*v.aug_transforms(size=32), v.Normalize.from_stats(*v.imagenet_stats), TrainOnly(), ValidOnly()])
        return v.Learner(dls, v.nn.Sequential(v.nn.Conv2d(3, 4, 3), v.nn.AdaptiveAvgPool2d(1), v.nn.Flatten(), v.nn.Linear(4, 10)),
                         metrics=accuracy)
    seen = []
    for profile in (False, True):
        calls.clear()
        run(build, lambda l: l.fit(2, 1e-3), profile)
        seen.append(dict(calls))
    assert seen[0] == seen[1] and seen[0][0] == 2*6 and seen[0][1] == 2*2   # 6 train and 2 valid batches an epoch

def test_vision_fine_tune_in_profiling(digits_dir):
    "`fine_tune` (a frozen fit, then an unfrozen one) inside `learn.profiling()`: one report for both fits"
    v = _vision()
    fine_tune = lambda l: l.fine_tune(1, 1e-3, freeze_epochs=1)
    def in_profiling(learn):
        with learn.profiling(show_report=False): fine_tune(learn)
    plain = state(run(resnet(v, digits_dir), fine_tune, False))
    learn = run(resnet(v, digits_dir), in_profiling, False)   # not profiled by `run`: by the block
    diff = differences(plain, state(learn))
    assert not diff, diff
    assert_report(learn)
    assert row(learn.simple_profile_results, 'fit', 'epoch')['Number of Calls'] == 2   # both fits' epochs in one report

def test_vision_lr_find_then_profiled_fit(digits_dir):
    "`lr_find` on a profiled Learner (it restores the model and optimizer), then the fit: as without the profiler"
    v = _vision()
    def train(learn):
        learn.lr_find(num_it=8, show_plot=False)
        learn.fit_one_cycle(1, 1e-3)
    learn = assert_unchanged(resnet(v, digits_dir), train)
    assert_report(learn)
    assert row(learn.simple_profile_results, 'fit', 'epoch')['Number of Calls'] == 1   # lr_find's fit is not in the report

def test_vision_channels_last_and_mixed_precision(digits_dir):
    """`to_channelslast()` with fastai's mixed precision. fastai's `MixedPrecision` autocasts for CUDA only: on a CPU torch
    disables it (with a warning) and its `GradScaler`, so here this checks the callbacks' wiring around the profiler
    (scaled loss, the step the scaler may skip), not half-precision numerics, which need a CUDA device. (The FLOP counter
    measured this CPU's peak in fp16, a reference path: 89 s after the fit, 183 s for the test in a loaded run; it now
    measures in the type the matrix multiplications run in, fp32 here)"""
    v = _vision()
    def build():  # a small CNN (convolutions and batch norm, as channels_last is for), not the others' resnet18: the callbacks' wiring is the point
        cnn = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        return v.Learner(image_dls(v, digits_dir), cnn, metrics=accuracy).to_channelslast()
    learn = assert_unchanged(build, lambda l: l.fit(1, 1e-3))
    assert {'ChannelsLast', 'MixedPrecision'} <= {type(cb).__name__ for cb in learn.cbs}
    assert_report(learn)

def test_vision_export_and_load_learner(profiled_resnet, digits_dir, tmp_path):
    "A profiled Learner exports; `load_learner` gives a Learner that predicts as the original does"
    v = _vision()
    learn = profiled_resnet
    learn.export(tmp_path/'model.pkl')
    back = v.load_learner(tmp_path/'model.pkl')
    img = next((digits_dir/'valid').rglob('*.png'))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        a, b = learn.predict(img), back.predict(img)
    assert a[0] == b[0] and torch.equal(a[2], b[2])

def test_vision_segmentation_unet(digits_dir):
    "A segmentation `unet_learner` (resnet18 encoder, untrained) on the digits' masks"
    v = _vision()
    def build():
        dls = v.SegmentationDataLoaders.from_label_func(digits_dir, v.get_image_files(digits_dir/'train')[:128], bs=16,
            label_func=lambda p: digits_dir/'masks'/p.name, codes=['bg', 'ink'], valid_pct=0.2, seed=SEED, num_workers=0,
            item_tfms=v.Resize(32), batch_tfms=[*v.aug_transforms(size=32), v.Normalize.from_stats(*v.imagenet_stats)])
        return v.unet_learner(dls, v.resnet18, pretrained=False, n_out=2)
    learn = assert_unchanged(build, lambda l: l.fit(1, 1e-3))
    assert_report(learn)

# --------------------------------------------------------------------------------------------------------- tabular
def adult_like(n=800, seed=0):
    "A census-like DataFrame: categorical and continuous columns, missing values, a binary target"
    r = np.random.default_rng(seed)
    df = pd.DataFrame({'workclass': r.choice(['private', 'gov', 'self', None], n), 'education': r.choice(list('abcdefg'), n),
                       'age': r.integers(18, 80, n).astype(float), 'hours': r.normal(40, 10, n)})
    df.loc[r.random(n) < 0.1, 'age'] = np.nan
    df['salary'] = np.where(df.hours + (df.education > 'c')*10 + r.normal(0, 5, n) > 45, '>=50k', '<50k')
    return df

@pytest.mark.parametrize('num_workers', WORKERS)
def test_tabular(num_workers):
    "`TabularDataLoaders.from_df` with `Categorify`, `FillMissing`, `Normalize`, and a `tabular_learner`"
    from fastai.tabular.all import TabularDataLoaders, tabular_learner, Categorify, FillMissing, Normalize
    df = adult_like()
    def build():
        dls = TabularDataLoaders.from_df(df, y_names='salary', cat_names=['workclass', 'education'], cont_names=['age', 'hours'],
                                         procs=[Categorify, FillMissing, Normalize], bs=64, num_workers=num_workers)
        return tabular_learner(dls, layers=[32, 16], metrics=accuracy)
    learn = assert_unchanged(build, lambda l: l.fit_one_cycle(2, 1e-2))
    assert_report(learn)

# ------------------------------------------------------------------------------------------------------------ text
def reviews(n=240, seed=0):
    "A tiny sentiment corpus: sentences made from a positive and a negative vocabulary"
    r = np.random.default_rng(seed)
    good, bad, filler = 'great superb lovely fine best'.split(), 'awful boring poor worst dull'.split(), 'the a film was and it plot'.split()
    rows = []
    for i in range(n):
        label = i % 2
        words = r.choice(good if label else bad, 3).tolist() + r.choice(filler, int(r.integers(4, 12))).tolist()
        rows.append((' '.join(r.permutation(words)), 'pos' if label else 'neg'))
    return pd.DataFrame(rows, columns=['text', 'label'])

@pytest.mark.parametrize('num_workers', WORKERS)
def test_text_classifier(num_workers):
    """fastai's text pipeline in a `DataBlock`: `TextBlock.from_df` (tokenizer with fastai's rules over a plain
    `BaseTokenizer`, no spaCy, tokenizing in this process), `Numericalize`, the `SortedDL` of padded batches; then
    `text_classifier_learner` with an untrained AWD_LSTM"""
    from fastai.text.all import (DataBlock, TextBlock, CategoryBlock, ColReader, RandomSplitter, BaseTokenizer,
                                 text_classifier_learner, AWD_LSTM)
    df = reviews()
    def build():
        block = DataBlock(blocks=(TextBlock.from_df('text', tok=BaseTokenizer(), n_workers=0, seq_len=16), CategoryBlock),
                          get_x=ColReader('text'), get_y=ColReader('label'), splitter=RandomSplitter(0.2, seed=SEED))
        dls = block.dataloaders(df, bs=32, num_workers=num_workers)
        return text_classifier_learner(dls, AWD_LSTM, pretrained=False, drop_mult=0.5, metrics=accuracy,
                                       config=dict(emb_sz=32, n_hid=64, n_layers=2))
    learn = assert_unchanged(build, lambda l: l.fit(1, 1e-2))
    assert_report(learn)
    # the stages name the text pipeline's tokenisation, which the stage advice tells apart (tokenise once, ahead)
    from fastxtend_prof.features.stages import stage_tip
    st = learn.profile_result.payload('stages')
    names = set(st[st.Phase == 'train'].Stage)
    assert {'x: Tokenizer', 'x: Numericalize', 'before_batch: Pad_Chunk'} <= names, names
    assert [stage_tip(s)[0] for s in ('x: Tokenizer', 'x: Numericalize', 'x: ColReader')] == ['tokenisation', 'tokenisation', 'a per-item transform']

# ----------------------------------------------------------------------------------------------------------- collab
def ratings(n=2000, seed=0):
    "User-item ratings with a structure to learn: each user's and each item's bias"
    r = np.random.default_rng(seed)
    users, items = r.integers(0, 60, n), r.integers(0, 40, n)
    ub, ib = r.normal(0, 1, 60), r.normal(0, 1, 40)
    return pd.DataFrame({'user': users, 'item': items, 'rating': np.clip(3 + ub[users] + ib[items] + r.normal(0, .3, n), 0.5, 5)})

@pytest.mark.parametrize('num_workers', WORKERS)
def test_collab(num_workers):
    "`CollabDataLoaders.from_df` and a `collab_learner` (dot product with biases)"
    from fastai.collab import CollabDataLoaders, collab_learner
    df = ratings()
    def build():
        dls = CollabDataLoaders.from_df(df, valid_pct=0.2, seed=SEED, bs=64, num_workers=num_workers)
        return collab_learner(dls, n_factors=8, y_range=(0, 5.5), metrics=rmse)
    learn = assert_unchanged(build, lambda l: l.fit_one_cycle(2, 5e-3))
    assert_report(learn)

# ----------------------------------------------------------------------------------------------- plain PyTorch loaders
class NoisyDigits(torch.utils.data.Dataset):
    "scikit-learn's digits as flat tensors, each read with fresh noise: a random draw per item, in the worker that reads it"
    def __init__(self, idx):
        from sklearn.datasets import load_digits
        d = load_digits()
        self.x, self.y = torch.tensor(d.images[idx], dtype=torch.float32).flatten(1)/16, torch.tensor(d.target[idx])
    def __len__(self): return len(self.y)
    def __getitem__(self, i): return self.x[i] + 0.1*torch.randn(64), self.y[i]

@pytest.mark.parametrize('num_workers', WORKERS)
def test_plain_pytorch_loaders(num_workers):
    "torch's own `DataLoader`s (shuffled, items with random noise) in fastai `DataLoaders`: the stages time the dataset and the collation"
    from torch import nn
    from torch.utils.data import DataLoader
    from fastai.basics import Learner, DataLoaders
    def build():
        dl = lambda idx, shuffle: DataLoader(NoisyDigits(idx), batch_size=32, shuffle=shuffle, num_workers=num_workers)
        dls = DataLoaders(dl(np.arange(0, 320), True), dl(np.arange(320, 400), False))
        return Learner(dls, nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), loss_func=nn.CrossEntropyLoss(), metrics=accuracy)
    learn = assert_unchanged(build, lambda l: l.fit_one_cycle(2, 1e-2))
    st = learn.profile_result.payload('stages').set_index(['Phase', 'Stage', 'Where'])
    where = 'workers' if num_workers > 1 else 'worker 0' if num_workers else 'main'
    assert st.loc[('train', 'collate', where), 'Number of Calls'] == 2*10   # both epochs' batches
