"""Deciding a deployment: design-space sweeps on Dask (sweep.py) and plan search (search.py)."""
