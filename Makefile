# Two commands do everything on a fresh machine:
#   make run    install, then run the main job (the local playground)
#   make test   install, lint, build the local control plane, the vLLM CPU engine and the images once (cached in ~/.cache/lorapool), run every test; prints each tier's time against its budget
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install run test lint crds unit flakes

install:
	$(PIP) install --quiet --disable-pip-version-check -e '.[test]'

run: install
	lorapool dev

lint:
	ruff check --no-cache .
	ruff format --no-cache --check .
	lint-imports
	mypy

crds:
	lorapool crds --out crds
	lorapool crds --out charts/lorapool/crds

unit: install
	$(PYTHON) -m pytest -m "not cluster" -q

# scripts/ci.py: lint, the control-plane build, the engine install and pytest, each timed; it ends
# with the CI budget table (lorapool_dev.testing.tiers) and names any tier over its budget.
test: install
	$(PYTHON) scripts/ci.py

# Run the whole suite N times (BUSY=1: with every core kept busy) and list each test that failed once.
N ?= 5
flakes: install
	@if [ -x scripts/build-control-plane ]; then scripts/build-control-plane; fi
	$(PYTHON) -m lorapool.cli engine install
	$(PYTHON) -m lorapool.cli engine parsers
	$(PYTHON) scripts/flakes.py --runs $(N) $(if $(BUSY),--busy) $(if $(CLONE),--clone)
