"""Multi-turn environments for agentic GiGPO rollouts (one module per environment)."""

from orchestrator.envs.frozenlake import (
    ACTIONS,
    engine_act,
    make_tasks,
    random_act,
    render_grid,
    run_episodes,
    state_hash,
)

__all__ = ["ACTIONS", "engine_act", "make_tasks", "random_act", "render_grid", "run_episodes", "state_hash"]
