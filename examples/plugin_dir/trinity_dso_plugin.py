import orchestrator.trinity.plugin  # noqa: F401  registers the dso_* algorithms, losses, advantage fns, operator and selector into Trinity-RFT
