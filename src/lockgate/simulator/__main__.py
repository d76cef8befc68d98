"""``python -m lockgate.simulator``: see :mod:`lockgate.simulator.cli` for the flags."""

from lockgate.simulator.cli import main

raise SystemExit(main())
