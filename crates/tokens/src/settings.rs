//! [`CountSettings`]: what the counter estimates for parts that are not text, and the size of
//! its cache. Its own module so that the counter and the per-message rules both read it
//! without importing each other.

use serde::{Deserialize, Serialize};

/// Estimates for what is not text, and the size of the count cache. Every field has a
/// documented default; in a config file the section is optional and unknown keys are an error.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CountSettings {
    /// Tokens for an `image_url` part at detail `high` or `auto` (the default detail).
    /// Default 765: OpenAI's published cost of a 1024×1024 image at high detail on
    /// gpt-4o-class models (85 base tokens + 4 tiles × 170). The real cost follows the
    /// image's size, which we do not decode.
    pub image_tokens: usize,
    /// Tokens for an `image_url` part with `detail: "low"`. Default 85: OpenAI's fixed
    /// low-detail cost on gpt-4o-class models, whatever the size.
    pub image_low_detail_tokens: usize,
    /// Tokens for an `input_audio` part, or an assistant's earlier `audio` reply. Default 200,
    /// a fixed guess for a short spoken turn of about ten seconds; the real cost grows with
    /// the audio's length, which we do not decode.
    pub audio_tokens: usize,
    /// Tokens for a `file` part (a PDF, say). Default 1000, a fixed guess for a few pages; the
    /// upstream extracts the text and page images, which we do not.
    pub file_tokens: usize,
    /// Most message counts remembered; 0 turns the cache off. Default 100 000 (about 4 MB),
    /// room for 500 conversations of 200 messages.
    pub cache_entries: usize,
}

impl Default for CountSettings {
    fn default() -> Self {
        CountSettings {
            image_tokens: 765,
            image_low_detail_tokens: 85,
            audio_tokens: 200,
            file_tokens: 1000,
            cache_entries: 100_000,
        }
    }
}
