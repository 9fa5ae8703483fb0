//! Recorded-shape upstream answers shared by the tests of this module.

/// An OpenAI stream (`stream_options.include_usage`) with two parallel tool calls whose
/// arguments arrive in fragments, a usage chunk and `[DONE]`.
pub const TOOL_CALL_STREAM: &str = concat!(
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_aX1","type":"function","function":{"name":"context_read","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ref\":"}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_bY2","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"ctx_abc\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"city\": \"Par"}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"is\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-BQx3qG2bZ","object":"chat.completion.chunk","created":1745600000,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f5bdcc3276","choices":[],"usage":{"prompt_tokens":812,"completion_tokens":41,"total_tokens":853,"prompt_tokens_details":{"cached_tokens":768,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);

/// What the non-streaming API answers for the same completion as [`TOOL_CALL_STREAM`].
pub const TOOL_CALL_COMPLETION: &str = r#"{
  "id": "chatcmpl-BQx3qG2bZ",
  "object": "chat.completion",
  "created": 1745600000,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": null,
        "tool_calls": [
          {"id": "call_aX1", "type": "function",
           "function": {"name": "context_read", "arguments": "{\"ref\": \"ctx_abc\"}"}},
          {"id": "call_bY2", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
        ],
        "refusal": null
      },
      "logprobs": null,
      "finish_reason": "tool_calls"
    }
  ],
  "usage": {
    "prompt_tokens": 812,
    "completion_tokens": 41,
    "total_tokens": 853,
    "prompt_tokens_details": {"cached_tokens": 768, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
  },
  "service_tier": "default",
  "system_fingerprint": "fp_f5bdcc3276"
}"#;

/// A plain text answer, streamed, with `content: ""` first and usage on the last chunk (as
/// some compatible servers send it).
pub const TEXT_STREAM: &str = concat!(
    r#"data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1745600001,"model":"gpt-4o-mini","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}"#,
    "\n\n: keep-alive\n\n",
    r#"data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1745600001,"model":"gpt-4o-mini","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1745600001,"model":"gpt-4o-mini","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{"content":", world."},"logprobs":null,"finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1745600001,"model":"gpt-4o-mini","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);
