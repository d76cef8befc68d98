"""``python -m lockgate.cli``: the ``lockgate`` command."""

from lockgate.cli import main

main()
