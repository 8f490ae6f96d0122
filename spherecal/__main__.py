"""``python -m spherecal ARGS`` is the ``spherecal`` command (as ``python -m
spherecal.cli``): for an environment whose ``bin/`` is not on ``PATH``, or to choose
the interpreter that runs it."""

from __future__ import annotations

from spherecal.cli.app import main

raise SystemExit(main())
