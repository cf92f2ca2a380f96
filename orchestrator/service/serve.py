"""The Ray Serve deployment of the REST app and its application builder.

Run it with :func:`build_app` (the ``import_path`` of Serve config files and of KubeRay's
RayService: ``orchestrator.service.serve:build_app``), or ``trinity-dso serve``.
"""

from __future__ import annotations

import socket

from fastapi import FastAPI

from orchestrator.service.api import ServiceSettings
from orchestrator.service.app import create_app
from orchestrator.service.config import ServeConfig, ensure_orchestrator
from orchestrator.service.names import DEFAULT_NAMESPACE


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




def serve_actor(actor_name: str, *, namespace: str = DEFAULT_NAMESPACE, port: int = 0, app_name: str = "dso") -> str:
    """Start Ray Serve's HTTP proxy on 127.0.0.1 and deploy the REST app (with its live page) for a named actor.

    For a job that creates its orchestrator actor itself (``trinity-dso train``): the app looks the
    actor up by name on each request, so it may be deployed before the actor exists (it answers
    503 until then). Call it in a driver whose Ray (``ray.init``) has no Serve yet. The bearer
    token is read from ``$DSO_API_TOKEN`` (none: policy changes are open to whoever reaches the
    loopback port).

    Args:
        actor_name, namespace: the orchestrator actor's name and Ray namespace.
        port: the proxy's port; 0 picks a free one.
        app_name: the Serve application's name.
    Returns:
        The app's base URL, ``http://127.0.0.1:<port>`` (the page is ``<url>/dashboard``).
    """
    from ray import serve

    if port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app({"orchestrator": None, "service": {"actor_name": actor_name, "namespace": namespace,
                                                           "app_name": app_name, "port": port}}),
              name=app_name, route_prefix="/")
    return f"http://127.0.0.1:{port}"
