"""xtml inside vLLM: a tool-call parser and a reasoning parser, both named
``xtml``, that read the token ids vLLM generates with xtml's parser.

:mod:`.plugin` is what vLLM's ``vllm.general_plugins`` entry point calls; it
imports nothing of vLLM until vLLM asks for a parser, and
:mod:`.parsers` (which imports vLLM) is loaded then. docs/vllm.md says how
to run it and why it enters vLLM the way it does.
"""
