"""`speed_find` on a vision pipeline that decodes again every epoch, against a manual sweep of workers × caching.

The issue's case: a fastai `DataBlock` over 256-pixel PNG files (`--images`, digits upscaled with noise, written once to
`--root`), `Resize(32)` as its item transform, `aug_transforms()` as batch transforms, batches of 16, a small CNN, on
the CPU, from `num_workers=0`. Each repeat runs

- the sweep: a fresh Learner for every configuration of `num_workers` 0..`--max-workers` × the item cache off and on
  (`fastxtend_prof.cache.cache_loaders`, its filling counted in the configuration's time) × where the resize runs (on
  each item, `Resize(32)`, or on the batch, `aug_transforms(size=32)` with no item resize: another interpolation, so
  not a change speed_find makes unasked), measured by the tuner's own `run_trial` (40 steady train batches after 3 of
  warmup, without the callbacks a trial sets aside); the sweep's time is the sum of its configurations';
- `learn.speed_find()` from the start configuration: its own wall time, and the configuration it kept.

It prints each configuration's samples/s (medians over the repeats), speed_find's choice, its speed-up over the start,
the share of the sweep's best throughput that choice reaches (its own sweep median), and speed_find's time against the
sweep's. The issue's bar: at least 2.5× the start, 90% of the best, a third of the sweep's time.

    python benchmarks/speed_find_pipeline.py                 # 640 images, 0..3 workers, 3 repeats (about 5 minutes)
"""
import argparse, os, time, warnings
from pathlib import Path
os.environ.setdefault('OMP_NUM_THREADS', '1')
warnings.simplefilter('ignore')
import numpy as np

def make_images(root:Path, n:int):
    "`n` 256-pixel RGB PNG files of digits, upscaled with noise, a folder per class (kept between runs)"
    if len(list(root.glob('*/*.png'))) >= n: return
    from PIL import Image
    from sklearn.datasets import load_digits
    d, rng = load_digits(), np.random.default_rng(0)
    for i in range(n):
        img = np.kron(d.images[i % len(d.images)]/16, np.ones((32, 32)))*200
        img = np.clip(img[..., None] + rng.normal(0, 20, (256, 256, 3)), 0, 255).astype(np.uint8)
        p = root/str(d.target[i % len(d.images)]); p.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p/f'{i}.png')

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--root', default='/tmp/fxp_png256', help='where the PNG files are written once')
    p.add_argument('--images', type=int, default=640)
    p.add_argument('--max-workers', type=int, default=3)
    p.add_argument('--repeats', type=int, default=3)
    a = p.parse_args()
    root = Path(a.root); make_images(root, a.images)
    from fastai.vision.all import (DataBlock, ImageBlock, CategoryBlock, get_image_files, parent_label, RandomSplitter, Resize,
                                   aug_transforms, Learner, nn, set_seed, accuracy)
    import fastxtend_prof.all  # noqa: F401
    from fastxtend_prof.cache import cache_loaders
    from fastxtend_prof.tune import run_trial, set_aside, _measured
    files = get_image_files(root)[:a.images]
    def learner(nw, where='item'):
        set_seed(0)
        db = DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=lambda _: files, splitter=RandomSplitter(0.2, seed=0), get_y=parent_label,
                       item_tfms=Resize(32) if where == 'item' else None, batch_tfms=aug_transforms(size=None if where == 'item' else 32))
        model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        return Learner(db.dataloaders(root, bs=16, num_workers=nw, device='cpu'), model, metrics=accuracy)
    configs = [(w, c, where) for where in ('item', 'batch') for c in (False, True) for w in range(a.max_workers + 1)]
    rates, sweep_s, find_s, chosen, find_rate = {c: [] for c in configs}, [], [], [], []
    for r in range(a.repeats):
        total = 0.
        for w, c, where in configs:
            learn = learner(w, where)
            t0 = time.perf_counter()
            if c: cache_loaders(learn, loaders=[learn.dls.train])
            with learn.removed_cbs(set_aside(learn)): prof = run_trial(learn, 40, 3, time.monotonic() + 600)
            total += time.perf_counter() - t0
            rates[(w, c, where)].append(_measured(prof)['Samples/s'])
        sweep_s.append(total)
        learn = learner(0)
        t0 = time.perf_counter()
        res = learn.speed_find(max_time=300, show=False)
        find_s.append(time.perf_counter() - t0)
        kept = {f.kind: f.value for f in res.fixes}
        chosen.append((kept.get('num_workers', 0), 'cache_items' in kept, 'item'))
        find_rate.append(res.trials['Samples/s'][res.trials.Accepted].iloc[-1] if res.trials.Accepted.any() else res.trials['Samples/s'][0])
        print(f'repeat {r + 1}: sweep {total:.1f} s, speed_find {find_s[-1]:.1f} s, kept {res.fixes and ", ".join(f.name for f in res.fixes) or "nothing"}', flush=True)
    med = {c: float(np.median(v)) for c, v in rates.items()}
    name = lambda c: f'num_workers={c[0]}' + (', item cache' if c[1] else '') + ('' if c[2] == 'item' else ', resize on the batch')
    print('\nconfiguration                                        samples/s (median of repeats)')
    for c in configs: print(f'  {name(c):<50} {med[c]:8,.0f}')
    best, start = max(med, key=med.get), med[(0, False, 'item')]
    for i, c in enumerate(chosen):
        print(f'repeat {i + 1}: speed_find chose {name(c)}: {med[c]/start:.2f}x the start, {med[c]/med[best]:.0%} of the sweep\'s best '
              f'({name(best)}), its own trial {find_rate[i]:,.0f} samples/s; {find_s[i]:.1f} s against the sweep\'s {sweep_s[i]:.1f} s '
              f'({find_s[i]/sweep_s[i]:.0%})')

if __name__ == '__main__': main()
