"""Orchestrators of stages: the Prefect flow (``pipeline``), ``xdpx tune`` (``tune``) and
``xdpx suite`` (``suite``). They reach stages through ``stages.registry.STAGES`` and call them
as functions with config objects. Imports go one way: flows -> stages -> xdpx core.
"""
