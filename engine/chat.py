"""Chat template with tools, Hermes/Qwen convention, rendered to token ids (no torch).

Algorithm:
  1. A system turn lists the tool schemas (OpenAI function JSON, one per line) inside
     `<tools></tools>` and says how to call them: `<tool_call>{"name", "arguments"}</tool_call>`.
  2. Each message becomes `<|im_start|>{role}\n{content}<|im_end|>\n`; a `tool` message becomes a
     user turn holding `<tool_response>\n...\n</tool_response>` (Qwen2.5/Qwen3 do the same).
  3. The prompt ends with the generation prompt `<|im_start|>assistant\n`.
  4. After a tool call the engine appends `render_tool_response`: close the assistant turn,
     the tool turn, open the next assistant turn. All of these tokens carry loss mask 0.

A local checkpoint whose own chat template knows `tools` (Qwen2.5, Qwen3) is rendered with it,
so a real model sees exactly the format it was trained on; every other tokenizer (tiny,
SmolLM2) uses the text template below.

Invariants (tests/test_models.py): the special strings are single tokens of the tiny tokenizer;
`render_prompt` ends with the assistant generation prompt; prompt + response token ids decode
back to the rendered text.
"""

from __future__ import annotations

import json

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
SPECIAL_STRINGS = (IM_START, IM_END, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


# `render_text` as a Jinja chat template: engine/export.py writes it into exported tokenizers, so
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
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{%- set ns.content = m['content'] or '' -%}"
    "{%- for call in m.get('tool_calls', []) -%}{%- set fn = call.get('function', call) -%}"
    "{%- set ns.content = ns.content + ('\\n' if ns.content else '') + '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson)"
    " + ', \"arguments\": ' + (fn.get('arguments', {}) | tojson) + '}\\n</tool_call>' -%}"
    "{%- endfor -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + ns.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def tools_block(tools) -> str:
    return _TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + _TOOLS_FOOTER


def format_tool_call(name: str, arguments: dict) -> str:
    return f"{TOOL_CALL_OPEN}\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + f"\n{TOOL_CALL_CLOSE}"


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
            out.append(f"{IM_START}user\n{TOOL_RESPONSE_OPEN}\n{m['content']}\n{TOOL_RESPONSE_CLOSE}{IM_END}\n")
            continue
        content = m.get("content") or ""
        for call in m.get("tool_calls", ()):
            fn = call.get("function", call)
            content += ("\n" if content else "") + format_tool_call(fn["name"], fn.get("arguments", {}))
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
    body = "\n".join(f"{TOOL_RESPONSE_OPEN}\n{valid_text(t)}\n{TOOL_RESPONSE_CLOSE}" for t in texts)
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


def render_tool_response(tokenizer, text, *, close_turn: bool = True) -> list[int]:
    """Token ids appended after a tool call (`text` may be a list: one block per call)."""
    return tokenizer.encode(tool_response_text(text, close_turn=close_turn), add_special_tokens=False)


def has_tool_call(text: str) -> bool:
    return TOOL_CALL_OPEN in text


def parse_tool_calls(text: str):
    """Hermes tool calls in `text` as `ToolCall | ToolCallError`; never raises (envs owns the parser)."""
    from envs.base import ToolCallError, parse_tool_calls as env_parse

    calls = env_parse(text)
    # the engine only asks when the text holds a <tool_call> tag, so there is always a call to answer
    return calls or [ToolCallError(message="no parseable tool call; write <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>", raw=text)]
