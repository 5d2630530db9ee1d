"""Studies over many runs, in plain Python (no Prefect): the benchmark suite (``suite``:
``xdpx suite``, its corpora ``corpora`` and the which-model pictures ``which_model``), the
hyper-parameter study (``tune``: ``xdpx tune`` on Optuna) and the record of a run's
environment (``record``). They reach stages through ``stages.registry.STAGES``; imports go
one way: flows -> studies -> stages -> xdpx core.
"""
