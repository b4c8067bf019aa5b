"""The undo window's pure part (``purger.core.restorations``): which image a deletion is restored from, and in
which order images go back; the window's settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from purger.core.restorations import BLOB, DEPENDENT, FOLLOWER, ROW, Kept, latest_images, restore_order
from purger.core.settings import UndoConfig


def image(kind="message", object_id="m1", dc=None, at=0, rank=ROW, root=("message", "m1")):
    return Kept(root[0], root[1], "expired", kind, object_id, dc, at, rank, table="ks.messages", row="{}")


@given(st.lists(st.tuples(st.sampled_from(["m1", "m2"]), st.sampled_from([None, "dc1"]), st.integers(0, 100)),
                max_size=12),
       st.lists(st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.sampled_from([None, "dc1"]), st.integers(0, 100)),
                max_size=6))
def test_each_deletion_gets_the_last_image_kept_at_or_before_it_else_none(kept, deleted):
    """Against a reference: every image of the same object and data centre kept no later than the deletion, the
    latest of them; an image kept after it (a later purge's) or of another object never."""
    images = [image(object_id=m, dc=dc, at=at) for m, dc, at in kept]
    found = latest_images(images, [("message", m, dc, at) for m, dc, at in deleted])
    for m, dc, at in deleted:
        earlier = [i.kept_at_ms for i in images if (i.id, i.dc) == (m, dc) and i.kept_at_ms <= at]
        got = found["message", m, dc, at]
        assert (got.kept_at_ms if got else None) == (max(earlier) if earlier else None)
        assert got is None or (got.id, got.dc) == (m, dc)


def test_a_deletion_with_no_image_kept_is_not_restorable():
    assert latest_images([image(at=10)], [("message", "m1", None, 5), ("payload", "m1", None, 20)]) == {
        ("message", "m1", None, 5): None, ("payload", "m1", None, 20): None}


def test_images_go_back_blobs_first_then_followers_then_rows_then_what_leads_from_them():
    """The reverse of the deletions', blobs first: a payload's blob before its row, a message's reference before
    the message (its payload never without a referrer), a user's row before its root and permissions."""
    kept = [image("user", "u1", at=1, root=("user", "u1")),
            image("virtual_root", "u1", at=2, rank=DEPENDENT, root=("user", "u1")),
            image("payload_refs", '["p1","m1"]', at=4, rank=FOLLOWER),
            image("message", "m1", at=3),
            image("payload", "p1", "dc2", at=6, rank=BLOB, root=("payload", "p1")),
            image("payload", "p1", "dc1", at=5, rank=BLOB, root=("payload", "p1"))]
    assert [(i.kind, i.dc) for i in restore_order(kept)] == [
        ("payload", "dc1"), ("payload", "dc2"), ("payload_refs", None), ("user", None), ("message", None),
        ("virtual_root", None)]


@pytest.mark.parametrize("raw, message", [
    ({"window": "500ms"}, "at least 1s"),
    ({"prefix": "restore"}, "ending in '/'"),
    ({"prefix": "/restore/"}, "ending in '/'"),
])
def test_a_bad_undo_setting_says_what_to_write(raw, message):
    with pytest.raises(ValidationError, match=message):
        UndoConfig(**raw)


def test_the_undo_window_is_off_unless_set():
    assert UndoConfig().window is None
