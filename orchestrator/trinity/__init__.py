"""Trinity-RFT adapters; importing any of them registers all of them (see :mod:`orchestrator.trinity.plugin`)."""

from orchestrator.trinity import plugin as _plugin  # noqa: F401  registers the dso_* components
