"""The official Anthropic Python SDK against the proxy (tests/messages_sdk.rs).

Usage: anthropic_client.py BASE_URL. Prints one JSON object of what the SDK saw: a plain
reply, a streamed one read through the SDK's stream helpers, a tool-use round with its result
sent back, extended thinking in a tool loop (the thinking block sent back as it came), a
`?beta=true` call, and an upstream error raised as the SDK's typed exception.
"""

import json
import sys

import anthropic

base = sys.argv[1]
client = anthropic.Anthropic(base_url=base, api_key="sk-ant-e2e", max_retries=0)
model = "claude-sonnet-4-5"
out = {}

# messages.create
message = client.messages.create(
    model=model,
    max_tokens=256,
    system="You are a test.",
    messages=[{"role": "user", "content": "Say hello."}],
)
out["text"] = message.content[0].text
out["usage_input"] = message.usage.input_tokens
out["stop_reason"] = message.stop_reason

# messages.stream, with its event helpers
with client.messages.stream(
    model=model,
    max_tokens=256,
    messages=[{"role": "user", "content": "Stream hello."}],
) as stream:
    out["stream_text"] = "".join(stream.text_stream)
    final = stream.get_final_message()
out["stream_final_text"] = final.content[0].text
out["stream_usage_output"] = final.usage.output_tokens

# tool use: the call, then its result sent back
tools = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
history = [{"role": "user", "content": "Read README.md"}]
call = client.messages.create(model=model, max_tokens=256, tools=tools, messages=history)
use = [b for b in call.content if b.type == "tool_use"][0]
out["tool_use"] = [use.name, use.input]
history.append({"role": "assistant", "content": call.content})
history.append(
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "# README"}],
    }
)
after = client.messages.create(model=model, max_tokens=256, tools=tools, messages=history)
out["after_tool"] = after.content[0].text

# extended thinking, streamed, in a tool loop
thinking = {"type": "enabled", "budget_tokens": 1024}
history = [{"role": "user", "content": "Think, then read a.rs"}]
with client.messages.stream(
    model=model, max_tokens=2048, thinking=thinking, tools=tools, messages=history
) as stream:
    thought = stream.get_final_message()
kinds = [b.type for b in thought.content]
out["thinking_kinds"] = kinds
out["thinking_text"] = thought.content[0].thinking
out["thinking_signed"] = bool(thought.content[0].signature)
use = [b for b in thought.content if b.type == "tool_use"][0]
out["thinking_tool_input"] = use.input
history.append({"role": "assistant", "content": thought.content})
history.append(
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "fn a() {}"}],
    }
)
done = client.messages.create(
    model=model, max_tokens=2048, thinking=thinking, tools=tools, messages=history
)
out["thinking_after"] = [b.type for b in done.content]

# the beta client, its betas in `anthropic-beta`
beta = client.beta.messages.create(
    model=model,
    max_tokens=64,
    messages=[{"role": "user", "content": "beta"}],
    betas=["interleaved-thinking-2025-05-14"],
)
out["beta_text"] = beta.content[0].text

# count_tokens
counted = client.messages.count_tokens(
    model=model, messages=[{"role": "user", "content": "count me"}]
)
out["count"] = counted.input_tokens

# an upstream error, raised as the SDK's own exception
try:
    client.messages.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": "limit"}]
    )
    out["rate_limit"] = None
except anthropic.RateLimitError as e:
    out["rate_limit"] = e.body["error"]["type"]

print(json.dumps(out))
