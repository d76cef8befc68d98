PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install bytecode demo test test-fast chaos databases lint bench clean help

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# lockgate's own modules compiled ahead (only those changed since): the editable install
# leaves them to the interpreter, which compiles them again at every process start
# (about 0.13 s of CPU each) when PYTHONDONTWRITEBYTECODE keeps it from caching them,
# and the suite starts many processes.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src

demo: $(STAMP) bytecode
	$(BIN)/python examples/demo.py

# Tests that need no database server and no worker process: runtime, durations, the
# CLI's error boundary, flow and gate arithmetic (under a minute).
FAST_TESTS := tests/runtime tests/test_durations.py tests/test_cli_boundary.py \
	tests/flow/test_bucket.py tests/flow/test_concurrency.py tests/flow/test_breaker.py \
	tests/flow/test_estimate.py tests/flow/test_headers.py tests/flow/test_priority.py \
	tests/flow/test_window.py tests/flow/test_status.py tests/gate/test_metrics.py \
	tests/gate/test_decision.py tests/gate/test_parsing.py

# The whole suite on SQLite, PostgreSQL and MariaDB (the servers are started if they are
# down and this machine can; tests of a server that does not answer are skipped, or fail
# under CI=true).
test: $(STAMP) bytecode databases
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest tests --durations=25

# The chaos and fuzz suite at full size (tests/chaos, docs/reliability.md): kill -9 of
# workers, database restarts and outages on private servers, a network partition, a full
# or read-only disk, 10,000 fuzz cases. Needs root (private servers, tmpfs, ip netns);
# about 20 minutes on a busy 2-CPU machine. `make test` runs the same scenarios small.
chaos: $(STAMP) bytecode databases
	$(BIN)/python -m pytest tests/chaos --chaos=long -s -q

test-fast: $(STAMP) bytecode
	$(BIN)/ruff check src tests bench examples
	$(BIN)/python -m pytest $(FAST_TESTS)

databases:
	@bash .ci/databases

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/engine_throughput.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache lockgate.db*

help:
	@echo "make install    create .venv and install lockgate with its test tools"
	@echo "make demo       run the demo job on SQLite against the simulator"
	@echo "make test       lint, types, layers and the whole suite (chaos suite short)"
	@echo "make test-fast  the tests that need no database server (under a minute)"
	@echo "make bytecode   compile lockgate's modules ahead (test, demo and chaos do it)"
	@echo "make chaos      the chaos and fuzz suite at full size (root; docs/reliability.md)"
	@echo "make lint       ruff, mypy, import-linter"
	@echo "make bench      the engine throughput benchmark"
