"""The official OpenAI Python SDK's Responses API through the proxy: `responses.create` with
a long Codex-like input (the proxy manages it), a function call answered and sent back,
and `responses.stream`, whose helper checks the event order (`response.created` first,
items by `output_index`) and assembles the final response. Prints one JSON object."""

import json
import sys

from openai import OpenAI

base_url = sys.argv[1]
client = OpenAI(base_url=base_url, api_key="sk-e2e", max_retries=0)

tools = [{
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"], "additionalProperties": False},
    "strict": True,
}]

history = [{"role": "developer", "content": "You work in /repo."},
           {"role": "user", "content": "Summarize the repository."}]
for t in range(24):
    history.append({"type": "reasoning", "summary": [], "encrypted_content": f"gAAAAB{t:04}" + "Qw+/" * 80})
    history.append({"type": "function_call", "call_id": f"call_{t}", "name": "read_file",
                    "arguments": json.dumps({"path": f"src/f{t}.rs"})})
    body = "".join(f"{t}:{line} let value_{line} = compute({line});\n" for line in range(300))
    history.append({"type": "function_call_output", "call_id": f"call_{t}", "output": body})
history.append({"role": "user", "content": "And the tests?"})

out = {}
raw = client.responses.with_raw_response.create(
    model="small-model", instructions="Be brief.", input=history, tools=tools,
    reasoning={"effort": "low"}, include=["reasoning.encrypted_content"], store=False,
    prompt_cache_key="sdk-thread")
out["actions"] = raw.headers.get("x-context-actions")
response = raw.parse()
out["text"] = response.output_text
out["input_tokens"] = response.usage.input_tokens
out["reasoning_sealed"] = [i.encrypted_content is not None for i in response.output if i.type == "reasoning"]

# A function call, answered and sent back with its output.
called = client.responses.create(model="small-model", input="Read the README.", tools=tools)
call = next(i for i in called.output if i.type == "function_call")
out["call"] = [call.name, json.loads(call.arguments)]
followed = client.responses.create(
    model="small-model", tools=tools,
    input=[{"role": "user", "content": "Read the README."},
           {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
           {"type": "function_call_output", "call_id": call.call_id, "output": "# context-proxy"}])
out["followed"] = followed.output_text

# The stream helper validates the event order as it assembles the response.
with client.responses.stream(model="small-model", input=history, tools=tools,
                             prompt_cache_key="sdk-thread") as stream:
    deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    final = stream.get_final_response()
out["stream_text"] = "".join(deltas)
out["stream_final"] = final.output_text
out["stream_usage"] = final.usage.total_tokens
print(json.dumps(out))
