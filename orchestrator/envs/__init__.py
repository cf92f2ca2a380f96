"""Multi-turn environments for agentic GiGPO rollouts: the lockstep driver, one module per environment, action policies."""
