"""``python -m spherecal.cli ARGS`` is the ``spherecal`` command."""

from __future__ import annotations

from spherecal.cli.app import main

raise SystemExit(main())
