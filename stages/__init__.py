"""Pipeline stages: ``python -m stages.<name>``, one per ``params.yaml`` section."""
