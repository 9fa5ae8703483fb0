//! Token counting with the real BPE tokenizers (o200k_base, cl100k_base).
//!
//! Chooses the encoding from the model name: `gpt-4`/`gpt-3.5` families use cl100k_base,
//! everything else (gpt-4o, 4.1, 5, o-series and unknown models) o200k_base.

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

/// A BPE encoding the proxy can count with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl Encoding {
    /// The encoding the upstream uses for `model`.
    pub fn for_model(model: &str) -> Encoding {
        let m = model.rsplit('/').next().unwrap_or(model);
        let cl100k =
            (m.starts_with("gpt-4") && !m.starts_with("gpt-4o") && !m.starts_with("gpt-4.1"))
                || m.starts_with("gpt-3.5")
                || m.starts_with("text-embedding-3")
                || m.starts_with("text-embedding-ada");
        if cl100k {
            Encoding::Cl100kBase
        } else {
            Encoding::O200kBase
        }
    }

    fn bpe(self) -> &'static CoreBPE {
        static O200K: OnceLock<CoreBPE> = OnceLock::new();
        static CL100K: OnceLock<CoreBPE> = OnceLock::new();
        match self {
            Encoding::O200kBase => O200K
                .get_or_init(|| tiktoken_rs::o200k_base().expect("embedded o200k_base ranks load")),
            Encoding::Cl100kBase => CL100K.get_or_init(|| {
                tiktoken_rs::cl100k_base().expect("embedded cl100k_base ranks load")
            }),
        }
    }

    /// Number of tokens in `text`.
    pub fn count(self, text: &str) -> usize {
        self.bpe().encode_ordinary(text).len()
    }
}
