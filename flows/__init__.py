"""Prefect flows: thin tasks around ``stages.*.run``."""
