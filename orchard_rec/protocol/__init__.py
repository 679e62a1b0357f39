"""The wire dialects: what OpenAI Chat / Completions / Responses and Anthropic Messages
requests, answers and event streams look like, and how each translates to and from chat.

Owns: translation between dialects, SSE parsing and encoding, stream reassembly and
token extraction. May import: the standard library, pydantic, orjson, ``orchard_rec.errors``.
Never imports ``proxy``, ``storage``, ``reconstruct``, ``exporters`` or ``intercept``.
"""
