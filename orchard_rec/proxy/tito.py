"""Token-in/token-out mode: the proxy renders prompts itself, so sessions never drift.

For chat completions, Responses and Anthropic Messages requests, the conversation is
rendered with the model's Hugging Face chat template (with tools). Where the rendered
conversation starts with what this session already produced (the previous prompt ids +
the ids the model generated, whose rendering is kept as text), those exact ids are
reused and only the template's tokens for what is new (tool results, user turns) are
appended; otherwise the call is rendered fresh and starts a new branch, recorded as such
(``metadata.tito``). The ids go to the upstream's token endpoint (vLLM ``/v1/completions``
with a token-id ``prompt``, or SGLang's native ``/generate`` with ``input_ids``), and the
generated ids are parsed back into the client's dialect: text, ``<think>`` reasoning, and
Hermes/Qwen ``<tool_call>`` JSON (``--tool-parser hermes``).

Non-obvious bits:
- Prefix matching compares renderings (text), not client JSON: a harness that re-serialises
  tool arguments or rewrites tool-call ids still matches, because the template renders
  them the same; a compacted or edited history does not, and forks a new branch.
- Branch state lives in this process (an LRU of sessions), backed by the database: with a
  ``source`` (``proxy/tito_history.py``), a session that is not in memory, or that the
  database shows calls for that this process did not make (another replica served them), is
  rebuilt from its recorded calls, which hold the exact ids. So a restart or a second replica
  continues a session's branch instead of splitting it; sticky routing only saves the reload.
- The upstream call is not streamed; a streaming client gets the answer as one burst of
  well-formed events once generation ends.
- Images (a vision-language model: the tokenizer has an image token such as Qwen2-VL's
  ``<|image_pad|>``): messages with image parts are handed to the template as vLLM hands them
  (``{"type": "image"}`` / ``{"type": "text"}`` parts), so it writes one placeholder per image;
  the ids go to vLLM's token-in endpoint ``POST /inference/v1/generate`` (``vllm serve
  --enable-scale-out``) with the images as ``content_parts``, in prompt order. The server
  expands each placeholder to the image's size (Qwen2-VL: one pad per 2×2 merged patch) and
  returns the expanded ``prompt_token_ids``, which are recorded; the branch keeps the ids as
  sent (one pad per image) and the images' digests, so a later turn extends it only when it
  shows the same images in the same places. vLLM's ``/v1/completions`` takes no images with a
  token prompt; SGLang's ``/generate`` is refused with images (a clear 400): given ``image_data``,
  its multimodal processors decode ``input_ids`` to text and re-tokenize it (``load_mm_data``), so
  the ids the model sees would not be the ones sent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson

from orchard_rec.dialects import template_message
from orchard_rec.dialects.images import decode_data_url, image_token_id
from orchard_rec.errors import BadRequest, cache_stats
from orchard_rec.settings import current
from orchard_rec.storage.delta import Ids

__all__ = [
    "Branch",
    "HistorySource",
    "Plan",
    "Recorded",
    "TitoSessions",
    "chat_images",
    "collapse_images",
    "wire_body",
]

log = logging.getLogger("orchard_rec.tito")

_IMAGE_PARTS = ("image_url", "input_image")


@dataclass
class Branch:
    index: int
    tokens: Ids
    """The last call's prompt ids + the ids the model generated: a next prompt extends them in
    the same buffer (``Ids.extend``), so neither it nor the writer copies the ids it shares."""
    text: str
    """The template's rendering of the conversation up to and including that answer."""
    json: bytes
    """``tokens`` as a JSON array less its closing ``]``: a next prompt's JSON is this, a comma
    and its new ids' (the upstream body is not serialized whole: ``wire_body``)."""
    version: int = 0
    images: tuple[str, ...] = ()
    """Digests of the images ``tokens`` show (one placeholder each), in order."""
    seen: list[dict[str, Any]] | None = None
    """The messages of the branch's last request, as the client sent them (chat form): a request
    that repeats them, then the answer, then new messages continues the branch without the whole
    conversation rendered (``TitoSessions.plan``). None: only a whole rendering can tell."""
    tools: list[dict[str, Any]] | None = None
    """That request's tools."""
    tail: str | None = None
    """The template's rendering of ``context(seen)`` + the answer, ``covered``: a next request's
    small rendering (the same context, its messages from the answer on) starts with it when the
    client sent the answer back as the template renders it."""


