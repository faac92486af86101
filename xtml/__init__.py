"""xtml — XTML, the eXtensible Token Markup Language.

>>> import xtml
>>> k3 = xtml.load("kimi-k3")
>>> text, segments = k3.render({"messages": [{"role": "user", "content": "hi"}]}, thinking=False)
>>> text.startswith('<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>')
True
"""

from .codec.conversation import Conversation
from .codec.stream import StreamEvent, StreamParser, StreamState
from .errors import (
    ExportError,
    MarkupError,
    MessageError,
    OptionError,
    ParseError,
    RequestError,
    TemplateError,
    TokenizerError,
    XtmlError,
)
from .markup.segments import Segment
from .template import Ambiguity, Dropped, Encoded, Rendered, Template, load
from .vocab.load import load_tokenizer
from .vocab.vocabulary import Vocabulary

__version__ = "0.1.0"

__all__ = [
    "Ambiguity",
    "Conversation",
    "Dropped",
    "Encoded",
    "ExportError",
    "MarkupError",
    "MessageError",
    "OptionError",
    "ParseError",
    "Rendered",
    "RequestError",
    "Segment",
    "StreamEvent",
    "StreamParser",
    "StreamState",
    "Template",
    "TemplateError",
    "TokenizerError",
    "Vocabulary",
    "XtmlError",
    "load",
    "load_tokenizer",
]
