"""The official Anthropic Python SDK against the proxy (tests/messages_sdk.rs).

Usage: anthropic_client.py BASE_URL [reload]. Prints one JSON object of what the SDK saw: a
plain reply, a streamed one read through the SDK's stream helpers, a tool-use round with its
result sent back, extended thinking in a tool loop (the thinking block sent back as it came), a
`?beta=true` call, and an upstream error raised as the SDK's typed exception. With `reload`:
a conversation whose large tool results the proxy compacts (a small budget), asked about a
line only the stored original holds, with `messages.create` and `messages.stream` (the model
reads it back through the proxy's tool, which the SDK must never see), then the next turn
sent with the answer as the SDK got it.
"""

import json
import sys

import anthropic

base = sys.argv[1]
client = anthropic.Anthropic(base_url=base, api_key="sk-ant-e2e", max_retries=0)
model = "claude-sonnet-4-5"
out = {}


def reload_part():
    def numbered(name, needle_at=None):
        return "".join(
            f"{name} line {i}: "
            + ('const SECRET: &str = "NEEDLE-4217";' if i == needle_at else f"let v{i} = f({i});")
            + "\n"
            for i in range(1, 301)
        )

    tools = [
        {
            "name": "Read",
            "description": "Read a file",
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        }
    ]
    history = [{"role": "user", "content": "Read a.rs and b.rs."}]
    for i, name in enumerate(["a.rs", "b.rs"]):
        history.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"toolu_r{i}", "name": "Read", "input": {"path": name}}
                ],
            }
        )
        text = numbered(name, 77 if name == "a.rs" else None)
        history.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_r{i}", "content": text}],
            }
        )
    history.append({"role": "assistant", "content": [{"type": "text", "text": "Both read."}]})
    history.append({"role": "user", "content": "What is on line 77 of a.rs?"})
    thinking = {"type": "enabled", "budget_tokens": 1024}
    session = {"x-context-session": "sdk-reload"}
    ask = dict(model=model, max_tokens=2048, thinking=thinking, tools=tools, extra_headers=session)

    message = client.messages.create(messages=history, **ask)
    out["kinds"] = [b.type for b in message.content]
    out["text"] = message.content[-1].text
    out["usage"] = message.usage.model_dump()
    out["stop_reason"] = message.stop_reason

    starts, kinds = [], []
    with client.messages.stream(messages=history, **ask) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_start":
                starts.append(event.index)
        final = stream.get_final_message()
    out["stream_kinds"] = [b.type for b in final.content]
    out["stream_text"] = final.content[-1].text
    out["stream_usage"] = final.usage.model_dump()
    out["stream_starts"] = starts
    out["stream_events"] = {k: kinds.count(k) for k in ["message_start", "message_delta", "message_stop"]}

    history.append({"role": "assistant", "content": message.content})
    history.append({"role": "user", "content": "Thanks."})
    after = client.messages.create(messages=history, **ask)
    out["after"] = after.content[-1].text
    print(json.dumps(out))
    sys.exit(0)


if len(sys.argv) > 2 and sys.argv[2] == "reload":
    reload_part()

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
