"""``mmt dashboard``: a live local page over job dirs (status, node metrics, training curves, per-rank logs).

It only reads what the engine and the recipes leave in each job dir (see :mod:`mmt.core.jobdir`), so it works for
running and finished jobs of every backend. :mod:`.data` reads job dirs (no web), :mod:`.app` is the Starlette
app, :mod:`.server` the command line. Nothing is loaded from the network: the charting library is vendored
in ``static/vendor``.
"""
