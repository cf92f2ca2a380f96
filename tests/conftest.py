"""Shared pytest fixtures: real servers, started and cleaned up by the tests themselves.

Redis:
* ``redis_server`` - a private ``redis-server`` on a free 127.0.0.1 port (no persistence),
  as a :class:`RedisServer` handle with ``url``, ``kill()``, ``start()`` and ``restart()``;
  for tests that break the server on purpose.
* ``redis_url`` - the machine's shared server at 127.0.0.1:6379 (``DSO_TEST_REDIS_URL``
  overrides); ``redis_namespace`` - a unique key prefix on it whose keys are deleted before
  and after the test. Tests on the shared server must only touch keys under that prefix.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field

import pytest

SHARED_REDIS_URL = os.environ.get("DSO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A ``redis-server`` process owned by one test (``--save '' --appendonly no``).

    ``kill()`` SIGKILLs it (all data is lost), ``start()`` starts it again on the same port,
    ``restart()`` does both. The port stays fixed so clients reconnect to the same URL.
    """

    port: int
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout}s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def redis_server():
    """A private redis-server on a free port; yields a :class:`RedisServer` (``.url``)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH")
    server = RedisServer(port=_free_port())
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_url():
    """URL of the shared Redis server (127.0.0.1:6379); skips when it does not answer."""
    import redis

    client = redis.Redis.from_url(SHARED_REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"shared Redis at {SHARED_REDIS_URL} is not reachable: {exc}")
    finally:
        client.close()
    return SHARED_REDIS_URL


@pytest.fixture
def redis_namespace(redis_url):
    """A unique key prefix on the shared server; its keys are deleted before and after."""
    import redis

    prefix = f"dso-test:{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(redis_url)

    def flush() -> None:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)

    flush()
    try:
        yield prefix
    finally:
        flush()
        client.close()


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray runtime for the whole test session (2 CPUs, no dashboard)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    yield ray
    ray.shutdown()


# --------------------------------------------------------------------------- REST service (Ray Serve)


@pytest.fixture(scope="session")
def serve_http(ray_local):
    """Ray Serve's HTTP proxy on a free 127.0.0.1 port for the session; yields its base URL."""
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


@dataclass
class DSOService:
    """The REST app deployed for one test module, and a factory of fresh orchestrator actors behind it."""

    url: str
    actor_name: str
    token: str | None
    handle: object = None

    def orchestrator(self, policy: dict, script: dict | None = None, default: list | None = None, *,
                     source: object = None, **kwargs):
        """Replace the actor behind the service by a fresh one (scripted rollouts, or ``source``; fresh metrics)."""
        import ray

        from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks
        from orchestrator.service.actor import get_or_create_orchestrator
        from orchestrator.service.metrics import DSOMetrics

        self.stop()
        tasks = kwargs.pop("tasks", sorted((script or {}).keys()) or ["t0"])
        self.handle = get_or_create_orchestrator(
            policy, ScriptedTasks(tasks), source or ScriptedRolloutSource(script, default=default),
            metrics=DSOMetrics(), name=self.actor_name, **kwargs,
        )
        ray.get(self.handle.ping.remote())
        return self.handle

    def stop(self) -> None:
        """Kill the current actor and wait until its name is free."""
        import ray

        if self.handle is None:
            return
        ray.kill(self.handle)
        self.handle = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(self.actor_name, namespace="trinity-dso")
            except ValueError:
                return
            time.sleep(0.05)
        raise RuntimeError(f"actor {self.actor_name} still registered 30 s after ray.kill")


@pytest.fixture(scope="module")
def dso_service(serve_http, request):
    """``orchestrator.service.app`` deployed at ``/`` of :func:`serve_http` for one test module.

    The module may set ``DSO_TOKEN`` (bearer token; default none). Yields a :class:`DSOService`;
    call ``.orchestrator(policy, script)`` in each test for a fresh actor behind it.
    """
    from ray import serve

    from orchestrator.service.serve import build_app

    name = "dso-" + request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    token = getattr(request.module, "DSO_TOKEN", None)
    app = build_app({"orchestrator": None, "service": {"actor_name": name, "auth_token": token or "", "app_name": name}})
    serve.run(app, name=name, route_prefix="/")
    service = DSOService(url=serve_http, actor_name=name, token=token)
    try:
        yield service
    finally:
        service.stop()
        serve.delete(name)
