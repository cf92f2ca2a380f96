"""Trinity advantage functions, one module each, so that importing one loads only what it needs:

* ``dso_grpo``: :class:`orchestrator.trinity.advantage.grpo.DsoGRPOAdvantageFn`, in process;
* ``dso_gigpo``: :class:`orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn`, in process;
* ``dso_gigpo_index``: :class:`orchestrator.trinity.advantage.gigpo_index.DsoGiGPOIndexAdvantageFn`,
  through the orchestrator's anchor index (Ray, Redis).
"""
