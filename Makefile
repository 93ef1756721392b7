# Two commands for a new machine: `make demo` and `make test`. Each sets up .venv itself and is safe to rerun.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first, pinned: a range would pull the newest CUDA build (GBs); 2.13.0 resolves to the CPU wheel here.
TORCH_PIN ?= torch==2.13.0

.PHONY: venv tools shell demo test test-fast crds e2e-kind e2e-cluster clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (first run, or pyproject.toml changed; about 2 minutes):"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "  [1/3] pip"; $(BIN)/pip install -qq --upgrade pip
	@echo "  [2/3] $(TORCH_PIN) (the CPU build)"; $(BIN)/pip install -qq "$(TORCH_PIN)"
	@echo "  [3/3] this project and its dependencies (megatron-core, transformers, kopf, ...; see pyproject.toml)"
	@$(BIN)/pip install -qq -e ".[dev]"
	@touch $(STAMP)
	@echo "$(VENV) ready: put it on PATH with 'export PATH=$(CURDIR)/$(BIN):\$$PATH' or run 'make shell'"

# Debian packages the tests drive for real: kubectl (tests/operator/test_kubectl.py), chromium (the dashboard's
# headless test) and a C compiler (the local pods' network shim). Installed when missing and apt-get can (as
# root); otherwise those tests skip and say why.
tools:
	@missing=""; command -v kubectl >/dev/null || missing="$$missing kubectl"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v cc >/dev/null || missing="$$missing gcc libc6-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages for the tests:$$missing"; \
	    apt-get update -qq; \
	    for pkg in $$missing; do \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkg >/dev/null 2>&1 || \
	      { [ $$pkg = kubectl ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null 2>&1; } || \
	      echo "could not install $$pkg; the tests that need it will skip"; done; \
	  else echo "missing$$missing (not root or no apt-get); the tests that need them will skip"; fi; fi

# A shell with .venv/bin first on PATH, so `ascend-train`, `ascend-engine` and `kubectl` work as typed.
shell: venv
	@echo "entering a shell with $(CURDIR)/$(BIN) on PATH (exit to leave)"
	@PATH="$(CURDIR)/$(BIN):$$PATH" $${SHELL:-/bin/bash}

demo: venv
	$(BIN)/ascend-train local demo --file examples/quickstart.yaml

test: venv tools
	$(BIN)/python -m pytest -q --durations=15

test-fast: venv
	$(BIN)/python -m pytest -q --durations=15 -m "not engine and not e2e"

# Everything generated from the models and the operator's code: CRDs (also the chart's copy), the chart's RBAC
# rules, and the CRD reference in docs/.
crds: venv
	$(BIN)/python -m ascend_operator.api.crdgen --write crds/
	$(BIN)/python -m ascend_operator.api.crdgen --write charts/ascend-train-operator/crds/
	$(BIN)/python charts/rbac_rules.py
	$(BIN)/python docs/crd_reference.py

e2e-kind:
	bash tests/cluster/e2e-kind.sh

e2e-cluster:
	bash tests/cluster/e2e-cluster.sh

clean:
	rm -rf $(VENV) .local-cluster
