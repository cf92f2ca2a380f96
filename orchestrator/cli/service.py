"""The service commands of ``trinity-dso``: ``serve``, ``policy get|set``, ``status``.

``serve`` starts Ray (or joins a cluster), the named orchestrator actor and the REST service
from a YAML config (:class:`orchestrator.service.config.ServeConfig`). The other commands are clients
of the REST API only (httpx): they work against any running service, local or remote.

Client options: ``--url`` (``$DSO_URL``, default ``http://127.0.0.1:8000``) and ``--token``
(``$DSO_API_TOKEN``) for the mutating ones.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.core.errors import describe_errors
from orchestrator.core.stats import BatchStats, Stats

DEFAULT_URL = "http://127.0.0.1:8000"

URL_OPTION = typer.Option(DEFAULT_URL, "--url", envvar="DSO_URL", help="Base URL of the REST service.")
TOKEN_OPTION = typer.Option(None, "--token", envvar="DSO_API_TOKEN", help="Bearer token for changes.", show_default=False)


# --------------------------------------------------------------------------- helpers


def parse_assignments(pairs: list[str]) -> dict[str, Any]:
    """``["target_groups=4", "filter.band=[0.1, 0.9]"]`` -> nested dict; values parsed as YAML scalars.

    Raises:
        typer.BadParameter: an item without ``=`` or with an empty key (names it).
    """
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE (e.g. target_groups=4 or filter.std_tol=0.01)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise typer.BadParameter(f"{pair!r}: {part} is both a value and a section")
        node[parts[-1]] = value
    return out


def _client(url: str, token: str | None = None):
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30)


_AUTH_HINTS = {
    401: " (this CLI sends the token of DSO_API_TOKEN or --token: set one)",
    403: " (this CLI sent the token of DSO_API_TOKEN or --token: it is not the service's)",
}


def _request(url: str, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
    """One REST call; prints the service's error message and exits 1 on any 4xx/5xx or connection error."""
    import httpx
    from rich.console import Console

    err = Console(stderr=True)
    try:
        with _client(url, token) as c:
            r = c.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        err.print(f"cannot reach {url}: {exc}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if r.status_code >= 400:
        try:
            msg = r.json().get("message", r.text)
        except ValueError:
            msg = r.text
        hint = _AUTH_HINTS.get(r.status_code, "")
        # unwrapped (the message stays on one line) and not read as markup (it quotes the input)
        err.print(f"{method} {path}: HTTP {r.status_code}: {msg}{hint}", style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1)
    return r.json()


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in x.items() if v) or "0"
    if isinstance(x, list):
        tail = x[-10:]
        return ("... " if len(x) > 10 else "") + " ".join(map(str, tail)) if x else "-"
    return str(x)


def status_table(stats: dict, url: str = ""):
    """A rich table of ``GET /v1/stats``: every :class:`~orchestrator.core.stats.Stats` field under its title."""
    from rich.table import Table

    t = Table(title=f"trinity-dso status {url}".strip())
    t.add_column("measure")
    t.add_column("value", justify="right")
    for key, field in Stats.model_fields.items():
        if key == "last_batch" and isinstance(stats.get(key), dict):
            for sub, sub_field in BatchStats.model_fields.items():
                t.add_row(sub_field.title or sub, _fmt(stats[key].get(sub)))
        elif key == "last_error" and isinstance(stats.get(key), dict):
            e = stats[key]
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.get("time") or 0))
            step = f", explore step {e['step']}" if e.get("step") is not None else ""
            t.add_row(field.title or key, f"{e.get('kind')} at {when}{step}: {e.get('message')}")
        elif key == "errors" and isinstance(stats.get(key), dict):
            t.add_row(field.title or key, ", ".join(f"{k} {v}" for k, v in stats[key].items()) or "-")
        elif key in stats:
            t.add_row(field.title or key, _fmt(stats[key]))
    return t


# --------------------------------------------------------------------------- serve


