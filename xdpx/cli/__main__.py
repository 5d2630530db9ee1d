"""``python -m xdpx.cli ...``: the ``xdpx`` command."""

from xdpx.cli import main

main()
