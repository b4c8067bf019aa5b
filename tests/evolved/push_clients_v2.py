"""``push_clients`` (examples/push_clients) at a later release of its own, whose state gained a field: what a
policy's author does across an upgrade (docs/operations.md, "Upgrades"), continued from the earlier release's
checkpoint by ``tests/integration/test_upgrades.py``. Configured as ``module = "push_clients_v2"``."""

from __future__ import annotations

from dataclasses import dataclass

from push_clients_policy import (
    PUSH_CLIENT_REGISTERED, ClientEvent, PushClientKind, PushClientsPolicy, PushClientsSettings, PushClientState,
)


@dataclass(frozen=True)
class PushClientStateV2(PushClientState):
    # The earliest registration seen. Added at this release, so it accepts None: the state kept before reads
    # None here.
    registered_ms: int | None = None


class PushClientKindV2(PushClientKind):
    state_class = PushClientStateV2

    def fold(self, state: PushClientStateV2 | None, events: list[ClientEvent]) -> PushClientStateV2:
        registered = [e.event_time_ms for e in events if e.type == PUSH_CLIENT_REGISTERED]
        if state is not None and state.registered_ms is not None:
            registered.append(state.registered_ms)
        return PushClientStateV2(super().fold(state, events).last_connected_ms, min(registered, default=None))


class PushClientsPolicyV2(PushClientsPolicy):
    def __init__(self, settings: PushClientsSettings) -> None:
        super().__init__(settings)
        self.kind = PushClientKindV2(settings.inactive_after)
