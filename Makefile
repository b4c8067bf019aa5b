# The two commands of the README: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3

.PHONY: install demo test stack-up stack-down

install:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test]'

# Starts the local stack if needed, runs a demo workload through the purger, prints the report.
demo: install
	purger demo

# Unit tests and integration tests on the real servers; the test session starts the local stack
# when nothing answers and stops it afterwards (see tests/conftest.py).
test: install
	$(PYTHON) -m pytest

stack-up: install
	purger stack up

stack-down:
	purger stack down
