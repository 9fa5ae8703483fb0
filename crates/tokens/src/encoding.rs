//! The BPE encodings the proxy counts with (o200k_base, cl100k_base): which one a model uses,
//! how a config names one, and the raw count of a string.
//!
//! Counting uses `bpe-openai`, chosen by measurement over `tiktoken-rs` (see `BENCHMARKS.md`,
//! "Token counting"): identical counts, 1.3–3x faster on realistic text and 40x or more on
//! long single-piece input, linear in the input's length, and it does not panic where
//! tiktoken-rs does (o200k_base on a long run of spaces). Its ranks are embedded in the binary at build time and deserialized once, on first
//! use; nothing is fetched at run time. Text is counted as ordinary text: a special token
//! such as `<|endoftext|>` written inside a message is counted as the characters it is made of.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A BPE encoding the proxy can count with. In a config file it is written by its tiktoken
/// name: `"o200k_base"` or `"cl100k_base"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Encoding {
    /// gpt-4o, gpt-4.1, gpt-5, o-series, and the default for unknown models.
    #[serde(rename = "o200k_base")]
    O200kBase,
    /// gpt-4, gpt-3.5-turbo, text-embedding-3 and -ada.
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
}

impl Encoding {
    /// The encoding the upstream uses for `model`. A provider prefix (`openai/gpt-4`) is
    /// ignored; `gpt-4`/`gpt-3.5` families and the OpenAI embeddings use cl100k_base,
    /// everything else (gpt-4o, 4.1, 5, o-series and unknown models) o200k_base.
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

    /// Number of tokens in `text`.
    pub fn count(self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        if text.len() <= short::LEN {
            return short::count(self, text);
        }
        self.tokenizer().count(text)
    }

    /// The longest prefix of `text` that counts at most `max_tokens`, cut between characters:
    /// whole pre-tokenizer pieces while they fit, then as much of the next one as fits. Linear
    /// in the text's length, plus a logarithmic search inside the piece that overflows.
    pub fn truncate(self, text: &str, max_tokens: usize) -> &str {
        let tokenizer = self.tokenizer();
        let mut end = 0;
        let mut total = 0;
        for piece in tokenizer.split(text) {
            let n = tokenizer.count(piece);
            if total + n > max_tokens {
                // The longest prefix of this piece within what is left (counts grow with a
                // piece's prefix, so a binary search over its character boundaries finds it).
                let room = max_tokens - total;
                let bounds: Vec<usize> = piece.char_indices().map(|(i, _)| i).collect();
                let (mut lo, mut hi) = (0, bounds.len());
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    let cut = bounds.get(mid).copied().unwrap_or(piece.len());
                    if tokenizer.count(&piece[..cut]) <= room {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                end += bounds.get(lo).copied().unwrap_or(piece.len());
                break;
            }
            total += n;
            end += piece.len();
        }
        // Pieces split alone as they do inside the text; should a cut text split otherwise,
        // give back characters until it fits.
        let mut cut = &text[..end];
        while self.count(cut) > max_tokens {
            let Some((last, _)) = cut.char_indices().next_back() else {
                break;
            };
            cut = &cut[..last];
        }
        cut
    }

    /// The tiktoken name of the encoding, as written in a config file.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    /// The embedded tokenizer. `bpe-openai` builds it lazily from ranks serialized into the
    /// binary at build time; that step only fails if the build produced a corrupt table, which
    /// its own tests rule out, so the accessor has no error to return.
    fn tokenizer(self) -> &'static bpe_openai::Tokenizer {
        match self {
            Encoding::O200kBase => bpe_openai::o200k_base(),
            Encoding::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }
}

/// Counts of short strings, remembered per thread. Roles, tool names, call ids and short
/// values come back in message after message, and tokenizing a few bytes (its pre-split regex,
/// then the encoder) costs several times more than finding the count again.
mod short {
    use std::cell::RefCell;

    use super::Encoding;

