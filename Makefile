# Two commands for a fresh machine with Python 3.10+ and PyPI:
#   make demo   creates .venv, installs tracklake, runs the simulated RL job end to end
#               and exports its run to TensorBoard files
#   make test   creates .venv, installs tracklake with its test extras, runs every test on
#               the default Python, then `make test-pythons`
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
DEMO_ROOT ?= tracklake-demo
#: pytest workers: tests run side by side, except those of one xdist_group (tests/conftest.py).
#: One more than the 2 cores CI has: many tests wait on processes they start (writers,
#: servers, kills), and the whole CI took 22:45 with 3 against 23:55 with 2 (the main
#: suite 13:52 against 15:11); the suite passes beside two CPU-burning loops with 2. With 4
#: it took 32:53 against 29:04 with 3 (more CPU in all: 164 % of the cores for longer)
WORKERS ?= 3
#: workers of the other Pythons' tests while the main suite runs (`make test`)
SIDE_WORKERS ?= 1

#: The other Pythons that pyproject.toml claims. `make test-pythons` gives each one that is
#: installed here (python3.X on PATH, else pyenv's) a .venv-3.X with every extra that
#: installs there, and runs PYTHONS_TESTS in it; one that is not installed is skipped with a
#: line saying so. torch is not installed there: PyPI's torch is the multi-GB CUDA build,
#: and the CPU wheel on this kind of machine is for the default Python only; verl needs
#: torch. Their tests skip there (--extras-not-required); any other missing extra fails.
#: 3.12 is left out by default (`make test-pythons OTHER_PYTHONS=3.12` runs it): it gets
#: the packages 3.13 gets, and the oldest and newest Pythons, with 3.11 running every
#: test, bracket it; its run was 40 to 50 s of CI's 25 minutes
OTHER_PYTHONS ?= 3.10 3.13
#: of them, those that run only SHORT_TESTS: 3.10 runs PYTHONS_TESTS (it has no tomllib
#: and gets older packages: DuckDB 1.5, NumPy 2.2, pandas 2), while 3.12 and 3.13, which
#: get the packages the default Python gets (but NumPy 2.5, where the default's test
#: extras hold 2.4), run the writer's, segments', coercion's, the signals', a reader's, the
#: command line's and a destination's tests, which keeps CI within its time
SHORT_PYTHONS ?= 3.12 3.13
SHORT_TESTS ?= tests/test_run_api.py tests/test_segment.py tests/test_coerce.py \
	tests/test_write_hardening.py tests/test_lifecycle.py tests/test_query.py \
	tests/test_cli.py tests/test_identity.py tests/exporters/test_tensorboard.py
PYTHON_X ?= python$*
OTHER_EXTRAS = test,tensorboard,mlflow,wandb,swanlab,follow,gpu
NOT_INSTALLED_THERE = torch,verl,ray,hydra
#: what 3.10 runs (not the tests marked slow): SHORT_TESTS, and what its older DuckDB,
#: NumPy and pandas or the Python itself can change: reading (DuckDB 1.5's fsum differs
#: from 2.0's), compaction, packing (tarfile), the dashboard's server, the TOML inputs
#: (tomli before 3.11), the import boundary and W&B's export. Its MLflow, W&B, SwanLab,
#: pyarrow and rich are those of the default Python, which runs every test with them
PYTHONS_TESTS ?= $(SHORT_TESTS) tests/test_init_inputs.py tests/test_read_scope.py \
	tests/test_run_list.py tests/test_golden_corpus.py tests/test_plain_engines.py \
	tests/test_sql_readonly.py tests/test_cursor.py tests/test_compact_merge.py \
	tests/test_compact_bytes.py tests/test_part_format.py tests/test_part_summary.py \
	tests/test_pack.py tests/test_ui_server.py tests/test_import_boundary.py \
	tests/exporters/test_wandb.py tests/test_from_summaries.py

.PHONY: demo test test-pythons system-packages typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[tensorboard]'
	touch $@

#: Bytecode is written by the first process that imports a module (a shell that sets
#: PYTHONDONTWRITEBYTECODE would have every test process compile mlflow, wandb and torch
#: anew), not compiled for every installed module at install: that took 51 s for the
#: default Python's packages (verl's aside) and 36 s for each other Python's, here, for
#: modules most tests never import.
unexport PYTHONDONTWRITEBYTECODE

# uv installs in seconds what pip resolves in over a minute (76 s against 12 s here)
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python

