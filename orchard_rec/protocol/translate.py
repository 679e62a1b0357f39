"""Alias module: the translation functions under their former names (they live per dialect now)."""

from __future__ import annotations

from orchard_rec.protocol import assistant_message, chat_request_of, template_message
from orchard_rec.protocol.anthropic import MessagesStream, chat_to_messages
from orchard_rec.protocol.anthropic import to_chat as messages_to_chat
from orchard_rec.protocol.responses import ResponsesStream, chat_to_responses
from orchard_rec.protocol.responses import to_chat as responses_to_chat

__all__ = [
    "MessagesStream",
    "ResponsesStream",
    "assistant_message",
    "chat_request_of",
    "chat_to_messages",
    "chat_to_responses",
    "messages_to_chat",
    "responses_to_chat",
    "template_message",
]
