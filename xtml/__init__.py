"""xtml — XTML, the eXtensible Token Markup Language.

>>> import xtml
>>> k3 = xtml.load("kimi-k3")
>>> text, segments = k3.render({"messages": [{"role": "user", "content": "hi"}]}, thinking=False)
>>> text.startswith('<|open|>message role="user"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>')
True
"""

from .errors import (
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
from .stream import StreamEvent, StreamParser
from .template import Rendered, Template, load
from .tokenizer import Vocabulary, load_tokenizer

__version__ = "0.1.0"

__all__ = [
    "MarkupError",
    "MessageError",
    "OptionError",
    "ParseError",
    "Rendered",
    "RequestError",
    "Segment",
    "StreamEvent",
    "StreamParser",
    "Template",
    "TemplateError",
    "TokenizerError",
    "Vocabulary",
    "XtmlError",
    "load",
    "load_tokenizer",
]
