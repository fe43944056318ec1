"""What handing out a kept item as a copy costs (`fastxtend_prof.tune.cache.copy_item`, which `ItemCache.get` calls so a
later transform that changes its input in place cannot change the kept item), beside what the cache saves: decoding
the same image from a JPEG and a PNG file. The items are those a vision `DataBlock` keeps: a decoded PIL image, the
tensor `ToTensor` makes, with their label; the medians of `--repeat` timings of `--number` calls each, one thread.

    python benchmarks/cache_copy.py
"""
import argparse, io, os, timeit
os.environ.setdefault('OMP_NUM_THREADS', '1')
import numpy as np, torch
from PIL import Image
from fastai.vision.all import PILImage, TensorImage, TensorCategory, ToTensor
from fastxtend_prof.tune.cache import copy_item, same_item

def photo(w:int, h:int) -> np.ndarray:
    "A smooth image with some texture, as a photograph compresses (noise alone would make JPEG's decode unusually slow)"
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    img = np.stack([np.sin(x/17 + c) * np.cos(y/23 - c) for c in range(3)], -1)*100 + 128 + rng.normal(0, 8, (h, w, 3))
    return img.clip(0, 255).astype(np.uint8)

def timed(f, number:int, repeat:int) -> float:
    "Median seconds a call"
    return float(np.median(timeit.repeat(f, number=number, repeat=repeat)))/number

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--number', type=int, default=500)
    p.add_argument('--repeat', type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for w, h in [(224, 224), (500, 375)]:
        arr = photo(w, h)
        files = {}
        for fmt in ('JPEG', 'PNG'):
            b = io.BytesIO(); Image.fromarray(arr).save(b, fmt); files[fmt] = b.getvalue()
        im = PILImage.create(arr)
        t = ToTensor()(im)
        assert isinstance(t, TensorImage)
        decode = {fmt: timed(lambda d=d: PILImage.create(io.BytesIO(d)).load(), a.number//5, a.repeat) for fmt, d in files.items()}
        for name, item in [(f'PIL image {w}×{h}, label', (im, TensorCategory(3))), (f'uint8 tensor 3×{h}×{w}, label', (t, TensorCategory(3)))]:
            assert same_item(copy_item(item), item)
            c = timed(lambda: copy_item(item), a.number, a.repeat)
            rows.append((name, c, decode['JPEG'], decode['PNG']))
    print(f"{'item':<34}{'copy':>10}{'JPEG decode':>14}{'PNG decode':>13}{'copy/JPEG':>11}")
    for name, c, j, pg in rows:
        print(f'{name:<34}{c*1e6:>8.1f} µs{j*1e6:>11.0f} µs{pg*1e6:>10.0f} µs{c/j:>10.1%}')

if __name__ == '__main__': main()
