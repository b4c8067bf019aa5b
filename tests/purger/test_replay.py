"""How far a replay has got (purger.replay.Backlog): plain Python."""

from purger.replay import Backlog


def test_records_read_count_from_each_partition_start_up_to_its_end():
    backlog = Backlog({("t", 0): 10, ("t", 1): 0}, {("t", 0): 30, ("t", 1): 5})
    assert backlog.total == 25
    assert backlog.done({}) == 0
    assert backlog.done({"t": {"0": 25}}) == 15
    # Past the end counts as the end (events written after the replay started), other topics are ignored.
    assert backlog.done({"t": {"0": 99, "1": 5}, "control": {"0": 7}}) == 25
