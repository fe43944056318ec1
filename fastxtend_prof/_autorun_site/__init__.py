"""The folder `fastxtend-prof run --env` puts on PYTHONPATH, for its `sitecustomize.py` (written by hand, see nbs/31_run.ipynb)."""
# This file only makes the folder a package, so that the wheel holds it.
