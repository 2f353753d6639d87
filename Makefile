# Two entry points for a fresh machine (see README): `make lab` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# make test installs TensorFlow (requirements-tf.txt) for the tests marked tf; `make test TF=0` skips it
TF     ?= 1
# make test runs the suite in WORKERS pytest-xdist workers, a test file each at a time; the files with
# tests marked timing in one of them, one after another (tests/conftest.py); two, as on a 2-core CI
# machine; `make test WORKERS=0` runs it in one process. Then the tests marked alone, which need the
# machine to themselves (a quiet machine's verdict), one at a time with nothing beside them.
# A worker that dies (a native abort in torch) is not replaced: pytest-xdist 3.8 under --dist loadfile
# then waits for ever with every worker idle (pytest-xdist#1378, #784); without a restart the run
# ends at once, the dead worker's test failed ("worker 'gw0' crashed while running …") and its file's
# remaining tests not run
WORKERS ?= 2

.PHONY: lab test lint docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.lab-installed: $(BIN)/python pyproject.toml requirements-lab.txt
	$(BIN)/pip install -q -r requirements-lab.txt -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.lab-installed requirements-test.txt
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@

$(VENV)/.tf-installed: $(VENV)/.test-installed requirements-tf.txt
	$(BIN)/pip install -q -r requirements-tf.txt
	touch $@

lab: $(VENV)/.lab-installed
	$(BIN)/dlscope lab $(ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test: $(VENV)/.test-installed $(if $(filter 1,$(TF)),$(VENV)/.tf-installed) lint
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile --max-worker-restart 0 -m "not alone" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: none selected

# the docs site into site/ (tests/test_docs.py builds it too, with warnings as errors); its example
# outputs come from scripts/make-docs-examples, run by hand
docs: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache
