"""A task family over an existing input kind, the worked example of docs/extending.md "A task family": `list_select`
draws pipelines on lists of ints (the input of `list_int`) from the steps that keep, drop or reorder elements and
never change one (filter, sort, reverse, dedup, take, top_k: no map, window, group or sink), so every answer is a
sub-list of its input in some order. `register()` adds it to the procedural draw (`generator.build.sample_params`,
hence `generate_tasks`, `selfplay tasks generate`, the warm start and the family proposal format); importing the
module does not, since a new family changes every task a run draws. tests/generator/test_family_example.py draws its
tasks, validates them and grades their references in the sandbox."""

from __future__ import annotations

from generator.families import register_family

NAME = "list_select"
KIND = "list:int"  # an input kind the families already take: list_int's
WEIGHT = 1.0  # its draw weight beside the others' (FAMILY_WEIGHTS: list_int 4, list_str 3, ...)
STEPS = ("filter", "sort", "reverse", "dedup", "take", "top_k")  # they select and reorder, never change an element


def register() -> None:
    """`list_select` drawn beside the other families from now on (FAMILIES, FAMILY_WEIGHTS, FAMILY_STEPS)."""
    register_family(NAME, KIND, WEIGHT, STEPS)
