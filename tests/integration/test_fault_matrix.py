"""The fault matrix's sizes (``tests.support.faults``): bounded as in CI unless ``PURGER_FAULTS=full``; one figure
set by its own variable."""

from tests.support.faults import fault_matrix


def test_bounded_by_default_and_in_full_on_request():
    bounded, full = fault_matrix({}), fault_matrix({"PURGER_FAULTS": "full"})
    assert (bounded.attempts, bounded.cross_dc_attempts, bounded.random_kills, bounded.full,
            bounded.outage_s, bounded.measured_races) == (400, 2_000, 1, False, 10, False)
    assert (bounded.executor_kills, bounded.executor_kill_objects) == (1, 50)
    assert (full.executor_kills, full.executor_kill_objects) == (3, 150)
    assert (full.attempts, full.cross_dc_attempts, full.random_kills, full.full,
            full.outage_s, full.measured_races) == (20_000, 100_000, 10, True, 30, True)


def test_one_figure_set_on_its_own():
    matrix = fault_matrix({"PURGER_FAULT_ATTEMPTS": "50", "PURGER_FAULT_OUTAGE_S": "2.5"})
    assert (matrix.attempts, matrix.cross_dc_attempts, matrix.random_kills, matrix.outage_s) == (50, 250, 1, 2.5)


def test_a_bounded_run_takes_its_share_of_a_matrix_in_turn_and_a_full_one_every_case():
    every, per_step = ("a", "b", "c", "d", "e"), ("a", "c", "d", "e")
    runs = [fault_matrix({"PURGER_FAULT_SEED": str(seed)}).cases(every, per_step, per_run=2) for seed in range(4)]
    assert runs == [("a", "c"), ("d", "e"), ("a", "c"), ("d", "e")]
    assert fault_matrix({"PURGER_FAULT_SEED": "7"}).cases(every, per_step, per_run=3) == ("c", "d", "e")
    assert fault_matrix({"PURGER_FAULTS": "full", "PURGER_FAULT_SEED": "1"}).cases(every, per_step, 2) == every
