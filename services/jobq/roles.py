"""The group roles of one jobq install, and their names.

Roles are cluster-wide: two databases whose jobq used the same group roles
shared their rights, and a login granted ``jobq_producer`` for team A's
database could enqueue into, claim from and read team B's (issue #47). So an
install's roles carry its own prefix: ``<prefix>_owner``, ``_producer``,
``_consumer``, ``_reaper``, ``_reader``, with ``JOBQ_ROLE_PREFIX`` (default
``jobq``: the names DESIGN.md gives). The migrations, the ``-- grant:``
lines of queries.sql and the few statements that name a role are written
with the default names; :func:`rename` gives their text for another prefix
where ``jobq migrate``, the dashboard and ``jobq uninstall`` run them.
"""

from __future__ import annotations

import re

DEFAULT = "jobq"
KINDS = ("owner", "producer", "consumer", "reaper", "reader")
PREFIX = re.compile(r"^[a-z][a-z0-9_]{0,29}$")
_NAME = re.compile(r"\bjobq_(owner|producer|consumer|reaper|reader)\b")


def name(kind: str, prefix: str = DEFAULT) -> str:
    """``name("producer", "teamb")`` is ``teamb_producer``."""
    assert kind in KINDS, kind
    return f"{prefix}_{kind}"


def names(prefix: str = DEFAULT) -> tuple[str, ...]:
    """The install's group roles, the owner first."""
    return tuple(name(k, prefix) for k in KINDS)


def rename(text: str, prefix: str = DEFAULT) -> str:
    """SQL written with the default role names, for the install ``prefix``."""
    if prefix == DEFAULT:
        return text
    return _NAME.sub(lambda m: f"{prefix}_{m.group(1)}", text)


def prefix_of(owner: str | None) -> str | None:
    """The prefix of an install whose schema ``owner`` owns (None: not one of ours)."""
    if owner is None or not owner.endswith("_owner"):
        return None
    candidate = owner.removesuffix("_owner")
    return candidate if PREFIX.match(candidate) else None
