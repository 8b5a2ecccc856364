"""`governor plan`: an expert placement from a heat file, printed as JSON.

Reads {"heat": [[tokens per logical expert] per layer]}; prints {"phy2log": [[logical expert per physical slot]
per layer], "balancedness": float}, where slot s lives on device s // S and device d on node d // (D / N).
balancedness is null when the heat holds no tokens. Bad input: one line on stderr naming the problem, exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, Field, PositiveInt, ValidationError, field_validator

from controller.decide.planner import plan_placement
from seam.placement import PlacementError, Topology, placement_balancedness

PROG = "governor plan"
Tokens = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


class PlanFlags(BaseModel):
    heat: Path
    nodes: PositiveInt
    devices: PositiveInt
    slots_per_device: PositiveInt


class HeatFile(BaseModel):
    heat: list[list[Tokens]]

    @field_validator("heat")
    @classmethod
    def _rectangular(cls, heat: list[list[float]]) -> list[list[float]]:
        if not heat:
            raise ValueError("no layers")
        for layer, row in enumerate(heat):
            if len(row) != len(heat[0]):
                raise ValueError(f"layer {layer} has {len(row)} experts, layer 0 has {len(heat[0])}")
        if not heat[0]:
            raise ValueError("no experts")
        return heat


class PlanInputError(ValueError):
    """Bad input to `governor plan`; the message names it."""


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heat", required=True, help='JSON file {"heat": [[tokens per logical expert] per layer]}')
    parser.add_argument("--nodes", required=True, help="nodes N")
    parser.add_argument("--devices", required=True, help="devices D in all, a multiple of N")
    parser.add_argument("--slots-per-device", required=True, help="expert slots S on each device (D x S >= experts)")


def run_plan(args: argparse.Namespace) -> int:
    try:
        flags = _flags(args)
        heat = _read_heat(flags.heat)
        topology = Topology(flags.nodes, flags.devices, flags.slots_per_device)
        phy2log = plan_placement(heat, topology)
    except (PlanInputError, PlacementError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"phy2log": phy2log, "balancedness": placement_balancedness(heat, phy2log, topology)}))
    return 0


def _flags(args: argparse.Namespace) -> PlanFlags:
    try:
        return PlanFlags(heat=args.heat, nodes=args.nodes, devices=args.devices,
                         slots_per_device=args.slots_per_device)
    except ValidationError as error:
        first = error.errors()[0]
        raise PlanInputError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None


def _read_heat(path: Path) -> np.ndarray:
    try:
        text = path.read_text()
    except OSError as error:
        raise PlanInputError(f"--heat: cannot read {path}: {error.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanInputError(f"--heat: {path} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise PlanInputError(f'--heat: {path} must hold a JSON object {{"heat": [[...], ...]}}')
    try:
        return np.array(HeatFile.model_validate(data).heat, dtype=np.float64)
    except ValidationError as error:
        first = error.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        raise PlanInputError(f"--heat: {path}: {_where(first['loc'])}: {message}") from None


def _where(loc: tuple) -> str:
    names = ("heat", "layer", "expert")
    return ", ".join(str(part) if i == 0 else f"{names[i]} {part}" for i, part in enumerate(loc[:3]))
