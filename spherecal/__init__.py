"""spherecal: privacy-hardened federated calibration — one import namespace.

The components ``proto``, ``crypto``, ``spherefed``, ``participant`` and
``coordinator`` (``spherecal.crypto`` …: links to the repository's top-level folders)
and the composition root (the CLI, configs, simulate, certs, experiment, audit, logs)
all live under this one name.
Importing ``spherecal`` loads nothing else: every process imports only what it runs.

The composition root's own modules:

``cli``       the ``spherecal`` command line, one module per command
``__main__``  ``python -m spherecal ARGS``: the ``spherecal`` command
``daemon``    the entry point of a coordinator or participant process (``simulate``'s)
``config``    the TOML files of ``spherecal coordinator`` and ``spherecal participant``
``config_schema``
              the TOML shape of the settings dataclasses, read, written and documented
``config_docs``
              the config key tables of ``docs/deployment.md``, generated
``argtypes``  argument types the subcommands share
``preflight`` what a service process checks before any work (files, directories, the
              dates of its certificate and CA)
``outputs``   an output path checked writable before any work
``logs``      one log line format (text or JSON) for every process
``certs``     a development CA: certificates from the sites' requests, revocation, pins
``status``    ``spherecal status``: a running federation on one screen
``predict``   ``spherecal predict``: a site's own data through a saved model
``simulate``  ``spherecal simulate``: a whole federation as processes on loopback
``engines``   simulation engines beyond one process per participant (threads, Ray)
``inprocess_transport``
              a participant's transport over the coordinator's service core, no sockets
``experiment``
              ``spherecal experiment``: every method of the papers side by side
``results_schema``
              the shapes of ``results.json``, ``audit.json`` and the experiment's files
``audit``     ``spherecal audit PATH``: the privacy report of a run
``audit_report``
              the audit in plain words, for the text and the HTML report
``audit_html``
              ``spherecal audit --html``: the one-page report for a privacy officer
``audit_integrity``
              the audit's integrity section
``audit_policy``
              the audit's section on the sites' refusals and the exclusions
``site_audit``
              ``spherecal audit --site``: a site's own audit from its release ledger
``timing_channel``
              when each site sent each message, and how that follows its example count
``run_report``
              ``spherecal report``: a run drawn as one HTML page
``html_style``
              the look the self-contained HTML pages share
``baselines_docs``
              the committed result tables copied into ``docs/baselines.md``
``generated_pages``
              the one command shape of a docs page with generated blocks
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("spherecal")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
