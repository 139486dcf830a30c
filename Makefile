# The two commands of the README.
.PHONY: demo test lint setup

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/sluice demo

test: setup
	.venv/bin/ruff check src tests
	.venv/bin/mypy
	.venv/bin/lint-imports
	.venv/bin/python -X faulthandler -m pytest -q -rs --durations=15 -p no:cacheprovider tests

lint: setup
	.venv/bin/ruff check src tests
	.venv/bin/mypy
	.venv/bin/lint-imports
