"""The Ray Serve deployment of the REST app and its application builder.

Run it with :func:`build_app` (the ``import_path`` of Serve config files and of KubeRay's
RayService: ``orchestrator.service.serve:build_app``), or ``trinity-dso serve``.
"""

from __future__ import annotations

from fastapi import FastAPI

from orchestrator.service.api import ServiceSettings
from orchestrator.service.app import create_app
from orchestrator.service.config import ServeConfig, ensure_orchestrator


def _deployment():
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    @serve.ingress()
    class DSOService:
        """Ray Serve deployment: the FastAPI app of :func:`create_app` bound to the named actor."""

        def __init__(self, settings: dict):
            from orchestrator.service.logs import enable_service_logging

            enable_service_logging()
            self.settings = ServiceSettings.model_validate(settings)

        def __serve_build_asgi_app__(self) -> FastAPI:
            return create_app(self.settings)

    return DSOService


DSOService = _deployment()


def build_app(args: dict | None = None):
    """Serve application builder (``import_path: orchestrator.service.serve:build_app``).

    Args:
        args: a ``serve`` config (:class:`ServeConfig` as a dict: ``service``, optional
            ``orchestrator``). With an ``orchestrator`` section whose ``create`` is true, the
            named actor is created (detached) when absent.
    Returns:
        The bound Serve application.
    """
    cfg = ServeConfig.model_validate(args or {})
    if cfg.orchestrator is not None and cfg.orchestrator.create:
        ensure_orchestrator(cfg.orchestrator)
    s = cfg.service
    settings = s.model_dump()
    if settings["auth_token"] is None:  # resolve here too, where the driver's environment is
        settings["auth_token"] = s.token() or ""
    return DSOService.options(num_replicas=s.num_replicas, max_ongoing_requests=s.max_ongoing_requests).bind(settings)


