// The official OpenAI Node SDK's Responses API reading back through the proxy, as
// sdk_responses_reload.py does with the Python SDK (a small budget, a needle read back): `responses.create` and
// `responses.stream` (whose accumulator places each event by `output_index` and throws on a
// gap) must never show the proxy's tool or its items, and report the usage of both upstream
// calls. Prints one JSON object.

const OpenAI = require("openai").default;

const HIDDEN = ["context_read", "context_search"];

function lines(prefix, n) {
  let out = "";
  for (let i = 1; i <= n; i++) {
    out += `${prefix} line ${i}: let value_${i} = compute(${i}) * 2;\n`;
    if (i === 150) out += "NEEDLE port=7411\n";
  }
  return out;
}

function assertInvisible(text) {
  for (const name of HIDDEN) {
    if (text.includes(name)) throw new Error(`the client saw ${name}: ${text.slice(0, 2000)}`);
  }
}

async function main() {
  const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-e2e", maxRetries: 0 });
  const tools = [{
    type: "function",
    name: "shell",
    description: "Run a command",
    parameters: {
      type: "object",
      properties: { cmd: { type: "array", items: { type: "string" } } },
      required: ["cmd"],
      additionalProperties: false,
    },
    strict: true,
  }];
  const input = [
    { role: "user", content: "Read a.rs." },
    { type: "function_call", call_id: "call_a", name: "shell", arguments: JSON.stringify({ cmd: ["cat", "a.rs"] }) },
    { type: "function_call_output", call_id: "call_a", output: lines("a.rs", 600) },
    { role: "assistant", content: "It defines compute-based values." },
    { role: "user", content: "Recall the needles: port" },
  ];
  const request = { model: "gpt-5", input, tools, store: false, prompt_cache_key: "node-reload" };
  const out = {};

  const { data: response, response: raw } = await client.responses.create(request).withResponse();
  assertInvisible(JSON.stringify(response));
  out.create_reload = raw.headers.get("x-context-reload");
  out.create_tokens = ["before", "after"].map((k) => Number(raw.headers.get(`x-context-tokens-${k}`)));
  out.create_text = response.output_text;
  out.create_types = response.output.map((i) => i.type);
  out.create_tools = response.tools.map((t) => t.name);
  out.create_usage = response.usage;

  const stream = client.responses.stream(request);
  const events = [];
  for await (const event of stream) events.push(event);
  const final = await stream.finalResponse();
  assertInvisible(JSON.stringify(events));
  assertInvisible(JSON.stringify(final));
  out.stream_events = events.map((e) => e.type);
  out.stream_text = final.output_text;
  out.stream_types = final.output.map((i) => i.type);
  out.stream_usage = final.usage;
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
