"""Chat template with tools, Hermes/Qwen convention, rendered to token ids (no torch).

Algorithm:
  1. A system turn lists the tool schemas (OpenAI function JSON, one per line) inside
     `<tools></tools>` and says how to call them: `<tool_call>{"name", "arguments"}</tool_call>`.
  2. Each message becomes `<|im_start|>{role}\n{content}<|im_end|>\n`; a `tool` message becomes a
     user turn holding `<tool_response>\n...\n</tool_response>` (Qwen2.5/Qwen3 do the same).
  3. The prompt ends with the generation prompt `<|im_start|>assistant\n`.
  4. After a tool call the engine appends `ToolResponseEncoder.encode`: close the assistant turn,
     the tool turn, open the next assistant turn. All of these tokens carry loss mask 0.
  5. Tool output is tokenized apart from the template, as plain text (a `<|im_end|>` written in a
     file is the characters, never the special id, so a file cannot forge a chat turn), and cut to
     a token budget: the trajectory's room left and a per-call cap. What is cut is replaced by a
     note the model sees, `[output cut: N tokens]`. Only a prefix of at most
     `_MAX_CHARS_PER_TOKEN` characters per budget token is ever tokenized, so the work of one call
     is bounded by its budget, not by the size of what the tool printed.

A local checkpoint whose own chat template knows `tools` (Qwen2.5, Qwen3) is rendered with it,
so a real model sees exactly the format it was trained on; every other tokenizer (tiny,
SmolLM2) uses the text template below.

The tool-call format itself (the tags, writing, detecting and parsing a call, the wrapper of a tool's
output) lives in envs/toolcalls.py; this module imports it (and re-exports the tag names, `has_tool_call`
and the engine's `parse_tool_calls`) and only renders it: as text, as a Jinja chat template, as tokens.

Invariants (tests/engine/test_models.py, tests/engine/rollout/test_rollout.py): the special strings are single tokens of
the tiny tokenizer; `render_prompt` ends with the assistant generation prompt; prompt + response
token ids decode back to the rendered text; an encoded tool response never exceeds its `room`, a
body never exceeds the per-call cap, a cut body ends with the note, and special-token text in a
body never yields a special-token id; the text and Jinja templates write calls and tool responses exactly as
envs/toolcalls.py does (tests/envs/test_toolcalls.py).
"""

from __future__ import annotations

import json
import threading
import weakref

from envs.toolcalls import (
    CALL_CLOSE as TOOL_CALL_CLOSE,
    CALL_OPEN as TOOL_CALL_OPEN,
    RESPONSE_CLOSE as TOOL_RESPONSE_CLOSE,
    RESPONSE_HEAD,
    RESPONSE_OPEN as TOOL_RESPONSE_OPEN,
    RESPONSE_TAIL,
    ToolCallError,
    format_tool_call,
    has_tool_call,  # re-exported: the rollout engine and bench/rollout.py take it from here
    parse_tool_calls as _parse_tool_calls,
    wrap_tool_response,
)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_STRINGS = (IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    f"within {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n{TOOL_CALL_OPEN}\n"
    f'{{"name": <function-name>, "arguments": <args-json-object>}}\n{TOOL_CALL_CLOSE}'
)


