"""Drives `whale serve` with the official `openai` Python client (run by tests/serve_cli.rs).

Usage: python openai_client.py BASE_URL MODEL
Prints one JSON object with what the client saw; any failed expectation raises.
"""
import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=60)
messages = [{"role": "user", "content": "Kalo has 12 apples and buys 5 more. How many apples?"}]

chat = client.chat.completions.create(
    model=model, messages=messages, max_tokens=24, temperature=0, seed=1, logprobs=True
)
assert chat.object == "chat.completion", chat
choice = chat.choices[0]
assert choice.message.role == "assistant"
assert chat.usage.completion_tokens == len(choice.logprobs.content), chat.usage

chunks = list(
    client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, seed=1, stream=True,
        stream_options={"include_usage": True},
    )
)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
assert all(c.object == "chat.completion.chunk" for c in chunks)

text = client.completions.create(model=model, prompt="Kalo has 12", max_tokens=8, temperature=0)
assert text.object == "text_completion"

models = [m.id for m in client.models.list()]

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError as error:
    not_found = error.message

try:
    client.chat.completions.create(model=model, messages=messages, temperature=-1)
    raise AssertionError("a negative temperature was accepted")
except openai.BadRequestError as error:
    bad_request = error.message

print(json.dumps({
    "chat": choice.message.content,
    "chat_finish": choice.finish_reason,
    "streamed": streamed,
    "stream_finish": finish,
    "stream_usage": chunks[-1].usage.completion_tokens if chunks[-1].usage else None,
    "chat_usage": chat.usage.completion_tokens,
    "text": text.choices[0].text,
    "models": models,
    "not_found": not_found,
    "bad_request": bad_request,
}))
