"""The agent platform (SPEC §3): skills, workers, system nodes and the tools they use,
one module each. The engine reads agents only through the agent cache
(`services/agent_cache.py`), which every write here drops through `Caches`.
"""

from orchestra.services.agents.nodes import get_node, list_nodes, update_node
from orchestra.services.agents.skills import (
    PROMPT_MAX,
    create_skill,
    delete_skill,
    get_skill,
    list_skills,
    skill_view,
    update_skill,
)
from orchestra.services.agents.tools import list_tools
from orchestra.services.agents.workers import (
    create_worker,
    delete_worker,
    get_worker,
    list_workers,
    update_worker,
    worker_view,
    worker_views,
)
from orchestra.services.node_specs import NODE_SPECS, NodeSpec

__all__ = [
    "NODE_SPECS",
    "PROMPT_MAX",
    "NodeSpec",
    "create_skill",
    "create_worker",
    "delete_skill",
    "delete_worker",
    "get_node",
    "get_skill",
    "get_worker",
    "list_nodes",
    "list_skills",
    "list_tools",
    "list_workers",
    "skill_view",
    "update_node",
    "update_skill",
    "update_worker",
    "worker_view",
    "worker_views",
]
