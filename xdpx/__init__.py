"""xdpx: a reproducible NLU training pipeline (DVC + Prefect + PyTorch)."""

__version__ = "0.1.0"
