"""Benchmark: GET /v1/stats latency under 50 concurrent clients, against GET /healthz.

Starts a local Ray, an orchestrator actor with scripted rollouts (a few batches filled so the
stats are not empty), and the REST service on a free loopback port. Then C concurrent
clients (own connection each, one request at a time) send R requests each to an endpoint.
The reference is ``GET /healthz`` in the same process: the same Serve proxy, replica and one
actor round trip (``ping``), so the ratio isolates what ``stats()`` and its response model
cost. Endpoints are measured in alternating blocks to share any drift. The load generator
runs on the same machine, so absolute numbers include its CPU contention (2 cores here).

Usage: python bench/bench_rest.py [--clients 50] [--requests 40] [--blocks 2]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _client(url: str, path: str, n: int, out: list[float], errors: list[int]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            r = await c.get(path)
            out.append(time.perf_counter() - t0)
            if r.status_code != 200:
                errors.append(r.status_code)


async def _load(url: str, path: str, clients: int, requests: int) -> tuple[list[float], float, list[int]]:
    lat: list[float] = []
    errors: list[int] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(_client(url, path, requests, lat, errors) for _ in range(clients)))
    return lat, time.perf_counter() - t0, errors


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=40, help="requests per client per block")
    ap.add_argument("--blocks", type=int, default=2)
    args = ap.parse_args()

    import ray
    from ray import serve

    from orchestrator.service.config import OrchestratorConfig, ensure_orchestrator
    from orchestrator.service.serve import build_app

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    try:
        orch_cfg = OrchestratorConfig(name="dso-bench", detached=False, policy={"target_groups": 8, "group_size": 8},
                                      tasks={"kind": "scripted", "count": 256})
        handle = ensure_orchestrator(orch_cfg)
        for _ in range(20):
            ray.get(handle.next_batch.remote())
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({"orchestrator": None, "service": {"actor_name": "dso-bench", "auth_token": ""}}),
                  name="dso-bench", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        asyncio.run(_load(url, "/healthz", 10, 5))  # warm-up: connections, replica, first calls
        asyncio.run(_load(url, "/v1/stats", 10, 5))
        res: dict[str, dict] = {p: {"lat": [], "wall": 0.0, "errors": []} for p in ("/healthz", "/v1/stats")}
        for _ in range(args.blocks):
            for path in ("/healthz", "/v1/stats"):
                lat, wall, errors = asyncio.run(_load(url, path, args.clients, args.requests))
                res[path]["lat"] += lat
                res[path]["wall"] += wall
                res[path]["errors"] += errors
    finally:
        serve.shutdown()
        ray.shutdown()

    print(f"REST latency, {args.clients} concurrent clients x {args.requests} requests x {args.blocks} blocks per endpoint")
    print(f"{'endpoint':<12} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>8} {'errors':>7}")
    summary = {}
    for path, r in res.items():
        lat = r["lat"]
        summary[path] = {"p50": _pct(lat, 0.5), "p95": _pct(lat, 0.95), "p99": _pct(lat, 0.99),
                         "mean": statistics.fmean(lat), "rps": len(lat) / r["wall"]}
        s = summary[path]
        print(f"{path:<12} {s['p50'] * 1e3:8.1f} {s['p95'] * 1e3:8.1f} {s['p99'] * 1e3:8.1f} {s['mean'] * 1e3:8.1f} "
              f"{s['rps']:8.0f} {len(r['errors']):7d}")
    st, hz = summary["/v1/stats"], summary["/healthz"]
    print(f"ratio /v1/stats : /healthz   p50 {st['p50'] / hz['p50']:.2f}   p95 {st['p95'] / hz['p95']:.2f}   "
          f"throughput {st['rps'] / hz['rps']:.2f}")
    if res["/v1/stats"]["errors"] or res["/healthz"]["errors"]:
        raise SystemExit("some requests failed")


if __name__ == "__main__":
    main()