$(VENV)/.test: pyproject.toml setup.py | $(BIN)/uv
	$(UV_INSTALL) -e '.[test,lint,tensorboard,mlflow,wandb,swanlab,follow,gpu]'
	# the CPU build (a plain torch==2.13.0 is the multi-GB CUDA build): from a local wheel
	# where pip's configuration has one, else from PyTorch's CPU index
	$(BIN)/python -m pip install --quiet --no-compile 'torch==2.13.0+cpu' 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet --no-compile 'torch==2.13.0+cpu' \
			--extra-index-url https://download.pytorch.org/whl/cpu
	# the verl integration's tests: verl without its GPU stack, and only what `import verl`,
	# its tracking, trainer config (Hydra) and metric modules import (docs/verl.md)
	$(UV_INSTALL) --no-deps verl==0.9.1 ray==2.60.0 tensordict==0.15.3 \
		pyvers==0.2.3 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 \
		huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
		hydra-core==1.3.8 antlr4-python3-runtime==4.9.3 msgpack==1.2.4 jsonschema==4.26.0 \
		jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 \
		regex==2026.11.19 tqdm==4.70.1 orjson==3.13.0
	# ... and what verl's agent-loop worker module imports (the rollout-trace tests run it)
	$(UV_INSTALL) --no-deps codetiming==1.4.0 datasets==5.2.0 \
		dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
	# ... and what verl's PPO trainer module imports (its validation-generations path is
	# tested): 12 MB of pure-Python wheels, no compiled code
	$(UV_INSTALL) --no-deps torchdata==0.11.0 peft==0.21.2 \
		accelerate==1.15.0
	# the Lightning integration's tests: both package names, 1.6 MB of pure-Python wheels
	$(UV_INSTALL) --no-deps lightning==2.6.6 pytorch-lightning==2.6.6 \
		lightning-utilities==0.15.3 torchmetrics==1.9.0
	# the TRL test (a GRPOTrainer on CPU): a 1 MB pure-Python wheel; what it imports
	# (transformers, accelerate, datasets, pandas, pyyaml) is installed above
	$(UV_INSTALL) --no-deps trl==1.16.0
	touch $@

# the report's tests open it in headless Chromium, the plot's run it in tmux, the
# many-nodes test bed mounts an SFTP export with sshfs (Debian's)
system-packages:
	command -v chromium >/dev/null && command -v tmux >/dev/null \
		&& command -v sshfs >/dev/null && test -x /usr/sbin/sshd \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium tmux sshfs openssh-server)

demo: $(VENV)/.demo
	$(BIN)/tracklake demo --root $(DEMO_ROOT) --export
	$(BIN)/tracklake runs --root $(DEMO_ROOT)

# Debian's packages install (downloads, dpkg) while ruff checks. The type check and the
# other Pythons' venvs and tests (SIDE_WORKERS workers, one Python after the other) run
# beside the main suite, in sessions of their own, and their output is shown after it:
# the main suite leaves a fifth of the 2 cores idle (many tests wait on processes they
# start), which they take instead of running 4 minutes before and after it: the whole run
# took 25:21 and 26:41 against 29:04 here (the main suite 24:45 and 26:07 against 24:16).
# Each part fails the target.
# --max-worker-restart=0: a worker that crashes (a signal in native code) fails the run
# there, naming its test; replaced, it left pytest-xdist 3.8's loadgroup scheduler
# waiting for ever at the end of the run (pytest-dev/pytest-xdist#1378)
test: $(VENV)/.test
	mkdir -p build
	$(MAKE) system-packages > build/system-packages.log 2>&1 & packages=$$!; \
		$(BIN)/ruff check store exporters tests benchmarks; \
		checked=$$?; wait $$packages || { cat build/system-packages.log; exit 1; }; \
		exit $$checked
	setsid $(MAKE) typecheck > build/typecheck.log 2>&1 & types=$$!; \
		setsid $(MAKE) test-pythons WORKERS=$(SIDE_WORKERS) > build/test-pythons.log 2>&1 & \
		pythons=$$!; trap 'kill -TERM -- -$$types -$$pythons 2>/dev/null' INT TERM; \
		$(BIN)/pytest --require-extras -n $(WORKERS) --dist loadgroup \
			--max-worker-restart=0 --durations=25; tested=$$?; \
		wait $$types; typed=$$?; cat build/typecheck.log; \
		wait $$pythons; others=$$?; cat build/test-pythons.log; \
		[ $$tested = 0 ] && [ $$typed = 0 ] && [ $$others = 0 ]

#: the interpreter of Python $$v: python3.X on PATH, else pyenv's (empty: neither)
FIND_PYTHON = for c in python$$v $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v; do \
	"$$c" -c '' 2>/dev/null && { echo "$$c"; break; }; done

test-pythons:
	@failed=; for v in $(OTHER_PYTHONS); do \
		py=$$($(FIND_PYTHON)); \
		if [ -z "$$py" ]; then echo "Python $$v: not installed here, skipped"; continue; fi; \
		echo "Python $$v: $$py"; \
		$(MAKE) --no-print-directory .venv-$$v/.test PYTHON_X=$$py || { failed="$$failed $$v"; continue; }; \
		tests="$(PYTHONS_TESTS)"; \
		case " $(SHORT_PYTHONS) " in *" $$v "*) tests="$(SHORT_TESTS)";; esac; \
		.venv-$$v/bin/pytest -q -n $(WORKERS) --require-extras \
			--extras-not-required $(NOT_INSTALLED_THERE) -m 'not slow' $$tests \
			|| failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed on Python$$failed"; exit 1; fi

# uv (from PyPI) installs these in seconds where pip takes minutes per Python; --seed
# adds pip, as `python -m venv` does (tests/exporters/test_plugin.py installs with it)
.venv-%/.test: pyproject.toml setup.py | $(BIN)/uv
	$(BIN)/uv venv --quiet --seed --allow-existing --python $(PYTHON_X) .venv-$*
	$(BIN)/uv pip install --quiet --python .venv-$*/bin/python -e '.[$(OTHER_EXTRAS)]'
	touch $@

$(BIN)/uv: | $(BIN)/python
	$(BIN)/python -m pip install --quiet 'uv>=0.5'

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
	$(BIN)/python benchmarks/integrations.py

clean:
	rm -rf $(VENV) .venv-3.* $(DEMO_ROOT) $(DEMO_ROOT)-*/
