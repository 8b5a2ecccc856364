"""Every action, trial outcome and proposal kind the controller's code writes is one its Literal types name (the
types a checker sees, and the strings the store, the API and the metrics carry)."""
import ast
from pathlib import Path
from typing import get_args

import controller
from controller.outcomes import Action, ProposalKind, TrialOutcome

SOURCES = {path: ast.parse(path.read_text()) for path in Path(controller.__file__).parent.rglob("*.py")}


def _first_strings(function: str, position: int) -> set[str]:
    """The string literals passed as argument `position` to every call of a function or method named `function`."""
    found = set()
    for tree in SOURCES.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == function \
                    and len(node.args) > position and isinstance(node.args[position], ast.Constant):
                found.add(node.args[position].value)
    return found


def _strings(node: ast.AST, keys: bool = True) -> set[str]:
    return {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            and (keys or not any(c is key for d in ast.walk(node) if isinstance(d, ast.Dict) for key in d.keys))}


def _trial_end_actions() -> set[str]:
    """What the loop's _end_trial assigns to `action`, and the values of the module's tables typed as actions."""
    tree = SOURCES[Path(controller.__file__).parent / "loop.py"]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and "Action]" in ast.unparse(node.annotation):
            found |= _strings(node.value, keys=False)
        if isinstance(node, ast.FunctionDef) and node.name == "_end_trial":
            for assign in ast.walk(node):
                targets = assign.targets if isinstance(assign, ast.Assign) else [getattr(assign, "target", None)]
                if isinstance(assign, (ast.Assign, ast.AnnAssign)) and any(getattr(t, "id", None) == "action"
                                                                            for t in targets):
                    found |= _strings(assign.value, keys=False)
    return found


def test_every_recorded_action_is_an_action():
    written = _first_strings("decide", 0) | _first_strings("record_decision", 0)
    assert {"trial", "pin", "rollback", "no_data"} <= written
    assert written <= set(get_args(Action)), written - set(get_args(Action))


def test_the_actions_a_trial_ends_with_are_actions():
    ends = _trial_end_actions()
    assert {"keep", "revert", "fallback", "reenable", "cut_short"} <= ends
    assert ends <= set(get_args(Action)), ends - set(get_args(Action))


def test_every_trial_outcome_written_is_a_trial_outcome():
    written = _first_strings("end_trial_for", 0) | _first_strings("_end_trial", 0) | _first_strings("finish_trial", 1)
    assert {"cut_short", "rolled_back", "abandoned", "interrupted"} <= written
    assert written <= set(get_args(TrialOutcome)), written - set(get_args(TrialOutcome))


def test_every_proposal_kind_is_a_proposal_kind():
    kinds = _first_strings("Proposal", 1)
    assert {"fallback_probe", "spec_method", "placement", "optuna"} <= kinds
    assert kinds <= set(get_args(ProposalKind)), kinds - set(get_args(ProposalKind))
