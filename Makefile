# make demo: set up .venv if missing, install outcore, train the demo model.
# make test: set up .venv if missing, install outcore, run the test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that lies on these machines' disk; an unpinned `torch` would pull
# a multi-GB CUDA build. Override with `make TORCH_SPEC=torch==2.11.0 ...` elsewhere.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test venv clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test,logs]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	# a fresh run into outcore-demo each time (train refuses to overwrite a run's checkpoints)
	rm -rf outcore-demo
	$(BIN)/outcore train

test: venv
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) outcore-demo
