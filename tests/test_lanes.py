"""The lanes' lists (tests/support/lanes.py) name tests that exist: a module renamed or a test moved would
otherwise fall silently into lane main, or a test that stops a server run beside others."""

from tests.support.lanes import BESIDE, FIRST, LAST
from tests.support import ROOT


def test_every_module_test_and_folder_the_lanes_name_exists():
    for module in BESIDE:
        assert (ROOT / module).is_file(), module
    for node_id in FIRST:
        module, name = node_id.split("::")
        assert f"def {name}(" in (ROOT / module).read_text(), node_id
    for folder in LAST:
        assert (ROOT / folder).is_dir() and list((ROOT / folder).glob("test_*.py")), folder
