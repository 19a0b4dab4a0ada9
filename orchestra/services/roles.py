"""The roles of SPEC §2 (`UserAuthority`) and their order."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    USER = "USER"
    ADMINISTRATOR = "ADMINISTRATOR"
    SUPER_ADMINISTRATOR = "SUPER_ADMINISTRATOR"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def at_least(self, other: Role) -> bool:
        return self.rank >= other.rank


_RANK = {Role.USER: 0, Role.ADMINISTRATOR: 1, Role.SUPER_ADMINISTRATOR: 2}

ROLE_NAMES = [role.value for role in Role]