def load_yaml_model(path: Path | None, model: type, overrides: dict[str, Any] | None = None):
    """Read a YAML mapping (or nothing), apply ``overrides`` and validate it as ``model``.

    Args:
        path: a YAML file with a mapping at the top level, or None for the model's defaults.
        model: a pydantic model class.
        overrides: ``{"key": value}`` or ``{"section.key": value}``; None values are skipped
            (an option the user did not give).
    Raises:
        typer.BadParameter: the file is not a mapping, or the result does not validate (the
            message names the field and the value).
    """
    import yaml
    from pydantic import ValidationError

    data = (yaml.safe_load(Path(path).read_text()) or {}) if path is not None else {}
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path}: expected a mapping at the top level")
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        section, _, key = dotted.rpartition(".")
        if section:
            data[section] = {**(data.get(section) or {}), key: value}
        else:
            data[key] = value
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise typer.BadParameter(f"{path or 'defaults'}: {describe_errors(err.errors())}") from None


def load_serve_config(path: Path, overrides: dict[str, Any] | None = None):
    """Read and validate a ``serve`` YAML config (``orchestrator.service.config.ServeConfig``)."""
    from orchestrator.service.config import ServeConfig

    return load_yaml_model(path, ServeConfig, overrides)


def run_service(cfg, *, block: bool = True, on_ready=None) -> None:
    """Start Ray, the orchestrator actor and the REST service; block until SIGINT/SIGTERM.

    With ``driver.enabled``, pull batches in a loop (a stand-in for a trainer). A SIGINT
    (Ctrl-C) during start-up is remembered and stops the service as soon as it is up (a
    second one ends the process at once): the handler is set before Ray starts, because a
    ``KeyboardInterrupt`` raised in parts of Ray's start-up was swallowed and the process
    served on.
    """
    import ray
    from ray import serve

    from orchestrator.service.calls import ActorCalls
    from orchestrator.service.config import ensure_orchestrator
    from orchestrator.service.serve import build_app

    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    def _stop_after_start(*_: Any) -> None:
        stop["now"] = True
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the process at once
        typer.echo("stopping once start-up is done (Ctrl-C again to quit now)", err=True)

    if block:
        signal.signal(signal.SIGINT, _stop_after_start)

    if not ray.is_initialized():
        init: dict[str, Any] = {"namespace": cfg.orchestrator.namespace if cfg.orchestrator else "trinity-dso",
                                "log_to_driver": True}  # the actor's policy-change and resume lines
        if cfg.ray.address:
            init["address"] = cfg.ray.address
        else:
            init.update(include_dashboard=False, num_cpus=cfg.ray.num_cpus)
        try:
            ray.init(**init)
        except ConnectionError as err:
            raise typer.BadParameter(
                f"ray.address: no Ray cluster answered at {cfg.ray.address!r} ({str(err).splitlines()[0]}); start one "
                "first (ray start --head), or set ray.address: null to start a local Ray; if `ray status` says "
                "InvalidAuthToken, the cluster uses token authentication: export RAY_AUTH_MODE=token"
            ) from None
    s = cfg.service
    if cfg.orchestrator is not None and cfg.orchestrator.create:  # create: false - a Trinity run creates it
        ensure_orchestrator(cfg.orchestrator)
    serve.start(http_options={"host": s.host, "port": s.port})
    serve.run(build_app(cfg.model_dump()), name=s.app_name, route_prefix=s.route_prefix)
    url = f"http://{'127.0.0.1' if s.host in ('0.0.0.0', '::') else s.host}:{s.port}{s.route_prefix.rstrip('/')}"
    if on_ready is not None:
        on_ready(url)
    if not block:
        return
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)  # ray.init set its own
    # the driver's calls are re-sent, with the same call id, while the actor restarts
    calls = ActorCalls(name=s.actor_name, namespace=s.namespace) if cfg.driver.enabled else None
    emitted = 0
    while not stop["now"]:
        if calls is not None and (cfg.driver.max_batches is None or emitted < cfg.driver.max_batches):
            try:
                batch = calls.call("next_batch", timeout_s=1.0, call_id=uuid.uuid4().hex)
            except Exception as exc:  # noqa: BLE001 - keep serving; show why the driver paused
                typer.echo(f"driver: next_batch failed: {exc}", err=True)
                time.sleep(2.0)
                continue
            if batch is not None:
                emitted += 1
                time.sleep(cfg.driver.interval_s)
        else:
            time.sleep(0.5)
    typer.echo("stopping the REST service")
    serve.delete(s.app_name)


