"""Drives `whale serve` with the official `openai` Python client (run by tests/serve_cli.rs).

Usage: python openai_client.py BASE_URL MODEL [API_KEY]
With API_KEY (a server started with it, runtime loading off) it also checks that a wrong key,
one differing only in its last byte, is refused (401) and that loading an adapter is forbidden
(403). Prints one JSON object with what the client saw; any failed expectation raises.
"""
import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
api_key = sys.argv[3] if len(sys.argv) > 3 else "x"
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
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

summary = {}
if len(sys.argv) > 3:
    last_byte_differs = api_key[:-1] + ("0" if api_key[-1] != "0" else "1")
    unauthorized = []
    for wrong in ["not-the-key", last_byte_differs]:
        wrong_client = openai.OpenAI(base_url=base_url, api_key=wrong, max_retries=0, timeout=60)
        for call in [lambda: wrong_client.models.list(),
                     lambda: wrong_client.chat.completions.create(model=model, messages=messages, max_tokens=4)]:
            try:
                call()
                raise AssertionError(f"the key {wrong!r} was accepted")
            except openai.AuthenticationError as error:
                assert error.status_code == 401 and error.code == "invalid_api_key", error
                unauthorized.append(error.message)
    summary["unauthorized"] = unauthorized
    try:
        client.post("/load_lora_adapter", cast_to=object,
                    body={"lora_name": "a", "lora_path": "/etc"})
        raise AssertionError("an adapter load was accepted without --allow-runtime-loading")
    except openai.PermissionDeniedError as error:
        summary["forbidden"] = error.message

print(json.dumps(summary | {
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