# `render_text` as a Jinja chat template: engine/runtime/export.py writes it into exported tokenizers, so
# that `apply_chat_template` elsewhere renders exactly the prompts the policy was trained on.
# (JSON string literals are valid Jinja string literals.)
HERMES_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='', msgs=messages) -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = messages[0]['content'] -%}{%- set ns.msgs = messages[1:] -%}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if ns.system -%}{%- set ns.system = ns.system + '\\n\\n' -%}{%- endif -%}"
    "{%- set ns.system = ns.system + " + json.dumps(_TOOLS_HEADER) + " -%}"
    "{%- for t in tools -%}{%- set ns.system = ns.system + ('\\n' if not loop.first else '') + (t | tojson) -%}{%- endfor -%}"
    "{%- set ns.system = ns.system + " + json.dumps(_TOOLS_FOOTER) + " -%}"
    "{%- endif -%}"
    "{%- if ns.system -%}{{ '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for m in ns.msgs -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{{ '<|im_start|>user\\n" + TOOL_RESPONSE_OPEN + "\\n' + m['content'] + '\\n" + TOOL_RESPONSE_CLOSE + "<|im_end|>\\n' }}"
    "{%- else -%}"
    "{%- set ns.content = m['content'] or '' -%}"
    "{%- for call in m.get('tool_calls', []) -%}{%- set fn = call.get('function', call) -%}"
    "{%- set ns.content = ns.content + ('\\n' if ns.content else '') + '" + TOOL_CALL_OPEN + "\\n{\"name\": ' + (fn['name'] | tojson)"
    " + ', \"arguments\": ' + (fn.get('arguments', {}) | tojson) + '}\\n" + TOOL_CALL_CLOSE + "' -%}"
    "{%- endfor -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + ns.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def tools_block(tools) -> str:
    return _TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + _TOOLS_FOOTER


def render_text(messages, tools) -> str:
    """The Hermes/Qwen chat text for `messages` and `tools`, ending with the generation prompt."""
    messages = list(messages)
    out = []
    system = ""
    if messages and messages[0]["role"] == "system":
        system = messages.pop(0)["content"]
    if tools:
        system = (system + "\n\n" if system else "") + tools_block(tools)
    if system:
        out.append(f"{IM_START}system\n{system}{IM_END}\n")
    for m in messages:
        if m["role"] == "tool":
            out.append(f"{IM_START}user\n{wrap_tool_response(m['content'])}{IM_END}\n")
            continue
        content = m.get("content") or ""
        for call in m.get("tool_calls", ()):
            fn = call.get("function", call)
            content += ("\n" if content else "") + format_tool_call(fn["name"], fn.get("arguments", {}), template=True)
        out.append(f"{IM_START}{m['role']}\n{content}{IM_END}\n")
    out.append(f"{IM_START}assistant\n")
    return "".join(out)


def valid_text(text) -> str:
    """`text` as valid Unicode: what a tool returns may hold lone surrogates (a file name with an
    undecodable byte comes back from os.fsdecode as one), and a tokenizer raises on them."""
    if not isinstance(text, str):
        text = str(text)
    try:  # the bytes a surrogate escape stands for, then U+FFFD for what is not UTF-8
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # another lone surrogate (e.g. from JSON's "\ud800")
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


def tool_response_text(texts, *, close_turn: bool = True) -> str:
    """Text appended after a tool call: end the assistant turn, the tool turn, the next prompt.

    The one boundary where tool output becomes model input: it is made valid Unicode here."""
    if isinstance(texts, str):
        texts = [texts]
    body = "\n".join(wrap_tool_response(valid_text(t)) for t in texts)
    head = IM_END + "\n" if close_turn else "\n"
    return f"{head}{IM_START}user\n{body}{IM_END}\n{IM_START}assistant\n"


def template_knows_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template and getattr(tokenizer, "libra_template", "") != "hermes"


