# Two commands for a new machine: `make demo` and `make test`. Each sets up .venv itself and is safe to rerun.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first, pinned: a range would pull the newest CUDA build (GBs); 2.13.0 resolves to the CPU wheel here.
TORCH_PIN ?= torch==2.13.0

.PHONY: venv demo test test-fast crds e2e-kind e2e-cluster clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (first run, or pyproject.toml changed): $(TORCH_PIN), then the project"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -qq --upgrade pip
	@$(BIN)/pip install -qq "$(TORCH_PIN)"
	@$(BIN)/pip install -qq -e ".[dev]"
	@touch $(STAMP)
	@echo "$(VENV) ready"

demo: venv
	$(BIN)/ascend-train local demo --file examples/quickstart.yaml

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not engine and not e2e"

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
