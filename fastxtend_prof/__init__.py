__version__ = "0.1.0"

# Not generated (nbdev keeps only `__version__` here). `%load_ext fastxtend_prof` profiles every fit of the session until
# `%unload_ext fastxtend_prof`; the work is in `fastxtend_prof.autorun` (nbs/31_run.ipynb), imported only then, so that
# `import fastxtend_prof` stays light: no torch, no fastai.
def load_ipython_extension(ip):
    "`%load_ext fastxtend_prof`: profile every fit of the session, each with its report"
    from .autorun import load_ipython_extension
    load_ipython_extension(ip)

def unload_ipython_extension(ip):
    "`%unload_ext fastxtend_prof`: stop profiling every fit"
    from .autorun import unload_ipython_extension
    unload_ipython_extension(ip)
