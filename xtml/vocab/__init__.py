"""The tokenizer binding: vocabularies (tokenizer.json, tiktoken files), the
binding of a template's markers to their special ids, and where each element
of a tree lies in its ids. Knows markup, not chat."""

from .binding import Binding, IdSink, join_ids
from .load import load_tokenizer
from .vocabulary import Vocabulary, byte_vocabulary

__all__ = ["Binding", "IdSink", "Vocabulary", "byte_vocabulary", "join_ids", "load_tokenizer"]
