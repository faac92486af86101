"""Completions in the shapes of the OpenAI Chat Completions API.

A parsed completion (``Template.parse(ids, tok, completion=True,
lenient=True)``, or the ``message`` of the stream's ``message_end``) becomes a
``chat.completion`` object (:func:`chat_completion`, or just its message and
finish reason: :func:`shape_message`), and the events of a
:class:`~xtml.codec.stream.StreamParser` become ``chat.completion.chunk``
objects (:class:`ChunkStream`, one per response). The functions keep no
state; a :class:`ChunkStream` holds only what one response needs, and its work
per text token is one small dict.

The rules (docs/serving.md has them with examples; spec.md §8.8 the cut-off
rule):

* **Fields.** The message is ``role``, ``content`` (text; ``None`` when there
  is none and the message makes calls, as OpenAI sends it),
  ``reasoning_content`` when the model reasoned, and ``tool_calls``. Content
  parts that are not text (an image the model wrote) have no place in an
  assistant message's text: they are left out, with a diagnostic.
* **Finish reason.** ``length`` when the completion was cut off (the stream's
  ``stop_reason``; for a batch parse, a ``truncated`` diagnostic without an
  ``early-end`` one: the input ended inside the message), else
  ``tool_calls`` when a call is handed back, else ``stop``. A message the
  engine stopped before its end (stop sequences or ids, a token of its own)
  is cut off too, and finishes with ``stop`` (``cut_by``).
* **Stop sequences** (:class:`StopSequences`): the text ends before the
  first one the model writes; a stream holds back what could start one.
* **Call ids** come from ``ids``, a function called once per call (default
  :func:`new_call_id`: ``call_`` and 24 random URL-safe characters, as
  OpenAI's); the normal form's ``call_0_K`` are ids inside a conversation and
  are not used. In a stream a call gets its id when it starts, and keeps it
  in the final message.
* **Cut-off calls.** When the completion was cut off, its last tool call is
  withheld from ``tool_calls``: the cut may have fallen inside it, and a call
  the model did not finish must not run. A diagnostic (kind
  ``withheld-call``) names it. A stream that has already sent the call's start
  sends nothing more for it: its arguments never get their closing brace, so
  they do not parse as JSON. ``ChunkStream(stream_arguments=False)`` sends
  each call whole once it is known to be kept, so that its chunks add up to
  exactly the batch message, cut-off calls included.
* **One call at most** (``max_calls=1``, for a request that set
  ``parallel_tool_calls`` false, when the engine made more anyway): the
  first call is kept, each further one withheld with a ``withheld-call``
  diagnostic; a stream sends nothing of it.
* **Arguments as they stream.** Typed arguments are sent as JSON text:
  ``{"key": `` when an argument starts, a string value's characters
  JSON-escaped as they arrive (escaping is per character, so the pieces join
  to the escaped whole), any other value once its argument ends (in the
  spelling of :func:`xtml.plugins.jsonfmt.arguments`; a value that is not of
  its declared type, or not standard JSON, is the string it was, as the
  parser reads it), ``, `` between arguments, and ``}`` when the call is
  known to be kept (the next call starts, or the message ends uncut). A json fallback
  block (arguments that are not a JSON object) is sent whole at the same
  point: a piece of it is no use to a client, and a cut-off one must not look
  complete. The pieces of a kept call join to exactly its final
  ``arguments``; when the parser settles on other arguments than those
  already sent (a key given twice, a json block after typed arguments), the
  call gets nothing more and a diagnostic (``diverged-call``) says so; the
  final message (:meth:`ChunkStream.completion`) has the parser's reading.
* **Diagnostics** go in ``choices[i]["xtml_diagnostics"]``, next to
  ``message`` (or, in a stream, on the chunk that carries ``finish_reason``);
  the message itself holds only OpenAI's fields. Each is the parser's
  ``{kind, offset, message}``; those about a call add its ``index`` (as in
  the chunks), ``id`` and ``name``. Diagnostics the stream reports after the
  message ended (output after the end marker) are in
  :attr:`ChunkStream.diagnostics` and :meth:`ChunkStream.completion` only.
"""

from __future__ import annotations

from .chunks import SSE, SSE_DONE, ChunkStream, sse
from .legacy import FunctionCalls
from .shape import Shaped, chat_completion, new_call_id, new_completion_id, shape_message, usage
from .stops import StopSequences

__all__ = [
    "SSE",
    "SSE_DONE",
    "ChunkStream",
    "FunctionCalls",
    "Shaped",
    "StopSequences",
    "chat_completion",
    "new_call_id",
    "new_completion_id",
    "shape_message",
    "sse",
    "usage",
]