def render_prompt(tokenizer, messages, tools) -> list[int]:
    """Token ids of the chat with tools, ending with `<|im_start|>assistant\\n`."""
    if template_knows_tools(tokenizer):
        ids = tokenizer.apply_chat_template(
            list(messages), tools=list(tools) or None, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer.encode(render_text(messages, tools), add_special_tokens=False)


_MAX_CHARS_PER_TOKEN = 16  # a budget of n tokens tokenizes at most 16 n characters of a tool's output


def _plain_encoder(tokenizer):
    """text -> ids with special-token text encoded as ordinary characters.

    A fast tokenizer gets its own copy of the backend (the `split_special_tokens` switch of
    transformers is a flag on the shared backend, racy across the tool threads), and encodes
    through `encode_batch`, which releases the GIL (`encode` holds it: a big output would stall
    the decode loop's thread)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_special_tokens"):
        plain = type(backend).from_str(backend.to_str())
        plain.encode_special_tokens = True
        plain.no_padding()
        plain.no_truncation()
        return lambda text: plain.encode_batch([text], add_special_tokens=False)[0].ids
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


class ToolResponseEncoder:
    """Token ids appended after a tool call: the template's special tokens, each body as plain text, cut to budget.

    Thread-safe: the rollout engine calls `encode` on its tool threads, off the decode loop."""

    def __init__(self, tokenizer):
        def enc(s):
            return list(tokenizer.encode(s, add_special_tokens=False))

        self._plain = _plain_encoder(tokenizer)
        self._head = {True: enc(f"{IM_END}\n{IM_START}user\n"), False: enc(f"\n{IM_START}user\n")}
        self._open, self._close, self._sep = enc(RESPONSE_HEAD), enc(RESPONSE_TAIL), enc("\n")
        self._tail = enc(f"{IM_END}\n{IM_START}assistant\n")

    def encode(self, texts, *, close_turn: bool = True, room: int | None = None, max_tokens_per_call: int | None = None) -> list[int]:
        """Ids of the response to `texts` (one block per call): at most `room` ids in all (None: no limit),
        each body at most `max_tokens_per_call`. When the template alone does not fit, its first `room` ids."""
        if isinstance(texts, str):
            texts = [texts]
        overhead = len(self._head[close_turn]) + len(self._tail) + len(texts) * (len(self._open) + len(self._close)) \
            + max(0, len(texts) - 1) * len(self._sep)
        left = None if room is None else max(0, room - overhead)
        ids = list(self._head[close_turn])
        for i, text in enumerate(texts):
            budget = max_tokens_per_call if left is None else left if max_tokens_per_call is None else min(left, max_tokens_per_call)
            body = self._body(valid_text(text), budget)
            if left is not None:
                left -= len(body)
            ids += (self._sep if i else []) + self._open + body + self._close
        ids += self._tail
        return ids if room is None else ids[:room]

    def _body(self, text: str, budget: int | None) -> list[int]:
        if budget is None:
            return self._plain(text)
        prefix = text[: budget * _MAX_CHARS_PER_TOKEN]
        ids = self._plain(prefix)
        if len(prefix) == len(text) and len(ids) <= budget:
            return ids
        more = len(text) - len(prefix)
        keep = min(budget, len(ids))
        while True:  # the note's tokens come out of the budget; `keep` only shrinks, so this ends
            note = self._plain(f"\n[output cut: {len(ids) - keep} tokens" + (f" and {more} more characters" if more else "") + "]")
            if len(note) > budget:
                return []  # no room even for the note: the caller's room check ends the trajectory
            if keep + len(note) <= budget:
                return ids[:keep] + note
            keep = min(keep - 1, budget - len(note))


_ENCODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def tool_response_encoder(tokenizer) -> ToolResponseEncoder:
    """The tokenizer's `ToolResponseEncoder`, built once (it copies the backend tokenizer)."""
    with _ENCODERS_LOCK:
        enc = _ENCODERS.get(tokenizer)
        if enc is None:
            enc = _ENCODERS[tokenizer] = ToolResponseEncoder(tokenizer)
        return enc


def render_tool_response(tokenizer, text, *, close_turn: bool = True) -> list[int]:
    """Token ids appended after a tool call (`text` may be a list: one block per call), uncut."""
    return tool_response_encoder(tokenizer).encode(text, close_turn=close_turn)


def parse_tool_calls(text: str):
    """Hermes tool calls in `text` as `ToolCall | ToolCallError`; never raises (envs/toolcalls.py owns the parser)."""
    calls = _parse_tool_calls(text)
    # the engine only asks when the text holds a <tool_call> tag, so there is always a call to answer
    return calls or [ToolCallError(message=f'no parseable tool call; write {TOOL_CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{TOOL_CALL_CLOSE}',
                                   raw=text)]
