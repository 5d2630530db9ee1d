"""`xdpx doctor`: the report (environment, config, data: report) and the training checklist (checklist)."""
