"Test doubles shared by the pytest files (pytest puts this folder on the path: `from fakes import MirrorTimer`)."
import time

class MirrorTimer:
    "A device timer whose events are host timestamps: the whole `sync='events'` pipeline runs on a CPU"
    def __init__(self): self.queries = 0
    def record(self): return time.perf_counter()
    def elapsed(self, a, b): return b - a
    def ready(self, e): self.queries += 1; return True
    def synchronize(self): pass

class ManualClock:
    "A clock that returns `t`, which the test advances"
    t = 0.0
    def __call__(self): return self.t
