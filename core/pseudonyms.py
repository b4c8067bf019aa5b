"""What the ledger writes for an object's id and a decision's reason when ``ledger.pseudonymise`` is on.

GDPR Art. 17 asks for a subject's data to be erased; a ledger that keeps every id in clear for its retention
(400 days by default) is itself such data. Pseudonymised, an id is written as its keyed hash, HMAC-SHA256
under ``ledger.pseudonym_key``, in hex: the same id gives the same hash, so an object's records stay together
and ``purger ledger find ID`` finds them from the id; without the key, an id cannot be tested against the
ledger (a plain hash of a mailbox name or a user id could be, by hashing the candidates). A reason keeps its
category alone (``live``, ``held``, ``error``, ...): its details can name other objects (the message that
still refers to a payload, a hold's scope and who placed it) or carry a store's error text with a key in it.
A scope (``mailbox:alice``) keeps its kind and hashes its id.

Example::

    names = Pseudonyms.of(config.ledger)
    names.id("alice")                   # 'c2e1…' (64 hex digits), or 'alice' when the ledger is not pseudonymised
    names.reason("live: extract_count 3")   # 'live'
    names.scope("mailbox:alice")        # 'mailbox:c2e1…'
"""

from __future__ import annotations

import hashlib
import hmac

from purger.core.settings import LedgerConfig
from purger.core.vocabulary import category


class Pseudonyms:
    def __init__(self, key: bytes | None) -> None:
        self._key = key

    @classmethod
    def of(cls, ledger: LedgerConfig) -> "Pseudonyms":
        """The ledger's: keyed hashes under its key when ``pseudonymise`` is on, the ids themselves otherwise."""
        if not ledger.pseudonymise:
            return cls(None)
        assert ledger.pseudonym_key is not None  # LedgerConfig refuses pseudonymise without a key
        return cls(ledger.pseudonym_key.get_secret_value().encode())

    @property
    def on(self) -> bool:
        return self._key is not None

    def id(self, object_id: str) -> str:
        """The id as the ledger writes it."""
        if self._key is None:
            return object_id
        return hmac.new(self._key, object_id.encode(), hashlib.sha256).hexdigest()

    def reason(self, text: str | None) -> str | None:
        """The reason as the ledger writes it: its category alone when pseudonymised."""
        return category(text) if self._key is not None and text is not None else text

    def scope(self, scope: str) -> str:
        """A hold's scope (``KIND:ID``) as the ledger writes it: the kind, then the id as ``id`` writes it."""
        kind, colon, object_id = scope.partition(":")
        return f"{kind}{colon}{self.id(object_id)}" if colon else self.id(scope)

    def __repr__(self) -> str:  # never the key
        return f"Pseudonyms(on={self.on})"
