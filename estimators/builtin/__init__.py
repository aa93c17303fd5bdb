"""The built-in advantage estimators, one module each: its settings model and its `@estimator` function.

A new built-in is one more module here, nothing else: the catalog imports every module of this package
and takes the spec of each `@estimator` function in it. So these modules import no torch at their top
level (the launcher reads the catalog): the torch helpers they call (`tokens.py`) import it when called.
"""
