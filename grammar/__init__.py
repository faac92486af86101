"""XTML grammars, shipped as package data (``xtml.grammar``)."""
