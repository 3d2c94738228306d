"""Agentic environments and their tools. No torch.

The env SDK lives at this level: `toolcalls` (the tool-call format's one home: the tags, writing,
detecting and parsing a call, the tool-response wrapper), `base` (Task, ToolResult, the Env
protocol, validation and dispatch; re-exports ToolCall and the parser), `config` (the sandbox
settings), `registry` (bench name -> env class), `plugins` (`--env` and `--reward` plug-ins),
`datasets` (verl-schema rows), `demo` (demonstration exchanges), `profile` (tool-latency
profiles), and the two small benches `search` and `toy`.
The sandbox and the two benches that run code in it have packages of their own: `sandbox`,
`swe`, `math`.

May import: scheduler
Must not import: torch, engine, sim, steps, bench; the SDK never imports the swe or math bench
(the registry names them as strings).
"""
