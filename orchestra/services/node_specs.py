"""The built-in system nodes (SPEC §3): their names, descriptions, prompts and tools.

Only a node's provider and model are stored (and editable); the rest is fixed here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeSpec:
    name: str
    description: str
    system_prompt: str
    tools: tuple[str, ...]


NODE_SPECS: dict[str, NodeSpec] = {
    spec.name: spec
    for spec in (
        NodeSpec(
            "planner",
            "Breaks a request into ordered, concrete steps.",
            "You are the planner. Break the user's request into a short numbered list of "
            "concrete steps, noting what each step needs from the ones before it.",
            ("current_time",),
        ),
        NodeSpec(
            "reviewer",
            "Checks work for errors and gaps and says what to fix.",
            "You are the reviewer. Check the work you are given for errors, gaps and "
            "unsupported claims; verify any arithmetic with the calculator. Answer with a "
            "verdict and a list of concrete fixes.",
            ("calculator",),
        ),
        NodeSpec(
            "summarizer",
            "Condenses text and uploaded files into a short summary.",
            "You are the summarizer. Condense what you are given (read uploaded files "
            "when their ids are mentioned) into a short, faithful summary.",
            ("read_upload",),
        ),
    )
}
