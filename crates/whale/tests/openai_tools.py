"""Tool calling through `whale serve` with the official `openai` Python client (run by
tests/serve_tools.rs on a tiny model trained to call `add` and then answer from its result).

Usage: python openai_tools.py BASE_URL MODEL
The round trip: the question with `tools` comes back as a call of `add` (finish reason
`tool_calls`, arguments a JSON string); the same call streamed arrives as tool-call deltas; the
call and its result sent back (an assistant message with `tool_calls`, then a `tool` message)
give the answer as content. Prints one JSON object with what the client saw; any failed
expectation raises.
"""
import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60)
tools = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
messages = [{"role": "user", "content": "Kalo has 12 apples and buys 5 more. How many apples?"}]

first = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=48, temperature=0)
choice = first.choices[0]
assert choice.finish_reason == "tool_calls", first
call = choice.message.tool_calls[0]
assert call.type == "function" and call.id.startswith("call_"), call
arguments = json.loads(call.function.arguments)

streamed_calls = {}
finishes = []
for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=48,
                                            temperature=0, stream=True):
    delta = chunk.choices[0].delta
    for piece in delta.tool_calls or []:
        entry = streamed_calls.setdefault(piece.index, {"name": "", "arguments": ""})
        entry["name"] += piece.function.name or ""
        entry["arguments"] += piece.function.arguments or ""
    if chunk.choices[0].finish_reason:
        finishes.append(chunk.choices[0].finish_reason)

history = messages + [
    choice.message.model_dump(exclude_none=True),
    {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])},
]
second = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=48, temperature=0)

try:
    client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="sometimes")
    raise AssertionError("a tool_choice of no known kind was accepted")
except openai.BadRequestError as error:
    bad_choice = error.message

print(json.dumps({
    "call": {"name": call.function.name, "arguments": arguments},
    "content_with_call": choice.message.content,
    "streamed": [streamed_calls[i] for i in sorted(streamed_calls)],
    "stream_finishes": finishes,
    "answer": second.choices[0].message.content,
    "answer_finish": second.choices[0].finish_reason,
    "bad_choice": bad_choice,
}))
