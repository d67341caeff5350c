# Two commands for a fresh machine with Python 3.10+ and PyPI:
#   make demo   creates .venv, installs tracklake, runs the simulated RL job end to end
#               and exports its run to TensorBoard files
#   make test   creates .venv, installs tracklake with its test extras, runs every test
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
DEMO_ROOT ?= tracklake-demo

.PHONY: demo test typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[tensorboard]'
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,lint,tensorboard,mlflow,wandb,swanlab,follow,gpu]'
	# the CPU build (a plain torch==2.13.0 is the multi-GB CUDA build): from a local wheel
	# where pip's configuration has one, else from PyTorch's CPU index
	$(BIN)/python -m pip install --quiet 'torch==2.13.0+cpu' 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet 'torch==2.13.0+cpu' \
			--extra-index-url https://download.pytorch.org/whl/cpu
	# the verl integration's tests: verl without its GPU stack, and only what `import verl`,
	# its tracking, trainer config (Hydra) and metric modules import (docs/verl.md)
	$(BIN)/python -m pip install --quiet --no-deps verl==0.9.1 ray==2.60.0 tensordict==0.15.3 \
		pyvers==0.2.3 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 \
		huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
		hydra-core==1.3.8 antlr4-python3-runtime==4.9.3 msgpack==1.2.4 jsonschema==4.26.0 \
		jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 \
		regex==2026.11.19 tqdm==4.70.1 orjson==3.13.0
	# ... and what verl's agent-loop worker module imports (the rollout-trace tests run it)
	$(BIN)/python -m pip install --quiet --no-deps codetiming==1.4.0 datasets==5.2.0 \
		dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
	# ... and what verl's PPO trainer module imports (its validation-generations path is
	# tested): 12 MB of pure-Python wheels, no compiled code
	$(BIN)/python -m pip install --quiet --no-deps torchdata==0.11.0 peft==0.21.2 \
		accelerate==1.15.0
	# the report's tests open it in headless Chromium, the plot's run it in tmux (Debian's)
	command -v chromium >/dev/null && command -v tmux >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium tmux)
	touch $@

demo: $(VENV)/.demo
	$(BIN)/tracklake demo --root $(DEMO_ROOT) --export
	$(BIN)/tracklake runs --root $(DEMO_ROOT)

test: $(VENV)/.test
	$(BIN)/ruff check store exporters tests benchmarks
	$(MAKE) typecheck
	$(BIN)/pytest --require-extras

typecheck: $(VENV)/.test
	rm -rf build/typecheck && mkdir -p build/typecheck/tracklake
	ln -s $(CURDIR)/store/*.py $(CURDIR)/store/_*/ $(CURDIR)/store/integrations/ \
		$(CURDIR)/store/py.typed build/typecheck/tracklake/
	ln -s $(CURDIR)/exporters build/typecheck/tracklake/exporters
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p tracklake

bench: $(VENV)/.test
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/write_path.py
	$(BIN)/python benchmarks/sql_scale.py

clean:
	rm -rf $(VENV) $(DEMO_ROOT) $(DEMO_ROOT)-*/
