"""The ``spherecal`` command line: one module per command.

``app``  the parser and ``main`` (the ``spherecal`` console script; ``python -m spherecal``,
         ``python -m spherecal.cli``)
``exit_codes``  :class:`~spherecal.cli.exit_codes.ExitCode` and the error contract
``options``  the federation options, defined once, defaults from the config dataclasses
``reference``  ``spherecal reference``: the in-process reference federation
``simulate``  ``spherecal simulate``: a coordinator and N participants on loopback
``coordinator``  ``spherecal coordinator``: the server process
``participant``  ``spherecal participant``: one site's process
``certs``  ``spherecal certs``: a development CA for mutual TLS
``experiment``  ``spherecal experiment``: the methods of the papers side by side
``audit``  ``spherecal audit``: the privacy report
``report``  ``spherecal report``: a run drawn as one HTML page (loss, accuracy, calibration)
``status``  ``spherecal status``: a running federation, one screen
``predict``  ``spherecal predict``: classify data with a saved model

Each command module has ``NAME``, ``HELP``, ``register(subparsers)`` and ``run(args)``
and imports nothing heavy at module level; this ``__init__`` imports nothing, so that
:mod:`spherecal.daemon` can run ``coordinator`` / ``participant`` without loading the
other commands.
"""
