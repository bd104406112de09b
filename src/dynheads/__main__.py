"""``python -m dynheads`` is the ``dynheads`` command."""

from dynheads.cli import main

main()
