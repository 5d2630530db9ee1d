"""The Prefect flows, and only they: ``pipeline`` (``xdpx_pipeline``), ``cv``
(``xdpx_cv``) and ``distill`` (``xdpx_distill``). They reach stages through
``stages.registry.STAGES`` and call them as functions with config objects; the benchmark
suite, the tuning study and their reports, in plain Python, are :mod:`studies`. Imports go
one way: flows -> studies -> stages -> xdpx core.
"""

import os as _os

# A quiet first contact: Prefect's temporary server sends a telemetry heartbeat to Prefect
# Cloud (unreachable offline: an ERROR) that writes to the same SQLite file as the flow run
# ("database is locked": a 40-line traceback) before every first flow. xdpx turns it off
# unless the user set it (PREFECT_SERVER_ANALYTICS_ENABLED=true turns it back on). Set
# before any flow module imports prefect, whose settings read the environment once.
_os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