# --------------------------------------------------------------------------- commands


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``policy get|set`` and ``status`` to the ``trinity-dso`` app."""
    policy_app = typer.Typer(help="Read or change the resampling policy of a running service (REST).", no_args_is_help=True)
    app.add_typer(policy_app, name="policy")

    @app.command()
    def serve(
        config: Annotated[Path, typer.Option("--config", "-c", exists=True, dir_okay=False, help="YAML config (see examples/service/).")],
        host: str | None = typer.Option(None, help="Override service.host (default in config: 127.0.0.1)."),
        port: int | None = typer.Option(None, help="Override service.port."),
        address: str | None = typer.Option(None, help="Override ray.address ('auto' joins a running cluster)."),
    ) -> None:
        """Start the orchestrator actor and its REST service (Ray Serve) from a YAML config; Ctrl-C stops."""
        cfg = load_serve_config(config, {"service.host": host, "service.port": port, "ray.address": address})

        def ready(url: str) -> None:
            auth = "bearer token required for changes" if cfg.service.token() else "no token: changes are open"
            typer.echo(f"trinity-dso REST service at {url}  (live page {url}/dashboard, docs {url}/docs, "
                   f"metrics {url}/metrics; {auth})")

        run_service(cfg, on_ready=ready)

    @policy_app.command("get")
    def policy_get(url: str = URL_OPTION) -> None:
        """Print the resampling policy and its revision (JSON)."""
        typer.echo(json.dumps(_request(url, "GET", "/v1/policy"), indent=2))

    @policy_app.command("set")
    def policy_set(
        assignments: Annotated[list[str], typer.Argument(metavar="KEY=VALUE...", help="e.g. target_groups=16 filter.std_tol=0.01 filter.band=[0.2,0.8] replenish_paused=true; each VALUE is read as YAML (true/false, yes/no, null, lists)")],
        url: str = URL_OPTION,
        token: str | None = TOKEN_OPTION,
        if_match: int | None = typer.Option(None, "--if-match", help="Refuse (409) unless the policy is at this revision."),
    ) -> None:
        """Change policy fields (PATCH /v1/policy); applies from the next round."""
        changes = parse_assignments(assignments)
        headers = {"If-Match": f'"{if_match}"'} if if_match is not None else {}
        got = _request(url, "PATCH", "/v1/policy", token, json=changes, headers=headers)
        typer.echo(f"revision {got['revision']}: " + json.dumps(changes, sort_keys=True))

    @app.command()
    def status(
        url: str = URL_OPTION,
        watch: float | None = typer.Option(None, help="Refresh every N seconds until Ctrl-C (into a file or a pipe: one table each time)."),
        as_json: bool = typer.Option(False, "--json", help="Print the raw JSON instead of a table."),
    ) -> None:
        """Live stats of a running service (GET /v1/stats) as a table."""
        from rich.console import Console

        console = Console()
        if as_json:
            typer.echo(json.dumps(_request(url, "GET", "/v1/stats"), indent=2))
            return

        def table():
            return status_table(_request(url, "GET", "/v1/stats"), url)

        if watch is None:
            console.print(table())
            return
        if not console.is_terminal:  # a file or a pipe: one table per refresh (a live display writes only its last)
            try:
                while True:
                    with console.capture() as shot:  # rendered whole first: Ctrl-C never cuts a table
                        console.print(table())
                    console.file.write(shot.get())
                    console.file.flush()
                    time.sleep(watch)
            except KeyboardInterrupt:
                return
        from rich.live import Live

        with Live(table(), console=console, refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(watch)
                    live.update(table())
            except KeyboardInterrupt:
                pass


__all__ = ["load_serve_config", "parse_assignments", "register", "run_service", "status_table"]
