"""The configuration, loaded once at the edge: the settings and the policies they enable, in one object.

The command line loads the file here; everything below it (the job, the sinks on the executors,
setup, replay) is handed the one ``PurgerConfig`` and reads its enabled policies from
``config.policy_set`` rather than building them again.

Example::

    from purger.config import load_config
    config = load_config("purger.toml")
    config.stream.trigger_interval               # datetime.timedelta(seconds=2)
    config.policy_set.kind("message")            # the mailbox policy's message kind
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purger.core.settings import ConfigError, PurgerConfig, parse_settings, read_toml
from purger.policies import PolicyError, build_policy_set


def build_config(raw: dict[str, Any] | None = None) -> PurgerConfig:
    """Validate a configuration given as nested dictionaries (the TOML file's shape), its policies' sections
    included, and build its policies; errors are a ``ConfigError`` naming each key.

    >>> build_config({"policies": {"rule_events": {"enabled": True}}}).policy_set.kind("rule_event").name
    'rule_event'
    """
    return with_policies(parse_settings(raw))


def load_config(path: str | Path | None = None) -> PurgerConfig:
    """Read and validate a TOML configuration file and build its policies; ``None`` gives the defaults."""
    return build_config(read_toml(path) if path is not None else {})


def with_policies(config: PurgerConfig, sections: dict[str, dict[str, Any]] | None = None) -> PurgerConfig:
    """``config`` with its policies built (from ``sections`` in place of its own, when given)."""
    if sections is not None:
        config = config.model_copy(update={"policies": sections})
    try:
        return config.with_policy_set(build_policy_set(config.policies))
    except PolicyError as error:
        lines = "\n".join(f"  {line}" for line in str(error).splitlines())
        raise ConfigError(f"invalid purger configuration:\n{lines}") from None
