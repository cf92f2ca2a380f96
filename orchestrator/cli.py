"""The ``trinity-dso`` command line (typer). Nothing imports this module."""

from __future__ import annotations

import typer

app = typer.Typer(help="trinity-dso: dynamic sampling orchestrator for DAPO and GiGPO.", no_args_is_help=True)


@app.command()
def demo() -> None:
    """Run the main job on embedded defaults (placeholder, being written)."""
    raise typer.Exit(1)


try:  # the service commands (serve, policy, status) live in their own module
    from orchestrator.cli_service import register as _register_service
except ImportError:  # pragma: no cover - while it is being written
    _register_service = None
if _register_service is not None:
    _register_service(app)
