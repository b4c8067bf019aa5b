# The two commands of the README: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3

.PHONY: install demo test faults faults-full bench bench-10m stack-up stack-down dist

# promtool (Debian's prometheus package) runs the alert rules' tests, tests/purger/test_alert_rules.py.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
APT_INSTALL = DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends

install:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	command -v promtool >/dev/null || $(APT_INSTALL) prometheus || { $(SUDO) apt-get update -qq && $(APT_INSTALL) prometheus; }

# Starts the local stack if needed, runs a demo workload through the purger, prints the report.
demo: install
	$(PYTHON) -m devstack demo

# Unit tests and integration tests on the real servers; the test session starts the local stack
# when nothing answers and stops it afterwards (see tests/conftest.py). Two lanes, two pytest-xdist
# workers, fill the two cores a single session leaves half idle (tests/support/lanes.py).
test: install
	$(PYTHON) -m pytest -n 2 --dist loadgroup

# The fault suite (RELIABILITY.md), bounded as in CI; faults-full injects every fault in full
# (tests/support/faults.py, FaultMatrix).
FAULT_TESTS = tests/integration/test_faults.py tests/integration/two_nodes/test_data_centres.py \
	tests/policies/test_users.py::test_a_user_added_back_while_being_purged_never_loses_a_row \
	tests/integration/test_operations.py::test_the_ledger_holds_one_record_per_deletion_across_forced_retries \
	tests/integration/test_purge_stream.py::test_a_failing_data_centre_is_retried_until_done \
	tests/integration/test_purge_stream.py::test_a_corpus_of_bad_input_is_dead_lettered_and_deletes_nothing \
	tests/integration/test_purge_stream.py::test_hold_and_release_killed_midway_then_run_again_end_as_if_never_killed \
	tests/integration/test_purge_stream.py::test_an_erasure_killed_midway_then_run_again_with_its_request_ends_as_if_never_killed \
	tests/integration/test_purge_stream.py::test_a_restore_killed_midway_then_run_again_with_its_run_ends_as_if_never_killed \
	tests/sinks/test_purge.py::test_one_data_centre_failing_does_not_hold_the_others_back \
	tests/reconcile/test_run.py::test_a_reconcile_killed_in_its_scan_or_its_feed_loses_nothing \
	tests/reconcile/test_orphans.py::test_a_sweep_stopped_before_its_ledger_write_is_recorded_by_the_next \
	tests/reconcile/test_orphan_rows.py::test_a_sweep_of_orphan_rows_stopped_before_its_ledger_write_is_recorded_by_the_next \
	tests/reconcile/test_reconcile_replay.py \
	tests/integration/test_cluster.py tests/integration/paxos_ring
faults: install
	$(PYTHON) -m pytest -s $(FAULT_TESTS)

faults-full: install
	PURGER_FAULTS=full $(PYTHON) -m pytest -s $(FAULT_TESTS)

# Benchmarks (BENCHMARKS.md): each prints its figures beside a baseline measured in the same run.
bench: install
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	$(PYTHON) -m bench.stateful --messages 100000
	$(PYTHON) -m bench.deletes --messages 20000
	$(PYTHON) -m bench.lag --rate 20 --seconds 300
	$(PYTHON) -m bench.state_scale --objects 1000000
	$(PYTHON) -m bench.ledger --rows 200 --commits 25 --rounds 10
	$(PYTHON) -m bench.batch --rate 20 --seconds 60
	$(PYTHON) -m bench.reconcile --messages 1000000
	$(PYTHON) -m bench.backlog
	$(PYTHON) -m bench.ledger --day --rows 500 --rounds 5

bench-10m: install
	$(PYTHON) -m bench.state_scale --objects 10000000

stack-up: install
	$(PYTHON) -m devstack up

stack-down:
	$(PYTHON) -m devstack down

# The release's wheel and sdist in dist/ (python -m build: the sdist, then the wheel built from it).
dist:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check build==1.6.1
	rm -rf dist
	$(PYTHON) -m build --outdir dist .
