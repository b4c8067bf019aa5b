"""The undo window's pure part (``purger.core.restorations``): which image a deletion is restored from, in
which order images go back, which images an erasure removes; the window's settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import json

from purger.core.restorations import (BLOB, DEPENDENT, FOLLOWER, ROW, Kept, Root, latest_images, names_of,
                                      restore_order, subject_images)
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


# How the mailbox and rule events policies name subjects in their images, and what a message's erasure takes.
KEEP_NAMING = {"ks.messages": [("mailbox", "mailbox")], "ks.rule_events": [("message_id", "message")]}
ERASE_NAMING = {**KEEP_NAMING, "ks.messages": [("mailbox", "mailbox"), ("payload_id", "payload")]}
TABLE_OF = {"message": "ks.messages", "rule_event": "ks.rule_events", "payload": "ks.payloads"}


class Window:
    """The restorations table and its names, as dicts: what ``CassandraRestorations.keep`` writes."""

    def __init__(self) -> None:
        self.images: dict[Root, list[Kept]] = {}
        self.names: dict[str, list[Root]] = {}

    def keep(self, kind: str, object_id: str, row: dict, hour: int = 0) -> None:
        root = Root(hour, 0, kind, object_id)
        self.images.setdefault(root, []).append(Kept(kind, object_id, "r", kind, object_id, None, hour, ROW,
                                                     table=TABLE_OF[kind], row=json.dumps(row)))
        for name in names_of(kind, object_id, [(TABLE_OF[kind], row)], KEEP_NAMING):
            self.names.setdefault(name, []).append(root)

    def erase(self, subject: str, held: set = frozenset(), objects=()):
        return subject_images([subject, *objects], lambda names: {name: self.names.get(name, []) for name in names},
                              lambda roots: {root: self.images[root] for root in roots}, ERASE_NAMING,
                              lambda keys: {(kind, object_id): "held: case 9" if f"{kind}:{object_id}" in held else None
                                            for kind, object_id in keys})


def test_an_erasure_finds_a_mailboxs_messages_their_payloads_and_rule_events_but_not_what_a_hold_keeps():
    w = Window()
    for m, mailbox, payload in (("m1", "alice", "p1"), ("m2", "alice", "p2"), ("m3", "alice", "p3"),
                                ("b1", "bob", "pb")):
        w.keep("message", m, {"message_id": m, "mailbox": mailbox, "payload_id": payload})
        w.keep("payload", payload, {"payload_id": payload})
        w.keep("rule_event", f"e-{m}", {"rule_event_id": f"e-{m}", "message_id": m})
    w.keep("message", "m1", {"message_id": "m1", "mailbox": "alice", "payload_id": "p1"}, hour=1)  # purged twice
    found = w.erase("mailbox:alice", held={"message:m3"})
    assert {(root.kind, root.id, root.hour_ms) for root in found.removable} == {
        ("message", "m1", 0), ("message", "m1", 1), ("message", "m2", 0), ("payload", "p1", 0), ("payload", "p2", 0),
        ("rule_event", "e-m1", 0), ("rule_event", "e-m2", 0), ("rule_event", "e-m3", 0)}
    assert found.kept == [("message", "m3", "held: case 9")]
    assert all(images == w.images[root] for root, images in found.removable.items())


def test_an_erasure_starts_from_its_objects_there_now_too_and_a_subjects_hold_keeps_all():
    w = Window()
    w.keep("message", "m1", {"message_id": "m1", "mailbox": "alice", "payload_id": None})
    w.keep("rule_event", "e1", {"rule_event_id": "e1", "message_id": "m9"})  # of a message there now
    assert {root.id for root in w.erase("mailbox:alice", objects=["message:m9"]).removable} == {"m1", "e1"}
    found = w.erase("mailbox:alice", held={"mailbox:alice", "message:m1"})
    assert found.removable == {} and found.kept == [("message", "m1", "held: case 9")]


@given(st.lists(st.tuples(st.sampled_from(["alice", "bob"]), st.sampled_from(["p1", "p2", "p3", None]),
                          st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_an_erasure_removes_exactly_the_subjects_images_against_a_reference(messages):
    """Messages of two mailboxes, each with a payload or none, held or not, with a rule event or not: removed are
    the subject's messages not held, the rule events of all its messages, and the payloads of those removed;
    nothing of the other mailbox but a payload it shares."""
    w = Window()
    for n, (mailbox, payload, _, with_event) in enumerate(messages):
        w.keep("message", f"m{n}", {"message_id": f"m{n}", "mailbox": mailbox, "payload_id": payload})
        if payload is not None:
            w.keep("payload", payload, {"payload_id": payload})
        if with_event:
            w.keep("rule_event", f"e{n}", {"rule_event_id": f"e{n}", "message_id": f"m{n}"})
    held = {f"message:m{n}" for n, (_, _, is_held, _) in enumerate(messages) if is_held}
    removed = {(root.kind, root.id) for root in w.erase("mailbox:alice", held=held).removable}
    alices = [(n, payload, is_held, with_event) for n, (mailbox, payload, is_held, with_event) in enumerate(messages)
              if mailbox == "alice"]
    assert removed == ({("message", f"m{n}") for n, _, is_held, _ in alices if not is_held}
                       | {("rule_event", f"e{n}") for n, _, _, with_event in alices if with_event}
                       | {("payload", p) for _, p, is_held, _ in alices if p is not None and not is_held})
