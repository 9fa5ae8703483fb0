//! What the proxy knows of models it has never asked: each known model's context window and
//! largest answer, by name or prefix, with the page each figure comes from. Operators extend or
//! override it with `[context.model_windows]`; a limit an upstream states in a "context too
//! long" error overrides both (see `limits`).
//!
//! Each figure names the provider page it comes from. Cross-checked in November 2026 against
//! pages quoting them (Vercel AI Gateway model pages, the DeepSeek pricing page, gateway and
//! framework model tables): gpt-5 (400k / 128k), gpt-4.1 (1,047,576 / 32,768), gpt-4o
//! (128k / 16,384), Claude 3.7/4 (200k; 64k or 32k out), Gemini 2.5 (1,048,576 / 65,536),
//! DeepSeek (64K before V3.1, 128K now). The Qwen, Llama and Mistral rows are from the pages
//! named and were not cross-checked; a self-hosted server's real window is better set per
//! upstream or learned from its first "context too long" error.

/// The size limits of one model, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// Prompt and answer together.
    pub window: usize,
    /// The longest answer the model may write.
    pub max_output: usize,
    /// A cap on the prompt alone, when the provider states one below the window minus the
    /// answer (gpt-5: 400k window, 128k output, 272k input).
    pub max_input: Option<usize>,
}

impl ModelLimits {
    pub const fn new(window: usize, max_output: usize) -> ModelLimits {
        ModelLimits {
            window,
            max_output,
            max_input: None,
        }
    }

    /// Whose prompt may not exceed `window - max_output` whatever answer is asked for.
    const fn input_capped(window: usize, max_output: usize) -> ModelLimits {
        ModelLimits {
            window,
            max_output,
            max_input: Some(window - max_output),
        }
    }

    /// The largest prompt when `output` tokens are kept for the answer.
    pub fn input_limit(&self, output: usize) -> usize {
        let room = self.window.saturating_sub(output);
        self.max_input.map_or(room, |cap| cap.min(room))
    }
}

/// Limits assumed for a model in no table (and with no upstream default window).
pub const DEFAULT_LIMITS: ModelLimits = ModelLimits::new(128_000, 16_384);

/// Known models: name, or prefix ending in `*`; the longest match wins. A provider prefix
/// (`openai/gpt-4o`, `anthropic/claude-…`) is ignored when matching.
pub const BUILTIN: &[(&str, ModelLimits)] = &[
    // OpenAI — platform.openai.com/docs/models/<model> ("context window", "max output tokens").
    ("gpt-4o*", ModelLimits::new(128_000, 16_384)),
    ("gpt-4o-mini*", ModelLimits::new(128_000, 16_384)),
    // gpt-4.1, -mini, -nano: 1,047,576 / 32,768 (platform.openai.com/docs/models/gpt-4.1).
    ("gpt-4.1*", ModelLimits::new(1_047_576, 32_768)),
    // gpt-5, -mini, -nano, 5.1, 5.2: 400,000 window, 128,000 output, so at most 272,000 in
    // (platform.openai.com/docs/models/gpt-5; vercel.com/ai-gateway/models/gpt-5).
    ("gpt-5*", ModelLimits::input_capped(400_000, 128_000)),
    // gpt-5-chat-latest: 128,000 / 16,384 (platform.openai.com/docs/models/gpt-5-chat-latest).
    ("gpt-5-chat*", ModelLimits::new(128_000, 16_384)),
    // o1, o3, o3-mini, o4-mini: 200,000 / 100,000 (platform.openai.com/docs/models/o3).
    ("o1*", ModelLimits::new(200_000, 100_000)),
    // o1-mini: 128,000 / 65,536 (platform.openai.com/docs/models/o1-mini).
    ("o1-mini*", ModelLimits::new(128_000, 65_536)),
    ("o3*", ModelLimits::new(200_000, 100_000)),
    ("o4-mini*", ModelLimits::new(200_000, 100_000)),
    // gpt-4-turbo: 128,000 / 4,096 (platform.openai.com/docs/models/gpt-4-turbo).
    ("gpt-4-turbo*", ModelLimits::new(128_000, 4_096)),
    ("gpt-4-1106*", ModelLimits::new(128_000, 4_096)),
    ("gpt-4-0125*", ModelLimits::new(128_000, 4_096)),
    // gpt-4: 8,192 / 8,192; gpt-4-32k: 32,768 (platform.openai.com/docs/models/gpt-4).
    ("gpt-4", ModelLimits::new(8_192, 8_192)),
    ("gpt-4-0613", ModelLimits::new(8_192, 8_192)),
    ("gpt-4-32k*", ModelLimits::new(32_768, 8_192)),
    // gpt-3.5-turbo: 16,385 / 4,096 (platform.openai.com/docs/models/gpt-3.5-turbo).
    ("gpt-3.5-turbo*", ModelLimits::new(16_385, 4_096)),
    // Anthropic through compatible endpoints — docs.anthropic.com/en/docs/about-claude/models:
    // every Claude 3.x and 4.x model has a 200K window (1M only with a beta header). Output:
    // 3 and 3.5 Haiku 4,096/8,192, 3.7 and 4 Sonnet 64,000, Opus 4/4.1 32,000.
    ("claude-*", ModelLimits::new(200_000, 8_192)),
    ("claude-3-haiku*", ModelLimits::new(200_000, 4_096)),
    ("claude-3-7-sonnet*", ModelLimits::new(200_000, 64_000)),
    ("claude-sonnet-4*", ModelLimits::new(200_000, 64_000)),
    ("claude-opus-4*", ModelLimits::new(200_000, 32_000)),
    ("claude-haiku-4*", ModelLimits::new(200_000, 64_000)),
    // Google — ai.google.dev/gemini-api/docs/models: 1.5 Flash, 2.0 Flash 1,048,576 in /
    // 8,192 out; 1.5 Pro 2,097,152 / 8,192; 2.5 Pro and Flash 1,048,576 / 65,536.
    ("gemini-1.5*", ModelLimits::new(1_048_576, 8_192)),
    ("gemini-1.5-pro*", ModelLimits::new(2_097_152, 8_192)),
    ("gemini-2*", ModelLimits::new(1_048_576, 8_192)),
    ("gemini-2.5*", ModelLimits::new(1_048_576, 65_536)),
    // DeepSeek — api-docs.deepseek.com/quick_start/pricing (V3.2): deepseek-chat 128K context,
    // 8K output; deepseek-reasoner 128K context, 64K output. (Before V3.1 both were 64K.)
    ("deepseek-chat*", ModelLimits::new(128_000, 8_192)),
    ("deepseek-reasoner*", ModelLimits::new(128_000, 65_536)),
    ("deepseek-*", ModelLimits::new(128_000, 8_192)),
    // Qwen — qwen.readthedocs.io and the model cards on huggingface.co/Qwen: Qwen2.5 and Qwen3
    // 32,768 native (131,072 only with YaRN enabled by the server), 8,192 generated.
    ("qwen2.5*", ModelLimits::new(32_768, 8_192)),
    ("qwen3*", ModelLimits::new(32_768, 8_192)),
    // Qwen on Alibaba Cloud Model Studio (help.aliyun.com/zh/model-studio/models): qwen-max
    // 32,768 / 8,192; qwen-plus and qwen-turbo 131,072 / 8,192 (shown as 128K).
    ("qwen-max*", ModelLimits::new(32_768, 8_192)),
    ("qwen-plus*", ModelLimits::new(131_072, 8_192)),
    ("qwen-turbo*", ModelLimits::new(131_072, 8_192)),
    // Meta — llama.com/docs/model-cards-and-prompt-formats: Llama 3 8,192; Llama 3.1, 3.2
    // (1B/3B/11B/90B) and 3.3 128K. Output is bounded by the window only.
    ("llama3*", ModelLimits::new(8_192, 4_096)),
    ("llama-3*", ModelLimits::new(8_192, 4_096)),
    ("llama3.1*", ModelLimits::new(131_072, 8_192)),
    ("llama3.2*", ModelLimits::new(131_072, 8_192)),
    ("llama3.3*", ModelLimits::new(131_072, 8_192)),
    ("llama-3.1*", ModelLimits::new(131_072, 8_192)),
    ("llama-3.2*", ModelLimits::new(131_072, 8_192)),
    ("llama-3.3*", ModelLimits::new(131_072, 8_192)),
    ("meta-llama-3.1*", ModelLimits::new(131_072, 8_192)),
    // Mistral — docs.mistral.ai/getting-started/models: Large 2 128K (131,072), Small 3.x
    // 128K, Codestral 256K; Mistral 7B 32K.
    ("mistral-large*", ModelLimits::new(131_072, 8_192)),
    ("mistral-medium*", ModelLimits::new(131_072, 8_192)),
    ("mistral-small*", ModelLimits::new(131_072, 8_192)),
    ("codestral*", ModelLimits::new(262_144, 8_192)),
    ("open-mistral-7b*", ModelLimits::new(32_768, 8_192)),
];

