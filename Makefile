# Two commands for a new machine: `make demo` and `make test`. Each sets up .venv itself and is safe to rerun.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first, pinned: a range lets the project's dependencies pull a newer torch (GBs more).
TORCH_PIN ?= torch==2.13.0
SHELL := /bin/bash

.PHONY: venv controlplane gitops-tools tools shell demo test test-fast test-faults crds e2e-kind e2e-cluster clean

venv: $(STAMP)

# pip's own lines, kept in .venv/pip.log; on the terminal a line per download or every 20 packages found, and the
# log's end when pip fails.
PIP_LOG := $(VENV)/pip.log
PIP_PROGRESS := awk '/^ *Downloading / { sub(/^ +/, ""); print "    " $$0; fflush() } \
	/^Collecting / { n++; if (n % 20 == 0) { printf "    %d packages found\n", n; fflush() } } \
	/^Installing collected packages/ { print "    installing"; fflush() }'
PIP_FAILED := { tail -30 $(PIP_LOG); echo "pip failed (the whole log: $(PIP_LOG))"; exit 1; }

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (first run, or pyproject.toml changed; 4-10 minutes, the most with a cold pip cache):"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "  [1/3] pip"; $(BIN)/pip install -qq --upgrade pip
	@echo "  [2/3] $(TORCH_PIN) (a local wheel where pip finds one, else PyPI's build with its CUDA libraries)"
	@set -o pipefail; $(BIN)/pip install --progress-bar off "$(TORCH_PIN)" 2>&1 | tee $(PIP_LOG) | $(PIP_PROGRESS) \
		|| $(PIP_FAILED)
	@echo "  [3/3] this project and its dependencies (megatron-core, transformers, kopf, ...; see pyproject.toml)"
	@set -o pipefail; $(BIN)/pip install --progress-bar off -e ".[dev]" 2>&1 | tee -a $(PIP_LOG) | $(PIP_PROGRESS) \
		|| $(PIP_FAILED)
	@touch $(STAMP)
	@echo "$(VENV) ready: put it on PATH with 'export PATH=$(CURDIR)/$(BIN):\$$PATH' or run 'make shell'"

# The control plane, built from its Go modules (controlplane/) once per machine and pin into
# ~/.cache/ascend-train/controlplane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and
# Kueue's manager. A fresh machine downloads the modules and compiles for about 20 minutes (2 cores); later runs
# find the binaries at once. kubectl is linked into .venv/bin, so the kubectl of the same release is first on PATH.
controlplane: venv
	@$(BIN)/python -m ascend_cluster.build --link $(BIN)

# The tools users reach the operator with, run for real by tests/e2e/test_helm_gitops.py (docs/gitops.md): helm,
# Flux's source-controller and kustomize-controller, and gitopscheck (kstatus; Argo CD's Lua health check), built
# from controlplane/helm, controlplane/flux and controlplane/gitopscheck into the same cache, once per machine
# (about 6 minutes for helm and 18 for Flux's controllers on 2 cores, the module download included); helm and
# gitopscheck are linked into .venv/bin.
gitops-tools: controlplane
	@$(BIN)/python -m ascend_cluster.build --gitops --link $(BIN)

# Debian packages the tests drive for real: chromium (the dashboard's headless test) and a C compiler (the local
# pods' network shim). Installed when missing and apt-get can (as root); otherwise those tests skip and say why.
tools:
	@missing=""; command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v cc >/dev/null || missing="$$missing gcc libc6-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages for the tests:$$missing"; \
	    apt-get update -qq; \
	    for pkg in $$missing; do \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkg >/dev/null 2>&1 || \
	      echo "could not install $$pkg; the tests that need it will skip"; done; \
	  else echo "missing$$missing (not root or no apt-get); the tests that need them will skip"; fi; fi

# A shell with .venv/bin first on PATH, so `ascend-train`, `ascend-engine` and `kubectl` work as typed.
shell: venv
	@echo "entering a shell with $(CURDIR)/$(BIN) on PATH (exit to leave)"
	@PATH="$(CURDIR)/$(BIN):$$PATH" $${SHELL:-/bin/bash}

demo: controlplane
	$(BIN)/ascend-train local demo --file examples/quickstart.yaml

# Two pytest workers, whole files each (a file's module-scoped cluster stays on one worker): the tests' processes
# leave about 40% of two cores idle (imports on one core, waits on pods and the control plane), which a second
# worker fills. Files go out in collection order (tests/conftest.py: the longest tiers first), not xdist's
# default of the files with the most tests first, which left the one-test e2e files, minutes each, for the end.
PYTEST := $(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadfile --no-loadscope-reorder

test: controlplane gitops-tools tools
	PATH="$(CURDIR)/$(BIN):$$PATH" $(PYTEST)

test-fast: controlplane
	PATH="$(CURDIR)/$(BIN):$$PATH" $(PYTEST) -m "not engine and not e2e"

# The long run of the fault-sequence property (docs/faults.md): FAULT_SEQUENCES random sequences of up to
# FAULT_SEQUENCE_STEPS faults against the operator, shared by FAULT_WORKERS processes, each on a control plane of its
# own; a failure is shrunk to a minimal sequence and printed. `make test` runs a short one.
FAULT_SEQUENCES ?= 2000
FAULT_SEQUENCE_STEPS ?= 14
FAULT_WORKERS ?= 4
test-faults: controlplane
	PATH="$(CURDIR)/$(BIN):$$PATH" FAULT_SEQUENCES=$(FAULT_SEQUENCES) FAULT_SEQUENCE_STEPS=$(FAULT_SEQUENCE_STEPS) \
		FAULT_WORKERS=$(FAULT_WORKERS) $(BIN)/python tests/operator/run_fault_sequences.py

# Everything generated from the models and the operator's code: CRDs (also the chart's copy), the chart's RBAC
# rules, and the CRD reference in docs/.
crds: venv
	$(BIN)/python -m ascend_operator.api.crdgen --write crds/
	$(BIN)/python -m ascend_operator.api.crdgen --write charts/ascend-train-operator/crds/
	$(BIN)/python -m ascend_operator.api.runtime_locks crds/runtime-locks.yaml \
		charts/ascend-train-operator/templates/runtime-locks.yaml
	$(BIN)/python -m ascend_operator.api.immutability crds/immutable-spec.yaml \
		charts/ascend-train-operator/templates/immutable-spec.yaml
	$(BIN)/python charts/rbac_rules.py
	$(BIN)/python docs/crd_reference.py

e2e-kind:
	bash tests/cluster/e2e-kind.sh

e2e-cluster:
	bash tests/cluster/e2e-cluster.sh

clean:
	rm -rf $(VENV) .local-cluster
