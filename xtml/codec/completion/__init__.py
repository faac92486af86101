"""The plan of a completion, for constrained decoding.

From a dialect, a tokenizer binding and one request, :func:`completion_plan`
reads everything the assistant may generate after the generation prompt
(:mod:`.plan`), with each tool's arguments typed by its JSON schema
(:mod:`.schema`). The plan is syntax-free but for its marker references; one
writer module per format spells it as a grammar (:mod:`.llguidance`,
:mod:`.xgrammar`, :mod:`.gbnf`, sharing :mod:`.writer`), and ``Template.completion_grammar``
loads only the one asked for.
"""

from .plan import FORMATS, FRAGMENT_NAMES, MAX_CALLS, Plan, completion_plan, deep_schemas_refused, fragment_rules
from .schema import (
    ALL_TYPES,
    TEXT_TYPES,
    Arg,
    StringForm,
    Tool,
    Value,
    deref,
    has_properties,
    json_type,
    json_types,
    restricted,
)

__all__ = ["ALL_TYPES", "FORMATS", "FRAGMENT_NAMES", "MAX_CALLS", "TEXT_TYPES", "Arg", "Plan", "StringForm", "Tool",
           "Value", "completion_plan", "deep_schemas_refused", "deref", "fragment_rules", "has_properties",
           "json_type", "json_types", "restricted"]
