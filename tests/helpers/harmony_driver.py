"""Run by the vLLM environment's Python (which has openai-harmony): reads
JSON jobs on stdin, writes their results as JSON on stdout. harmony's
encoding reads the o200k vocabulary from TIKTOKEN_ENCODINGS_BASE (a folder
holding o200k_base.tiktoken): nothing is downloaded.

Jobs: ``{"render": [message, ...]}``, harmony's rendering of a
conversation for the assistant's completion (``complete``: true) or whole
(``keep_analysis``: an answer's analysis kept before its final message);
``{"parse": [id, ...]}``, what its StreamableParser reads of a completion,
each message ``{"role", "recipient", "channel", "content_type", "text"}``.
A message to render is ``{"role", "text"}`` with, for the system message,
``identity``, ``effort``, ``date``, for the developer message
``instructions``, and for any other ``channel``, ``recipient``,
``content_type``, ``author`` (a tool's name)."""

from __future__ import annotations

import json
import sys
from typing import Any

import openai_harmony as oh  # type: ignore[import-not-found]


def _message(m: dict[str, Any]) -> Any:
    role = oh.Role(m["role"])
    if role == oh.Role.SYSTEM:
        content = oh.SystemContent.new().with_model_identity(m["identity"]).with_reasoning_effort(
            oh.ReasoningEffort(m["effort"].capitalize())).with_conversation_start_date(m["date"])
        return oh.Message.from_role_and_content(role, content)
    if role == oh.Role.DEVELOPER:
        return oh.Message.from_role_and_content(role, oh.DeveloperContent.new().with_instructions(m["instructions"]))
    if m.get("author"):
        msg = oh.Message.from_author_and_content(oh.Author.new(role, m["author"]), m["text"])
    else:
        msg = oh.Message.from_role_and_content(role, m["text"])
    if m.get("channel"):
        msg = msg.with_channel(m["channel"])
    if m.get("recipient"):
        msg = msg.with_recipient(m["recipient"])
    if m.get("content_type"):
        msg = msg.with_content_type(m["content_type"])
    return msg


def main() -> None:
    enc = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    out: list[Any] = []
    for job in json.load(sys.stdin):
        if "render" in job:
            conv = oh.Conversation.from_messages([_message(m) for m in job["render"]])
            # harmony drops an answer's analysis before its final message
            # unless told to keep it (as the answer that ends a render does).
            config = oh.RenderConversationConfig(auto_drop_analysis=not job.get("keep_analysis"))
            ids = enc.render_conversation_for_completion(conv, oh.Role.ASSISTANT, config) if job.get("complete") \
                else enc.render_conversation(conv, config)
            out.append(list(ids))
        else:
            p = oh.StreamableParser(enc, role=oh.Role.ASSISTANT)
            for t in job["parse"]:
                p.process(t)
            p.process_eos()
            out.append([{"role": m.author.role.value, "recipient": m.recipient, "channel": m.channel,
                         "content_type": m.content_type, "text": "".join(c.text for c in m.content)}
                        for m in p.messages])
    json.dump({"results": out, "stop": enc.stop_tokens_for_assistant_actions()}, sys.stdout)


if __name__ == "__main__":
    main()