    /// Longest string remembered, in bytes.
    pub const LEN: usize = 22;
    /// Slots in each thread's table; a string's hash picks its slot, a newer string evicts.
    const SLOTS: usize = 1024;

    #[derive(Clone, Copy)]
    struct Slot {
        /// 0 for an empty slot, else 1 + the encoding's index.
        encoding: u8,
        len: u8,
        tokens: u8,
        bytes: [u8; LEN],
    }

    const EMPTY: Slot = Slot {
        encoding: 0,
        len: 0,
        tokens: 0,
        bytes: [0; LEN],
    };

    thread_local! {
        static TABLE: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
    }

    /// `encoding.tokenizer().count(text)` for a `text` of at most [`LEN`] bytes.
    pub fn count(encoding: Encoding, text: &str) -> usize {
        let tag = match encoding {
            Encoding::O200kBase => 1,
            Encoding::Cl100kBase => 2,
        };
        let bytes = text.as_bytes();
        let at = xxhash_rust::xxh3::xxh3_64(bytes) as usize % SLOTS;
        TABLE.with(|table| {
            let mut table = table.borrow_mut();
            if table.is_empty() {
                table.resize(SLOTS, EMPTY);
            }
            let slot = &mut table[at];
            if slot.encoding == tag && &slot.bytes[..usize::from(slot.len)] == bytes {
                return usize::from(slot.tokens);
            }
            // At most one token per byte: a short string's count fits in a byte.
            let tokens = encoding.tokenizer().count(text);
            let mut remembered = Slot {
                encoding: tag,
                len: bytes.len() as u8,
                tokens: tokens as u8,
                bytes: [0; LEN],
            };
            remembered.bytes[..bytes.len()].copy_from_slice(bytes);
            *slot = remembered;
            tokens
        })
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a string that names no supported encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown token encoding `{0}` (expected `o200k_base` or `cl100k_base`)")]
pub struct UnknownEncoding(pub String);

impl FromStr for Encoding {
    type Err = UnknownEncoding;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "o200k_base" => Ok(Encoding::O200kBase),
            "cl100k_base" => Ok(Encoding::Cl100kBase),
            other => Err(UnknownEncoding(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The reference implementation (a dev-dependency): tiktoken's own Rust core.
    fn tiktoken(encoding: Encoding, text: &str) -> usize {
        let bpe = match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        };
        bpe.encode_ordinary(text).len()
    }

    const BOTH: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

    proptest! {
        /// A cut text fits, and it is all but the longest prefix that does: one more character
        /// would count at least `max - 1` (a piece cut off can split otherwise at its end).
        #[test]
        fn truncate_keeps_the_longest_prefix_that_fits(
            text in "[ a-zA-Zé😀0-9.,\n]{0,400}",
            max in 0usize..120,
        ) {
            for encoding in BOTH {
                let cut = encoding.truncate(&text, max);
                prop_assert!(text.starts_with(cut));
                prop_assert!(encoding.count(cut) <= max);
                if cut.len() < text.len() {
                    let next = text[cut.len()..].chars().next().map_or(0, char::len_utf8);
                    let longer = &text[..cut.len() + next];
                    prop_assert!(encoding.count(longer) + 1 >= max, "{encoding}: {cut:?} of {text:?}");
                }
            }
        }
    }

    #[test]
    fn truncate_cuts_one_long_piece_and_leaves_a_short_text_alone() {
        for encoding in BOTH {
            let word = "a".repeat(100_000);
            let cut = encoding.truncate(&word, 50);
            assert!(
                encoding.count(cut) <= 50 && encoding.count(cut) >= 49,
                "{encoding}"
            );
            assert_eq!(encoding.truncate("hello world", 50), "hello world");
            assert_eq!(encoding.truncate("hello world", 0), "");
        }
    }

    /// Remembered short counts are the tokenizer's, under both encodings, after slots were
    /// overwritten many times over, and for strings one byte short of, at and past the limit.
    #[test]
    fn short_strings_are_remembered_exactly() {
        let mut texts: Vec<String> = (0..5000)
            .map(|i| format!("call_{i:x} {}", "é".repeat(i % 7)))
            .filter(|t| t.len() <= short::LEN)
            .collect();
        texts.extend(["tool", "user", "  "].map(String::from));
        texts.extend(["x".repeat(short::LEN - 1), "😀".repeat(5)]);
        texts.push("ab".repeat(short::LEN / 2));
        texts.push("ab".repeat(short::LEN / 2 + 1));
        for round in 0..2 {
            for text in &texts {
                for encoding in BOTH {
                    assert_eq!(
                        encoding.count(text),
                        encoding.tokenizer().count(text),
                        "{encoding} {text:?} round {round}"
                    );
                }
            }
        }
    }

    /// Strings where pre-tokenization regexes and byte merging tend to disagree.
    fn tricky() -> Vec<String> {
        let mut corpus: Vec<String> = [
            "",
            " ",
            "\n",
            "hello world",
            "Hello, World! It's 2024; we'll see.",
            "I'M SHOUTING. YOU'RE NOT. THEY'LL'VE",
            "😀",
            "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇫🇷🇯🇵 flags, 👍🏽 skin tone",
            "🤖🤖🤖🤖🤖🤖🤖🤖",
            "お誕生日おめでとう",
            "中文、日本語、한국어。「引用」",
            "東京タワーは333メートルです",
            "Ελληνικά и русский текст, עברית, العربية",
            "mixed中文English日本語123abc😀",
            "naïve café résumé Zürich",
            "e\u{301} combining vs é precomposed",
            "\u{200b}zero\u{200b}width\u{feff}bom",
            "tabs\tand\ttabs\t\t\t",
            "line\r\nendings\r\n\r\n",
            "trailing spaces   ",
            "   leading spaces",
            "a  b   c    d     e",
            "    indented code\n        more\n",
            "\n\n\n\n",
            " \n \n \n",
            "1234567890123456789",
            "3.14159 2.71828 -42 1e10 0x1F",
            "{\"key\": [1, 2, {\"nested\": null}], \"s\": \"a\\\"b\"}",
            "fn main() { println!(\"{}\", 1 + 2); }",
            "https://example.com/path?q=1&r=%20#frag",
            "SGVsbG8gV29ybGQhIFRoaXMgaXMgYmFzZTY0Lg==",
            "<|endoftext|> <|im_start|>user<|im_sep|>",
            "'s 't 're 've 'm 'll 'd 'S 'T",
            "\u{0}\u{1}\u{7f}",
            "\u{10ffff}\u{e000}",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        for n in [2, 3, 7, 16, 63, 64, 65, 127, 1000] {
            corpus.push(" ".repeat(n));
            corpus.push(format!("x{}y", " ".repeat(n)));
            corpus.push(format!("x{}", " ".repeat(n)));
            corpus.push("\n".repeat(n));
            corpus.push(" \t\n".repeat(n));
            corpus.push("a".repeat(n));
            corpus.push("😀".repeat(n));
            corpus.push("中".repeat(n));
            corpus.push("1".repeat(n));
            corpus.push("!".repeat(n));
        }
        corpus
    }

    #[test]
    fn agrees_with_tiktoken_on_tricky_strings() {
        for encoding in BOTH {
            for text in tricky() {
                assert_eq!(
                    encoding.count(&text),
                    tiktoken(encoding, &text),
                    "{encoding} on {text:?}"
                );
            }
        }
    }

    /// Text built from pieces that stress the pre-tokenizer: whitespace of every kind,
    /// contractions, digits, letters of several scripts, marks, emoji and joiners.
    fn pieces() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just(" ".to_string()),
            Just("  ".to_string()),
            Just("\t".to_string()),
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            Just("\u{a0}".to_string()),
            Just("\u{3000}".to_string()),
            Just("'s".to_string()),
            Just("'LL".to_string()),
            Just("123".to_string()),
            Just("4567".to_string()),
            Just("word".to_string()),
            Just("Word".to_string()),
            Just("WORD".to_string()),
            Just("é".to_string()),
            Just("\u{301}".to_string()),
            Just("中文".to_string()),
            Just("カタ".to_string()),
            Just("한".to_string()),
            Just("😀".to_string()),
            Just("\u{200d}".to_string()),
            Just("\u{fe0f}".to_string()),
            Just("{\"a\":1}".to_string()),
            Just("/".to_string()),
            Just("...".to_string()),
            any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..48).prop_map(|p| p.concat())
    }

    proptest! {
        #[test]
        fn agrees_with_tiktoken_on_random_unicode(text in "\\PC{0,200}") {
            for encoding in BOTH {
                prop_assert_eq!(encoding.count(&text), tiktoken(encoding, &text));
            }
        }

        #[test]
        fn agrees_with_tiktoken_on_mixed_pieces(text in pieces()) {
            for encoding in BOTH {
                prop_assert_eq!(encoding.count(&text), tiktoken(encoding, &text));
            }
        }
    }

    /// Counts published in OpenAI's cookbook ("How to count tokens with tiktoken",
    /// sections 3 and 5), which prints the token ids as well.
    #[test]
    fn published_counts() {
        let cases = [
            ("tiktoken is great!", None, Some(6)),
            ("antidisestablishmentarianism", Some(6), Some(6)),
            ("2 + 2 = 4", Some(7), Some(7)),
            ("お誕生日おめでとう", Some(9), Some(8)),
        ];
        for (text, cl100k, o200k) in cases {
            if let Some(n) = cl100k {
                assert_eq!(Encoding::Cl100kBase.count(text), n, "cl100k {text:?}");
            }
            if let Some(n) = o200k {
                assert_eq!(Encoding::O200kBase.count(text), n, "o200k {text:?}");
            }
        }
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Encoding::O200kBase.count(""), 0);
        assert_eq!(Encoding::Cl100kBase.count(""), 0);
    }

    #[test]
    fn model_families() {
        for (model, enc) in [
            ("gpt-4o", Encoding::O200kBase),
            ("gpt-4o-mini-2024-07-18", Encoding::O200kBase),
            ("gpt-4.1", Encoding::O200kBase),
            ("gpt-5", Encoding::O200kBase),
            ("o3-mini", Encoding::O200kBase),
            ("openai/gpt-4-turbo", Encoding::Cl100kBase),
            ("gpt-4", Encoding::Cl100kBase),
            ("gpt-3.5-turbo", Encoding::Cl100kBase),
            ("text-embedding-3-small", Encoding::Cl100kBase),
            ("llama-3.1-70b", Encoding::O200kBase),
            ("", Encoding::O200kBase),
        ] {
            assert_eq!(Encoding::for_model(model), enc, "{model}");
        }
    }

    #[test]
    fn parses_from_config_strings() {
        #[derive(Deserialize)]
        struct Upstream {
            encoding: Encoding,
        }
        let u: Upstream = toml::from_str(r#"encoding = "cl100k_base""#).unwrap();
        assert_eq!(u.encoding, Encoding::Cl100kBase);
        let u: Upstream = toml::from_str(r#"encoding = "o200k_base""#).unwrap();
        assert_eq!(u.encoding, Encoding::O200kBase);
        assert!(toml::from_str::<Upstream>(r#"encoding = "p50k_base""#).is_err());
        let json: Encoding = serde_json::from_str(r#""o200k_base""#).unwrap();
        assert_eq!(json, Encoding::O200kBase);
        assert_eq!(
            serde_json::to_string(&Encoding::Cl100kBase).unwrap(),
            r#""cl100k_base""#
        );

        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(enc.name().parse::<Encoding>(), Ok(enc));
            assert_eq!(enc.to_string(), enc.name());
        }
        assert_eq!(
            "O200K".parse::<Encoding>(),
            Err(UnknownEncoding("O200K".to_string()))
        );
    }
}
