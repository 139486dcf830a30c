# The two commands of the README.
.PHONY: demo test lint setup cli-docs

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/sluice demo

test: setup
	.venv/bin/ruff check src tests
	.venv/bin/mypy
	.venv/bin/lint-imports
	# Tests without real processes or timing in two workers. The integration tests (real jobs,
	# servers, clusters) mostly wait on their processes, so they too run in two workers, a file
	# to a worker, each worker with a cgroup root and uid range of its own (tests/conftest.py);
	# those marked serial (Ray's failure detection, detectors and measurements that judge the
	# machine's load, host-wide network state) run after them one at a time, on a machine left
	# to them.
	.venv/bin/python -X faulthandler -m pytest -q -rs --durations=5 -p no:cacheprovider -n 2 -m "not integration" tests
	.venv/bin/python -X faulthandler -m pytest -q -rs --durations=10 -p no:cacheprovider -n 2 --dist loadfile -m "integration and not serial" tests
	.venv/bin/python -X faulthandler -m pytest -q -rs --durations=10 -p no:cacheprovider -m "integration and serial" tests

lint: setup
	.venv/bin/ruff check src tests
	.venv/bin/mypy
	.venv/bin/lint-imports

# docs/cli.md is generated from the CLI's own help; tests/unit/test_cli_docs.py fails when it is stale.
cli-docs: setup
	.venv/bin/python -m typer sluice.cli.main utils docs --name sluice --title "sluice command reference" --output docs/cli.md
