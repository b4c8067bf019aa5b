"""The purge policies: the built-in ones by name, and a user's own by module path.

Example::

    from purger.policies import load_policy
    policy = load_policy("users", {"enabled": True, "data_centres": ["dc1", "dc2"]})
    own = load_policy("push_clients", {"enabled": True, "module": "my_policies.push_clients"})
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from purger.core.policy import Policy
from purger.core.policy_set import PolicySet

if TYPE_CHECKING:
    from purger.core.settings import PurgerConfig

BUILT_IN = {
    "mailbox": "purger.policies.mailbox:MailboxPolicy",
    "rule_events": "purger.policies.rule_events:RuleEventsPolicy",
    "users": "purger.policies.users:UsersPolicy",
    "units_of_work": "purger.policies.units_of_work:UnitsOfWorkPolicy",
}


class PolicyError(ValueError):
    """A policy section a user can fix: the message names the key."""


def policy_class(name: str, module: str | None = None) -> type[Policy]:
    """The class of a built-in policy, or of one's own from ``module`` (``pkg.mod`` or ``pkg.mod:Class``;
    without a class name, the module's one ``Policy`` subclass)."""
    target = module or BUILT_IN.get(name)
    if target is None:
        raise PolicyError(f"policies.{name}: no built-in policy has this name "
                          f"({', '.join(BUILT_IN)}); for one of your own set policies.{name}.module")
    module_name, _, class_name = target.partition(":")
    try:
        loaded = importlib.import_module(module_name)
    except ImportError as error:
        raise PolicyError(f"policies.{name}.module: cannot import {module_name!r} ({error}); "
                          "is it on PYTHONPATH?") from None
    if class_name:
        found = getattr(loaded, class_name, None)
    else:
        classes = [v for v in vars(loaded).values()
                   if isinstance(v, type) and issubclass(v, Policy) and v is not Policy and v.__module__ == module_name]
        found = classes[0] if len(classes) == 1 else None
    if not (isinstance(found, type) and issubclass(found, Policy)):
        raise PolicyError(f"policies.{name}.module: {target!r} names no Policy subclass")
    if found.name != name:
        raise PolicyError(f"policies.{name}: the module's policy is named {found.name!r}; use that section name")
    return found


def load_policy(name: str, raw: dict[str, Any]) -> Policy:
    """Validate a policy's section and build the policy; errors name ``policies.<name>.<key>``."""
    cls = policy_class(name, raw.get("module"))
    try:
        settings = cls.settings_model.model_validate(raw)
    except ValidationError as error:
        lines = []
        for problem in error.errors():
            key = ".".join(str(part) for part in problem["loc"])
            message = "unknown key" if problem["type"] == "extra_forbidden" else problem["msg"]
            lines.append(f"policies.{name}.{key}: {message}" if key else f"policies.{name}: {message}")
        raise PolicyError("\n".join(lines)) from None
    return cls(settings)


def build_policy_set(sections: dict[str, dict[str, Any]]) -> PolicySet:
    """The policies of a configuration's ``[policies.<name>]`` sections: every built-in one (mailbox enabled
    by default, the others not), then one's own; the built-in ones not enabled have their event types
    ignored (counted, not dead-lettered)."""
    enabled, ignored = [], set()
    for name, raw in {**{name: {} for name in BUILT_IN}, **sections}.items():
        policy = load_policy(name, raw)
        if policy.settings.enabled:
            enabled.append(policy)
        elif name in BUILT_IN:
            ignored.update(t.name for t in policy.event_types)
    try:
        return PolicySet(enabled, ignored)
    except ValueError as error:
        raise PolicyError(str(error)) from None


def events_topics(config: "PurgerConfig") -> list[str]:
    """``kafka.topics`` and the enabled policies' own topics."""
    own = [t for p in config.policy_set.policies for t in p.settings.topics]
    return list(dict.fromkeys([*config.kafka.topics, *own]))