@dataclass
class _Session:
    branches: list[Branch] = field(default_factory=list)
    next_index: int = 0
    synced: int = 0
    """Calls of the session in the database that this state accounts for."""
    size: int = 0
    """About the bytes its branches hold (``_branch_bytes``), as last counted."""


def _branch_bytes(b: Branch) -> int:
    """About the memory a branch holds: its ids' buffer, their JSON, its texts (``sys.getsizeof``
    of a string or bytes is its real size, in O(1)); the request's messages are the parsed
    request's objects (shared with the request cache), counted as a pointer each."""
    n = b.tokens.nbytes + sys.getsizeof(b.json) + sys.getsizeof(b.text) + 400
    if b.tail is not None:
        n += sys.getsizeof(b.tail)
    return n + 8 * len(b.seen or ()) + 8 * len(b.images)


@dataclass
class Recorded:
    """A recorded tito call, as ``restore`` needs it: the last call of a branch."""

    branch: int
    prompt: list[int]
    completion: list[int]
    messages: list[dict[str, Any]]
    answer: dict[str, Any]
    tools: list[dict[str, Any]] | None


class Plan(NamedTuple):
    """What ``TitoSessions.plan`` decided for a request."""

    prompt: Ids
    branch: Branch | None
    version: int
    """The branch's version as read (``commit`` extends it only if nobody did meanwhile)."""
    decision: dict[str, Any]
    text: str
    """The prompt's rendering."""
    json: bytes
    """The prompt's ids as a JSON array (``wire_body``)."""
    images: tuple[tuple[str, str], ...] = ()
    """``(url, digest)`` of the images the prompt shows, in order (``TitoSessions.images``)."""


def _open_json(ids: list[int]) -> bytes:
    """``ids`` as a JSON array less its closing ``]``."""
    return orjson.dumps(ids)[:-1]


def _extend_json(head: bytes | memoryview, ids: list[int], close: bool) -> bytes:
    """An open JSON array (``Branch.json``) extended by ``ids``; closed with ``]`` if ``close``.
    One copy of ``head`` (a memcpy), the new ids serialized."""
    parts = [head]
    if ids:
        if len(head) > 1:
            parts.append(b",")
        parts.append(orjson.dumps(ids)[1:-1])
    if close:
        parts.append(b"]")
    return b"".join(parts)


def wire_body(body: dict[str, Any], prompt: Any, prompt_json: bytes) -> bytes:
    """``orjson.dumps(body)`` where the value that is ``prompt`` (the prompt's ``Ids``) is written
    as ``prompt_json`` (its JSON, ``Plan.json``): no pass over 150k ids per call."""
    return orjson.dumps({k: orjson.Fragment(prompt_json) if v is prompt else v for k, v in body.items()})


class HistorySource(Protocol):
    """Where a session's recorded calls are read (the database, through ``Store``)."""

    def count(self, key: str) -> int:
        """Calls the database holds for the session."""
        ...

    def load(self, key: str) -> tuple[int, list[Recorded]]:
        """``(calls read, the last recorded call of each branch)``."""
        ...


