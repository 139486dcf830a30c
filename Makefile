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
	# Tests without real processes or timing in two workers; the integration tests (real jobs,
	# clusters, detectors that judge the machine's load) one at a time, on a machine left to them.
	.venv/bin/python -X faulthandler -m pytest -q -rs --durations=5 -p no:cacheprovider -n 2 -m "not integration" tests
	.venv/bin/python -X faulthandler -m pytest -q -rs --durations=15 -p no:cacheprovider -m integration tests

lint: setup
	.venv/bin/ruff check src tests
	.venv/bin/mypy
	.venv/bin/lint-imports

# docs/cli.md is generated from the CLI's own help; tests/unit/test_cli_docs.py fails when it is stale.
cli-docs: setup
	.venv/bin/python -m typer sluice.cli.main utils docs --name sluice --title "sluice command reference" --output docs/cli.md
