"""Serving: what a model generates, read as it streams, the grammar it
may generate under (for constrained decoding), and the OpenAI shapes of
both (:mod:`.openai`); conversations that render only their new turns
(:mod:`.conversation`)."""

from .conversation import Conversation
from .grammar import completion_grammar
from .openai import ChunkStream, chat_completion, shape_message
from .stream import StreamEvent, StreamParser

__all__ = ["ChunkStream", "Conversation", "StreamEvent", "StreamParser", "chat_completion", "completion_grammar",
           "shape_message"]