/// The longest entry of `table` matching `model` (exact name, or a prefix pattern ending in
/// `*`), after any provider prefix (`openrouter/anthropic/…`).
pub fn lookup<'a, T: Copy + 'a>(
    table: impl Iterator<Item = (&'a str, T)>,
    model: &str,
) -> Option<T> {
    let model = model.rsplit('/').next().unwrap_or(model);
    table
        .filter(|(pattern, _)| match pattern.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => *pattern == model,
        })
        .max_by_key(|(pattern, _)| pattern.len())
        .map(|(_, v)| v)
}

/// The built-in limits of `model`, if it is known.
pub fn builtin(model: &str) -> Option<ModelLimits> {
    lookup(BUILTIN.iter().map(|(k, v)| (*k, *v)), model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_and_their_input_limits() {
        let gpt5 = builtin("gpt-5-mini").unwrap();
        assert_eq!(gpt5.input_limit(0), 272_000);
        assert_eq!(gpt5.input_limit(200_000), 200_000);
        assert_eq!(builtin("gpt-4.1-nano").unwrap().window, 1_047_576);
        assert_eq!(builtin("gpt-4o-2024-08-06").unwrap().max_output, 16_384);
        assert_eq!(builtin("gpt-4").unwrap().window, 8_192);
        assert_eq!(builtin("gpt-4-0125-preview").unwrap().window, 128_000);
        assert_eq!(builtin("o1-mini").unwrap().window, 128_000);
        assert_eq!(builtin("o3-mini").unwrap().window, 200_000);
        assert_eq!(
            builtin("openrouter/anthropic/claude-3.5-sonnet")
                .unwrap()
                .window,
            200_000
        );
        assert_eq!(builtin("gemini-1.5-pro-002").unwrap().window, 2_097_152);
        assert_eq!(builtin("gemini-2.5-flash").unwrap().max_output, 65_536);
        assert_eq!(builtin("deepseek-reasoner").unwrap().window, 128_000);
        assert_eq!(builtin("llama3.1:8b").unwrap().window, 131_072);
        assert_eq!(builtin("llama3:8b").unwrap().window, 8_192);
        assert_eq!(builtin("something-new"), None);
    }

    #[test]
    fn every_entry_leaves_room_for_a_prompt() {
        for (name, l) in BUILTIN {
            assert!(l.max_output <= l.window, "{name}");
            assert!(l.input_limit(l.max_output.min(4096)) > 0, "{name}");
        }
    }
}
