# The two commands of the README:  `make report` (the main job) and `make test`.
# Both install what is missing first; a second run reuses the virtual environment and the Horovod wheel.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# horovodrun starts `python` from PATH: it must be this environment's. Bytecode is cached even where the caller's
# environment says not to (container images set PYTHONDONTWRITEBYTECODE): a run starts hundreds of interpreters,
# and each would compile tfperf's modules (and those of environments uv makes, which holds no bytecode) again.
RUN    := env -u PYTHONDONTWRITEBYTECODE PATH="$(CURDIR)/$(BIN):$$PATH"

.PHONY: install browser report test docs wheel clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml scripts/install_horovod.sh scripts/install_hosts.sh \
          scripts/install_load_clients.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	# A GPU host: TensorFlow with its CUDA libraries, or it registers no GPU and runs on the CPU.
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install -q "tensorflow[and-cuda]==$$(sed -n 's/^tensorflow==\([^ ]*\).*/\1/p' requirements.txt)"; fi
	$(BIN)/python -m pip install -q --no-deps -e .
	bash scripts/install_horovod.sh $(BIN)/python
	bash scripts/install_hosts.sh
	bash scripts/install_load_clients.sh
	touch $@

report: install
	$(RUN) $(BIN)/tfperf run --quick --out results

# The suite opens report.html in a headless Chromium (a system package: apt-get where it may run).
browser:
	bash scripts/install_browser.sh

# Two workers: most tests wait on the processes they start (servers, clusters, recipes), so two keep 2 cores
# busy; tests that share something expensive or a machine-wide resource share an xdist_group (one worker).
# Tests that assert on what the cores do (marked whole_machine) run last, alone, in the same run: beside another
# worker's load their verdicts measure that load (tests/conftest.py holds them back until the others finish).
test: install browser
	$(RUN) $(BIN)/python -m pytest -q -n 2 --dist loadgroup

# The documentation site, built strictly (a broken link or API reference fails it): open site/index.html.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The package as a user installs it: pip install dist/tfperf-*.whl into any environment with TensorFlow.
wheel: install
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w dist .
	rm -rf build

clean:
	rm -rf $(VENV) results site dist
