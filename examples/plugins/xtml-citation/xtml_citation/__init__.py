"""Citations as an XTML element, added through xtml's plugin door only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from xtml.errors import TemplateError
from xtml.markup.header import is_name
from xtml.markup.nodes import Element, Text
from xtml.markup.sink import MarkupSink
from xtml.plugins import ContentExtension, Context


class CitationExtension(ContentExtension):
    name = "citation"
    part_types = ("citation",)

    def __init__(self, element: str, attribute: str) -> None:
        self.element = element
        self.attribute = attribute
        self.elements = (element,)
        # xtml checks these on render and before read_element sees one.
        self.attributes = {element: {attribute: str}}

    def prepare(self, part: Mapping[str, Any]) -> tuple[str, str]:
        source, text = part.get("source"), part.get("text", "")
        if not isinstance(source, str) or not source:
            raise ValueError("a citation needs a non-empty 'source' string")
        if not isinstance(text, str):
            raise ValueError("a citation's 'text' must be a string")
        return source, text

    def render(self, value: tuple[str, str], out: MarkupSink, ctx: Context) -> None:
        source, text = value
        out.element(self.element, ((self.attribute, source),), text)

    def normal(self, value: tuple[str, str], ctx: Context) -> dict[str, Any]:
        return {"type": "citation", "source": value[0], "text": value[1]}

    def read_element(self, el: Element, ctx: Context) -> dict[str, Any] | None:
        source = el.attr(self.attribute)
        if not source:
            raise ValueError(f"a citation needs its {self.attribute!r} attribute")
        if not all(isinstance(c, Text) for c in el.children):
            raise ValueError("a citation holds only text")
        return {"type": "citation", "source": source, "text": "".join(c.text for c in el.children)}  # type: ignore[union-attr]

    def completion_grammar(self, names: Mapping[str, str]) -> str:
        # What read_element accepts: a non-empty source, then only text.
        head = f'"{self.element} {self.attribute}=\\""'
        return (f'{names["start"]}: {names["open"]} {head} {names["nonempty_value"]} "\\"" {names["sep"]} '
                f'{names["text"]} {names["close"]} "{self.element}" {names["sep"]}\n')

    def jinja(self) -> str:
        # What prepare refuses, the template refuses; then the element, as
        # render writes it.
        at = "' (at messages[' ~ mi ~ '].' ~ where ~ ')'"
        return (
            "{%- if part.source is not string or part.source == '' -%}"
            "{{ raise_exception(\"a citation needs a non-empty 'source' string\" ~ " + at + ") }}"
            "{%- endif -%}"
            "{%- set text = part.text if 'text' in part else '' -%}"
            "{%- if text is not string -%}"
            "{{ raise_exception(\"a citation's 'text' must be a string\" ~ " + at + ") }}"
            "{%- endif -%}"
            f"{{{{ x_element('{self.element}', [['{self.attribute}', part.source]], text) }}}}"
        )

    def strategy(self) -> st.SearchStrategy[dict[str, Any]]:
        return st.builds(lambda s, t: {"type": "citation", "source": s, "text": t},
                         st.text(min_size=1, max_size=30), st.text(max_size=40))


class CitationPlugin:
    name = "citation"

    def configure(self, settings: Mapping[str, Any], where: str) -> CitationExtension:
        for k in settings:
            if k not in ("element", "attribute"):
                raise TemplateError(f"unknown key {k!r} (citation takes element, attribute)", location=where)
        element = settings.get("element", "cite")
        attribute = settings.get("attribute", "source")
        for key, v in (("element", element), ("attribute", attribute)):
            if not isinstance(v, str) or not is_name(v):
                raise TemplateError(f"{key} must be a valid XTML name", location=f"{where}.{key}")
        return CitationExtension(element, attribute)


plugin = CitationPlugin()
