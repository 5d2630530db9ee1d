"""``xdpx doctor``: the report (``report``: environment, config, data) and the training
checklist (``checklist``)."""