class TitoSessions:
    """Per-session branches of exact token history (thread-safe, bounded).

    Rendering in O(what is new): a chat template renders the whole conversation, and through
    ``transformers`` that costs ~25 us a message (10 ms at 150k tokens, twice per call). A
    request that repeats its branch's last request message for message (compared as objects:
    the request parser shares them between calls), then the answer, then new messages, is
    rendered small instead: the system message and the message before the answer (the
    context: the template's header, the previous role), then the answer as the client sent it
    and the new messages. That rendering starts with the context + the branch's own answer
    (``Branch.tail``) when the client sent the answer back as the template renders it, and what
    follows is what the whole rendering has after the branch's text, for a template whose
    rendering of a message depends only on the message, its neighbours' roles and the header.
    Most templates are (ChatML, Qwen2.5, Hermes, Llama 3); one that renders earlier turns by
    what comes later (Qwen3 drops old reasoning after a new user turn) or numbers its messages
    is not. So: a probe renders a few conversations both ways at first use; then the first 8
    small renderings, and every ``verify_every``-th after, are checked against the whole one.
    Any difference turns it off for the process (logged), and that call uses the whole
    rendering: a prompt is the template's rendering of the conversation either way.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_sessions: int = 10_000,
        max_branches: int = 16,
        incremental: bool = True,
        verify_every: int = 64,
        max_bytes: int | None = None,
    ) -> None:
        self.tok = tokenizer
        self.image_token = image_token_id(tokenizer)
        """The VLM's image placeholder id; None for a text model (image parts then dropped)."""
        self.max_sessions = max_sessions
        self.max_branches = max_branches
        self.max_bytes = current().tito_cache_bytes if max_bytes is None else max_bytes
        """Sessions are dropped, least recently used first, past this many bytes of branches (env
        ``ORCHARD_TITO_CACHE_MB``, default 1024: ~450 sessions at a 150k-token context) or
        ``max_sessions``; a dropped session's next call rebuilds it from the database (``source``),
        in O(its context), as a replica that did not serve its last turn does."""
        self.bytes = 0
        """What the sessions held count (``_Session.size``)."""
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()
        self.source: HistorySource | None = None
        """Set by the app: rebuild sessions from the database (restarts, several replicas)."""
        self.incremental = incremental
        """Small renderings (above)."""
        self.verify_every = max(1, verify_every)
        self.off_reason: str | None = None
        """Why small renderings were turned off (the probe or a check found a difference)."""
        self.small = 0
        """Calls planned from a small rendering."""
        self.checked = 0
        """Of those, checked against the whole rendering."""
        self.grown = 0
        """Branch texts extended by an answer's small rendering (checked on the same schedule)."""
        self._probed = False
        self.hits = 0
        """Calls of a session held here (its branches in memory, in step with the database)."""
        self.misses = 0
        """Calls whose session was rebuilt from the database first (dropped here, or served elsewhere)."""

    def stats(self) -> dict[str, int]:
        return cache_stats(len(self._sessions), self.bytes, self.max_bytes, self.hits, self.misses)

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool
    ) -> str:
        msgs = [self.template_message(m) for m in messages]
        return str(
            self.tok.apply_chat_template(
                msgs, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False
            )
        )

    def template_message(self, m: dict[str, Any]) -> dict[str, Any]:
        """``template_message``, keeping image parts (as vLLM's ``{"type": "image"}``) for a VLM."""
        out = template_message(m)
        content = m.get("content")
        if self.image_token is not None and isinstance(content, list) and _has_image(content):
            parts: list[dict[str, Any]] = []
            for p in content:
                if not isinstance(p, dict):
                    continue
                if p.get("type") in _IMAGE_PARTS:
                    if _part_url(p):
                        parts.append({"type": "image"})
                elif p.get("type") in ("text", "input_text", "output_text") and isinstance(
                    p.get("text"), str
                ):
                    parts.append({"type": "text", "text": p["text"]})
            out["content"] = parts
        return out

    def images(self, messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """``(url, digest)`` of the images the template renders, in order ([] for a text model)."""
        return chat_images(messages) if self.image_token is not None else []

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def covered(self, rendered: str, completion: list[int]) -> str:
        """The part of the template's rendering (ending with the answer) that the exact ids cover.

        The template closes the answer with its end-of-turn token and then whatever follows
        it (ChatML: ``<|im_end|>\n``). The ids end at the end-of-turn token when the model
        emitted it, else (a stop string) before it: the rest is the template's, and goes
        with the next turn's tokens, so prompts stay the template's render token for token.
        """
        eos = getattr(self.tok, "eos_token", None)
        eos_id = getattr(self.tok, "eos_token_id", None)
        if not eos or eos not in rendered:
            return rendered
        at = rendered.rindex(eos)
        return rendered[: at + len(eos)] if completion and completion[-1] == eos_id else rendered[:at]

    def plan(
        self, key: str | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> Plan:
        """The prompt's ids for this request: the branch it continues (its ids extended by the
        template's ids for what is new) or a fresh rendering."""
        restored = key is not None and self.source is not None and self._sync(key)
        snapshot: list[tuple[Branch, int, Ids, str, Any, Any, str | None, bytes]] = []
        if key is not None:
            with self._lock:
                sess = self._sessions.get(key)
                if sess is not None:
                    self.hits += not restored
                    self._sessions.move_to_end(key)
                    snapshot = [
                        (b, b.version, b.tokens, b.text, b.seen, b.tools, b.tail, b.json)
                        for b in sess.branches
                    ]
        else:
            sess = None
        images = tuple(self.images(messages))
        digests = tuple(d for _, d in images)
        if snapshot and self.incremental:
            if not self._probed:
                self._probe()
            got = self._small(snapshot, messages, tools) if self.incremental else None
            if got is not None:
                b, version, tokens, text, tjson, new = got
                plan = self._extend(b, version, tokens, tjson, self.encode(new), text + new, images)
                self._check_images(plan.prompt, digests)
                return plan
        full = self.render(messages, tools, True)
        best: tuple[Branch, int, Ids, str, bytes] | None = None
        for b, version, tokens, text, _, _, _, tjson in snapshot:
            if (
                full.startswith(text)
                and digests[: len(b.images)] == b.images
                and (best is None or len(text) > len(best[3]))
            ):
                best = (b, version, tokens, text, tjson)
        if best is not None:
            b, version, tokens, text, tjson = best
            plan = self._extend(b, version, tokens, tjson, self.encode(full[len(text) :]), full, images)
            self._check_images(plan.prompt, digests)
            return plan
        if key is None:
            decision: dict[str, Any] = {"fresh": True, "reason": "no session"}
        elif sess is None:
            decision = {"fresh": True, "reason": "first call of the session"}
        else:
            decision = {"fresh": True, "reason": "history differs from every branch of this session"}
        ids = self.encode(full)
        prompt = Ids(ids)
        self._check_images(prompt, digests)
        return Plan(prompt, None, 0, decision, full, orjson.dumps(ids), images)

    def _extend(
        self,
        b: Branch,
        version: int,
        tokens: Ids,
        tjson: bytes,
        new: list[int],
        text: str,
        images: tuple[tuple[str, str], ...],
    ) -> Plan:
        """The plan continuing branch ``b`` (``tokens`` and ``tjson`` as read) with ``new`` ids."""
        with self._lock:  # two calls extending one buffer at once: the second copies (``Ids.extend``)
            prompt = tokens.extend(new)
        json = _extend_json(tjson, new, True)
        return Plan(prompt, b, version, {"branch": b.index, "fresh": False}, text, json, images)

    @staticmethod
    def context(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What a small rendering starts with: the system message (the template's header) and
        the last message of the branch's request (the answer's predecessor)."""
        if len(seen) > 1 and isinstance(seen[0], dict) and seen[0].get("role") in ("system", "developer"):
            return [seen[0], seen[-1]]
        return seen[-1:]

    def _small(
        self,
        snapshot: list[tuple[Branch, int, Ids, str, Any, Any, str | None, bytes]],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> tuple[Branch, int, Ids, str, bytes, str] | None:
        """The branch this request continues (with its version, ids, text and ids' JSON as read)
        and what the prompt's rendering has past that text (the small rendering past the branch's
        tail); None when none fits (the whole rendering decides)."""
        order = sorted(snapshot, key=lambda t: len(t[4]) if t[4] is not None else -1, reverse=True)
        for b, version, tokens, text, seen, btools, tail, tjson in order:
            if seen is None or tail is None:
                continue
            p = len(seen)
            if len(messages) <= p or not _same_tools(tools, btools) or messages[:p] != seen:
                continue
            small = self.render(self.context(seen) + messages[p:], tools, True)
            if not small.startswith(tail):
                continue
            new = small[len(tail) :]
            self.small += 1
            if self._due(self.small):
                self.checked += 1
                full = self.render(messages, tools, True)
                if not (full.startswith(text) and full[len(text) :] == new):
                    self._turn_off("a small rendering differed from the whole one", full, text + new)
                    return None
            return b, version, tokens, text, tjson, new
        return None

    def _due(self, n: int) -> bool:
        """Whether the ``n``-th small rendering is checked against the whole one."""
        return n <= 8 or n % self.verify_every == 0

    def _turn_off(self, why: str, want: str, got: str) -> None:
        at = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
        self.off_reason = f"{why} at character {at}: {want[at : at + 60]!r} vs {got[at : at + 60]!r}"
        self.incremental = False
        log.warning(
            "tito: rendering whole conversations from now on (this chat template renders a message by "
            "more than its neighbours): %s",
            self.off_reason,
        )

    def _probe(self) -> None:
        """Small renderings against whole ones on a few conversations (system or not, tools or not,
        tool calls and several results, reasoning, a user turn after them); turned off on a difference."""
        self._probed = True
        eos = getattr(self.tok, "eos_token_id", None)
        endings = ([eos] if isinstance(eos, int) else []) + [-1]  # the model's eos, or a stop string
        try:
            for conv, tools in _probe_conversations():
                answers = [k for k, m in enumerate(conv) if k >= 2 and m.get("role") == "assistant"]
                for k, nxt in zip(answers, [*answers[1:], len(conv)], strict=True):
                    request, answer = conv[:k], conv[k]
                    for end in endings:
                        text, tail, _ = self._grown(
                            request, answer, tools, [end], self.render(request, tools, True)
                        )
                        want = self.branch_text(request, answer, tools, [end])
                        if text != want:
                            self._turn_off("the probe's answer rendered differently", want, text)
                            return
                        if tail is None or nxt < k + 2:  # no next request with something new
                            continue
                        small = self.render(self.context(request) + conv[k:nxt], tools, True)
                        got = want + small[len(tail) :] if small.startswith(tail) else small
                        full = self.render(conv[:nxt], tools, True)
                        if full != got:
                            self._turn_off("the probe's small rendering differed", full, got)
                            return
        except Exception as exc:  # a template that cannot render the probe: whole renderings only
            self.off_reason = f"the probe did not render: {type(exc).__name__}: {exc}"
            self.incremental = False
            log.info("tito: rendering whole conversations (%s)", self.off_reason)

    def _check_images(self, prompt: Ids, digests: tuple[str, ...]) -> None:
        if self.image_token is None or not digests:
            return
        n = prompt.count(self.image_token)
        if n != len(digests):
            raise BadRequest(
                f"the chat template rendered {n} image placeholder(s) for the request's {len(digests)} "
                "image(s) (images where this model's template puts none, e.g. inside tool results)"
            )

    def _sync(self, key: str) -> bool:
        """Rebuild ``key`` from the database when it holds calls this state does not account for
        (True: it did)."""
        assert self.source is not None
        n = self.source.count(key)
        with self._lock:
            sess = self._sessions.get(key)
            known = sess.synced if sess is not None else 0
        if n <= known:
            return False
        self.misses += 1
        self.restore(key, *self.source.load(key))
        return True

    def restore(self, key: str, synced: int, recorded: list[Recorded]) -> None:
        """Replace ``key``'s branches with the recorded ones (each branch's last call)."""
        sess = _Session(synced=synced)
        for r in sorted(recorded, key=lambda r: r.branch)[-self.max_branches :]:
            text = self.branch_text(r.messages, r.answer, r.tools, r.completion)
            prompt = r.prompt if self.image_token is None else collapse_images(r.prompt, self.image_token)
            digests = tuple(d for _, d in self.images(r.messages))
            ids = [*prompt, *r.completion]
            b = Branch(r.branch, Ids(ids), text, _open_json(ids), images=digests)
            if self.incremental and r.messages:
                b.seen, b.tools = r.messages, r.tools
                b.tail = self.branch_text(self.context(r.messages), r.answer, r.tools, r.completion)
            sess.branches.append(b)
        sess.next_index = max((b.index for b in sess.branches), default=-1) + 1
        with self._lock:
            old = self._sessions.pop(key, None)
            if old is not None:
                self.bytes -= old.size
            self._sessions[key] = sess
            self._resize(key, sess)

    def acknowledge(self, key: str | None) -> None:
        """One more call of ``key`` (made here) is in the database."""
        if key is None:
            return
        with self._lock:
            sess = self._sessions.get(key)
            if sess is not None:
                sess.synced += 1

    def branch_text(
        self,
        messages: list[dict[str, Any]],
        answer: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        completion: list[int],
    ) -> str:
        """The rendering a branch's exact ids stand for: the conversation up to the answer."""
        return self.covered(self.render(messages + [answer], tools, False), completion)

    def _grown(
        self,
        messages: list[dict[str, Any]],
        answer: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        completion: list[int],
        prompt_text: str | None,
    ) -> tuple[str, str | None, bool]:
        """``(branch text, tail, whether the text came from small renderings)`` after this answer:
        the prompt's rendering + the answer's rendering past the generation prompt (both from
        small renderings, the context's), when the template renders an answer as its generation
        prompt continued; else the whole conversation rendered. The tail is None when small
        renderings are off."""
        if not self.incremental or prompt_text is None or not messages:
            return self.branch_text(messages, answer, tools, completion), None, False
        ctx = self.context(messages)
        opened = self.render(ctx, tools, True)
        tail = self.branch_text(ctx, answer, tools, completion)  # ``Branch.tail``
        if not tail.startswith(opened):
            return self.branch_text(messages, answer, tools, completion), tail, False
        return prompt_text + tail[len(opened) :], tail, True

    def commit(
        self,
        key: str | None,
        branch: Branch | None,
        version: int,
        prompt: Ids,
        completion: list[int],
        messages: list[dict[str, Any]],
        answer: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        prompt_text: str | None = None,
        prompt_json: bytes | None = None,
        images: tuple[tuple[str, str], ...] | None = None,
    ) -> int | None:
        """Record the new exact history; returns the branch index (None without a session).
        ``prompt_text``: the prompt's rendering (``plan``'s), extended by the answer's instead of
        the whole conversation rendered again; ``prompt_json``: its ids' JSON; ``images``: the
        prompt's images (``plan``'s, else read from ``messages`` again)."""
        if key is None:
            return None
        if not isinstance(prompt, Ids):
            prompt = Ids(prompt)
        if prompt_json is None:
            prompt_json = orjson.dumps(list(prompt))
        tjson = _extend_json(memoryview(prompt_json)[:-1], completion, False)
        text, tail, small = self._grown(messages, answer, tools, completion, prompt_text)
        if small:
            self.grown += 1
            if self._due(self.grown):
                want = self.branch_text(messages, answer, tools, completion)
                if want != text:
                    self._turn_off("an answer's small rendering differed from the whole one", want, text)
                    text, tail = want, None
        digests = tuple(d for _, d in (self.images(messages) if images is None else images))
        seen, btools = (messages, tools) if tail is not None else (None, None)
        with self._lock:
            sess = self._sessions.get(key)
            if sess is None:
                sess = self._sessions[key] = _Session()
            tokens = prompt.extend(completion)
            if branch is not None and branch in sess.branches and branch.version == version:
                branch.tokens, branch.text, branch.json, branch.version = tokens, text, tjson, version + 1
                branch.images = digests
                branch.seen, branch.tools, branch.tail = seen, btools, tail
                index = branch.index
            else:
                nb = Branch(
                    sess.next_index, tokens, text, tjson, images=digests, seen=seen, tools=btools, tail=tail
                )  # a fork: a concurrent call or a fresh render
                sess.next_index += 1
                sess.branches.append(nb)
                del sess.branches[: -self.max_branches]
                index = nb.index
            self._resize(key, sess)
            return index

    def _resize(self, key: str, sess: _Session) -> None:
        """Count ``sess`` (the most recently used: just changed) again, then drop the least recently
        used sessions past ``max_bytes`` or ``max_sessions`` (never ``sess`` itself). Under the lock."""
        size = sum(map(_branch_bytes, sess.branches))
        self.bytes += size - sess.size
        sess.size = size
        sessions = self._sessions
        sessions.move_to_end(key)
        while len(sessions) > 1 and (self.bytes > self.max_bytes or len(sessions) > self.max_sessions):
            _, gone = sessions.popitem(last=False)
            self.bytes -= gone.size


def _same_tools(a: list[dict[str, Any]] | None, b: list[dict[str, Any]] | None) -> bool:
    return a is b or (not a and not b) or a == b


def _probe_conversations() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """Conversations ``TitoSessions._probe`` renders both ways: what agent sessions hold."""
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run a shell command.",
                "parameters": {
                    "type": "object",
                    "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"],
                },
            },
        }
    ]

    def call(i: int, cmd: str) -> dict[str, Any]:
        return {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"cmd": cmd})},
        }

    agent: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
        {
            "role": "assistant",
            "content": "<think>\nLook first.\n</think>\n\nListing.",
            "tool_calls": [call(1, "ls")],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\ntest_a.py"},
        {"role": "assistant", "content": None, "tool_calls": [call(2, "cat a.py"), call(3, "cat test_a.py")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "def f(): return 1"},
        {"role": "tool", "tool_call_id": "call_3", "content": "assert f() == 2"},
        {"role": "assistant", "content": "<think>\nf returns 1.\n</think>\n\nThe test expects 2."},
        {"role": "user", "content": "Then change f."},
        {"role": "assistant", "content": "Changing it.", "tool_calls": [call(4, "sed -i s/1/2/ a.py")]},
        {"role": "tool", "tool_call_id": "call_4", "content": ""},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You're welcome."},
    ]
    chat = [m for m in agent if m["role"] != "tool" and not m.get("tool_calls")]
    return [(agent, tools), (agent, None), (agent[1:], tools), (chat, None), (chat[1:], None)]


def _part_url(p: dict[str, Any]) -> str | None:
    u = p.get("image_url")
    url = u.get("url") if isinstance(u, dict) else u
    if not url and p.get("type") == "input_image":
        url = p.get("file_id")
    return url if isinstance(url, str) and url else None


def _has_image(content: list[Any]) -> bool:
    return any(isinstance(p, dict) and p.get("type") in _IMAGE_PARTS and _part_url(p) for p in content)


class _Digests:
    """Images' digests by URL, least recently used out past ``max_bytes`` of URLs: every call of a
    session resends its images (a GUI agent's screenshots, base64), and each call read them three
    times (the plan, the commit, the upstream request), decoding and hashing every one."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._d: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, url: str) -> str:
        with self._lock:
            got = self._d.get(url)
            if got is not None:
                self._d.move_to_end(url)
                return got
        decoded = decode_data_url(url)
        digest = hashlib.sha256(decoded[1] if decoded is not None else url.encode()).hexdigest()
        if len(url) <= self.max_bytes:
            with self._lock:
                if url not in self._d:
                    self._d[url] = digest
                    self._bytes += len(url)
                while self._bytes > self.max_bytes:
                    old, _ = self._d.popitem(last=False)
                    self._bytes -= len(old)
        return digest


_DIGESTS = _Digests()


def chat_images(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(url, digest)`` of each image part of chat messages, in the order a template renders
    them; the digest is the SHA-256 of the decoded bytes (of the URL text for a remote image),
    as ``protocol.images`` names images."""
    out: list[tuple[str, str]] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for p in content:
            if not isinstance(p, dict) or p.get("type") not in _IMAGE_PARTS:
                continue
            url = _part_url(p)
            if url is None:
                continue
            out.append((url, _DIGESTS.get(url)))
    return out


def collapse_images(ids: list[int], image_token: int) -> list[int]:
    """A server-expanded prompt back to one placeholder per image (each run of ``image_token``
    becomes one), the form tito renders and sends."""
    out: list[int] = []
    for i in ids:
        if i == image_token and out and out[-1] == image_token:
            continue
        out.append(i)
    return out
