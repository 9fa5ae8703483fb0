//! The names the store files things under: [`Tenant`] (a hash of the API key), [`SessionId`],
//! [`ContentRef`] (the opaque, content-addressed reference the model sees), [`StateKey`] and
//! [`ContentKind`]. A leaf: the store files things under them, the domain names tenants and
//! sessions with them, and neither needs the other to do so.
//!
//! Each name is checked once, when it is made, so that a value of these types is always safe as
//! a file name and as part of a Redis key (what `as_str` and `Display` give): only ASCII
//! lowercase letters, digits, `-`, `_`, `.` (and `%` in an escaped session name), starting with
//! a letter, a digit or `%`, never empty, never long. No value can hold `/`, `\`, `..`, `:`, a
//! drive letter or a NUL, so no backend can be led outside its root or split a key. Names are
//! lowercase because some file systems (macOS, Windows) do not tell `A` from `a`.
//!
//! A session is named by the client (`x-context-session`) with any printable text: capitals,
//! spaces, `/`, non-ASCII. [`SessionId`] keeps that name ([`SessionId::name`], what inspection
//! shows and finds) and files it under an escaped form: a name that already follows the rule
//! above is its own stored form, any other byte is written `%xx` (lowercase hex), and so is a
//! first byte that is not a letter or digit. The escape is one-to-one, so `My Session` and
//! `my session` are two sessions on every file system, and a stored form reads back as the
//! name it came from ([`SessionId::from_stored`]).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A name that breaks the rule above, quoted (at most 64 characters of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: expected {expected}")]
pub struct InvalidId {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Hex characters of a tenant id (80 bits of SHA-256).
const TENANT_HEX_LEN: usize = 20;
/// The tenant of requests that carry no API key.
const ANONYMOUS: &str = "anonymous";
/// Longest session name (in UTF-8 bytes) or state key.
const MAX_NAME_LEN: usize = 96;
/// Longest stored form of a session name: a file name's limit on common file systems.
const MAX_STORED_LEN: usize = 255;
const NAME_RULE: &str =
    "1 to 96 characters of a-z, 0-9, '-', '_' or '.', starting with a letter or digit";
const SESSION_RULE: &str = "1 to 96 bytes of printable UTF-8 (no control characters), at most \
     255 bytes once escaped for storage (each byte other than a-z, 0-9, '-', '_', '.' takes 3)";
/// Every content reference starts with this.
const REF_PREFIX: &str = "ctx_";
/// Base32 characters after the prefix: 24 × 5 = 120 bits of SHA-256.
const REF_HASH_LEN: usize = 24;
const REF_RULE: &str = "`ctx_` followed by 24 characters of a-z or 2-7";
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// Who owns stored items: a short hash of the API key, or `anonymous`. Nothing stored under one
/// tenant can be read under another.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(String);

impl Tenant {
    /// The tenant of a request sent with `api_key` (the bearer token): the first 20 hex
    /// characters of a SHA-256 of the key, so the key itself is never written anywhere. No key,
    /// or an empty one, gives the shared `anonymous` tenant.
    pub fn from_api_key(api_key: Option<&str>) -> Tenant {
        match api_key {
            Some(key) if !key.is_empty() => {
                let digest = Sha256::new()
                    .chain_update(b"context-proxy tenant\0")
                    .chain_update(key.as_bytes())
                    .finalize();
                Tenant(hex(&digest[..TENANT_HEX_LEN / 2]))
            }
            _ => Tenant(ANONYMOUS.to_owned()),
        }
    }

    /// Whether `name` is a tenant id as [`Tenant::from_api_key`] makes them (used to recognise
    /// the store's own directories).
    pub(crate) fn is_valid(name: &str) -> bool {
        name == ANONYMOUS
            || (name.len() == TENANT_HEX_LEN
                && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A tenant id read back from the store (a directory or key name), when it is one.
    pub(crate) fn from_id(id: &str) -> Option<Tenant> {
        Tenant::is_valid(id).then(|| Tenant(id.to_owned()))
    }
}

/// One conversation of a tenant: the `x-context-session` header when it is a valid name, or an
/// id derived from the conversation itself. Holds the stored (escaped) form: `as_str` and
/// `Display` are safe as a file name and in a key; [`SessionId::name`] is the name as given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionId(String);

impl SessionId {
    /// Checks a session name given by a client (or a person, to inspect it): 1 to 96 bytes of
    /// printable text, kept as given and escaped for storage (see the module doc). For a value
    /// that breaks the rule, use [`SessionId::derive`] on its bytes.
    pub fn parse(value: &str) -> Result<SessionId, InvalidId> {
        let printable = !value.is_empty()
            && value.len() <= MAX_NAME_LEN
            && !value.chars().any(char::is_control);
        let stored = printable.then(|| escape(value));
        match stored {
            Some(stored) if stored.len() <= MAX_STORED_LEN => Ok(SessionId(stored)),
            _ => Err(invalid("session id", value, SESSION_RULE)),
        }
    }

    /// The session filed under `stored` (a directory or key name a backend reads back), when
    /// it is the stored form of a valid name: the one form [`SessionId::parse`] gives, never
    /// another spelling of it.
    pub fn from_stored(stored: &str) -> Option<SessionId> {
        let name = unescape(stored)?;
        SessionId::parse(&name).ok().filter(|id| id.0 == stored)
    }

    /// The name as the client gave it (what inspection shows and finds).
    pub fn name(&self) -> Cow<'_, str> {
        // Every value was escaped by `parse`, so it always reads back.
        unescape(&self.0).unwrap_or(Cow::Borrowed(&self.0))
    }

    /// A session id derived from `seed` (for instance the conversation's first messages): `d-`
    /// and 20 hex characters of its SHA-256. The same seed always gives the same id.
    pub fn derive(seed: &[u8]) -> SessionId {
        let digest = Sha256::new()
            .chain_update(b"context-proxy session\0")
            .chain_update(seed)
            .finalize();
        SessionId(format!("d-{}", hex(&digest[..10])))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name of a small state record of a session, for instance `compact-<prefix hash>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateKey(String);

impl StateKey {
    /// Checks a state key; same rule as session ids (see the module doc).
    pub fn parse(value: &str) -> Result<StateKey, InvalidId> {
        check_name("state key", value)?;
        Ok(StateKey(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The opaque reference to stored content: `ctx_` and 24 base32 characters of the content's
/// SHA-256. The same content always has the same reference; a reference is never a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentRef(String);

impl ContentRef {
    /// The reference `content` has (and will have once stored). Pure, so the engine can write
    /// the reference into a message before the store call.
    pub fn of(content: &str) -> ContentRef {
        ContentRef::of_bytes(content.as_bytes())
    }

    pub(crate) fn of_bytes(content: &[u8]) -> ContentRef {
        let digest = Sha256::digest(content);
        let mut out = String::with_capacity(REF_PREFIX.len() + REF_HASH_LEN);
        out.push_str(REF_PREFIX);
        // 15 bytes are 120 bits: exactly 24 base32 characters, 5 bits each.
        let mut bits: u64 = 0;
        let mut count = 0;
        for &byte in &digest[..REF_HASH_LEN * 5 / 8] {
            bits = (bits << 8) | u64::from(byte);
            count += 8;
            while count >= 5 {
                count -= 5;
                out.push(char::from(BASE32[((bits >> count) & 31) as usize]));
            }
        }
        ContentRef(out)
    }

    /// Checks a reference that came from outside (a model's `context_read` call, a file).
    /// Anything but `ctx_` and 24 characters of `a-z2-7` is rejected.
    pub fn parse(value: &str) -> Result<ContentRef, InvalidId> {
        let valid = value.len() == REF_PREFIX.len() + REF_HASH_LEN
            && value.starts_with(REF_PREFIX)
            && value.as_bytes()[REF_PREFIX.len()..]
                .iter()
                .all(|b| BASE32.contains(b));
        if !valid {
            return Err(invalid("content reference", value, REF_RULE));
        }
        Ok(ContentRef(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a piece of stored content is; it names the file in the `fs` backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContentKind {
    /// The full text of a tool result that was truncated or compacted.
    ToolResult,
    /// The full text of a user message that was truncated.
    UserText,
    /// A span of messages replaced by a summary, as a JSON array.
    Messages,
}

impl ContentKind {
    pub const ALL: [ContentKind; 3] = [
        ContentKind::ToolResult,
        ContentKind::UserText,
        ContentKind::Messages,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ContentKind::ToolResult => "tool_result",
            ContentKind::UserText => "user_text",
            ContentKind::Messages => "messages",
        }
    }

    /// The file name of content `r` of this kind, e.g. `tool_result-ctx_….txt`.
    pub fn file_name(self, r: &ContentRef) -> String {
        let ext = match self {
            ContentKind::Messages => "json",
            ContentKind::ToolResult | ContentKind::UserText => "txt",
        };
        format!("{}-{}.{ext}", self.as_str(), r.as_str())
    }
}

macro_rules! string_like {
    ($($ty:ty),*) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    )*};
}
string_like!(Tenant, SessionId, StateKey, ContentRef);

impl FromStr for ContentRef {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ContentRef::parse(s)
    }
}

impl fmt::Display for ContentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `b` may stand for itself in a stored name (at `first`, only a letter or digit may).
fn plain(b: u8, first: bool) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9') || (!first && matches!(b, b'-' | b'_' | b'.'))
}

/// The stored form of a session name: every byte that is not [`plain`] as `%xx`.
fn escape(name: &str) -> String {
    use fmt::Write;
    let bytes = name.as_bytes();
    if bytes.iter().enumerate().all(|(i, &b)| plain(b, i == 0)) {
        return name.to_owned();
    }
    let mut out = String::with_capacity(name.len() * 3);
    for (i, &b) in bytes.iter().enumerate() {
        if plain(b, i == 0) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02x}");
        }
    }
    out
}

/// The name a stored form stands for (itself when it holds no escape); `None` when it is not
/// well-formed (a stray `%`, uppercase hex, bytes that are not UTF-8).
fn unescape(stored: &str) -> Option<Cow<'_, str>> {
    if !stored.contains('%') {
        return Some(Cow::Borrowed(stored));
    }
    let bytes = stored.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            out.push(digit(hex[0])? << 4 | digit(hex[1])?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

fn check_name(what: &'static str, value: &str) -> Result<(), InvalidId> {
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|&b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(invalid(what, value, NAME_RULE))
    }
}

fn invalid(what: &'static str, value: &str, expected: &'static str) -> InvalidId {
    // The value may come from a client or a model: quote at most 64 characters of it.
    let mut shown: String = value.chars().take(64).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    InvalidId {
        what,
        value: shown,
        expected,
    }
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MALICIOUS: &[&str] = &[
        "",
        ".",
        "..",
        "../../etc/passwd",
        "/etc/passwd",
        "\\windows\\system32",
        "C:\\x",
        "c:",
        "a/b",
        "a\\b",
        "a\0b",
        " a",
        "a ",
        ".hidden",
        "-flag",
        "_refs",
        "Upper",
        "caf\u{e9}",
        "\u{ff41}",
    ];

    #[test]
    fn malicious_refs_are_rejected() {
        let good = ContentRef::of("x");
        let long = format!("{good}a");
        let short = &good.as_str()[..good.as_str().len() - 1];
        let upper = good.as_str().to_uppercase();
        let wrong_prefix = good.as_str().replacen("ctx_", "ref_", 1);
        let with_slash = format!("ctx_../../{}", &good.as_str()[10..]);
        let with_one = good.as_str().replacen(&good.as_str()[4..5], "1", 1);
        let mut bad: Vec<&str> = MALICIOUS.to_vec();
        bad.extend([
            "ctx_",
            "ctx_aaaa",
            long.as_str(),
            short,
            upper.as_str(),
            wrong_prefix.as_str(),
            with_slash.as_str(),
            with_one.as_str(),
            "ctx_../../../../etc/passwd",
            "ctx_aaaaaaaaaaaaaaaaaaaaaaa/",
            "ctx_aaaaaaaaaaaaaaaaaaaaaa..",
        ]);
        for value in bad {
            let err = ContentRef::parse(value).unwrap_err();
            assert!(
                matches!(
                    err,
                    InvalidId {
                        what: "content reference",
                        ..
                    }
                ),
                "{value:?}: {err}"
            );
        }
        assert_eq!(ContentRef::parse(good.as_str()).unwrap(), good);
    }

    #[test]
    fn malicious_state_keys_are_rejected_and_session_names_escaped() {
        let too_long = "a".repeat(MAX_NAME_LEN + 1);
        for value in MALICIOUS.iter().copied().chain([too_long.as_str()]) {
            assert!(StateKey::parse(value).is_err(), "{value:?}");
        }
        // A session name is kept as given; what is stored is a plain file name.
        for value in MALICIOUS
            .iter()
            .copied()
            .filter(|v| !v.is_empty() && !v.contains('\0'))
        {
            let id = SessionId::parse(value).unwrap();
            assert_eq!(id.name(), value);
            assert_ne!(
                id.as_str(),
                value,
                "{value:?} is not a plain name: it must be escaped"
            );
            assert_eq!(SessionId::from_stored(id.as_str()), Some(id));
        }
        for value in ["", "a\0b", "a\nb", "tab\there", too_long.as_str()] {
            assert!(SessionId::parse(value).is_err(), "{value:?}");
        }
        for value in ["a", "s1", "0.9-x_y", &"z".repeat(MAX_NAME_LEN)] {
            assert_eq!(SessionId::parse(value).unwrap().as_str(), value);
            assert_eq!(SessionId::parse(value).unwrap().name(), value);
            assert_eq!(StateKey::parse(value).unwrap().as_str(), value);
        }
    }

    #[test]
    fn session_names_are_kept_as_given_and_escaped_one_to_one() {
        let cases = [
            ("My Session", "%4dy%20%53ession"),
            ("my session", "my%20session"),
            ("a/b", "a%2fb"),
            ("..", "%2e."),
            ("50%", "50%25"),
            ("caf\u{e9}", "caf%c3%a9"),
            ("_refs", "%5frefs"),
            ("redis:{key}*", "redis%3a%7bkey%7d%2a"),
        ];
        for (name, stored) in cases {
            let id = SessionId::parse(name).unwrap();
            assert_eq!(id.as_str(), stored);
            assert_eq!(id.to_string(), stored);
            assert_eq!(id.name(), name);
            assert_eq!(SessionId::from_stored(stored), Some(id));
        }
        // Stored forms that no name gives are not sessions.
        for stored in ["%4Dy", "%4", "a%zz", "%61", "%ff", "A", "", "a/b", ".x"] {
            assert_eq!(SessionId::from_stored(stored), None, "{stored:?}");
        }
        // 96 bytes that escape to more than a file name may hold are refused, with the rule.
        let wide = "\u{e9}".repeat(48);
        let err = SessionId::parse(&wide).unwrap_err().to_string();
        assert!(err.contains("escaped"), "{err}");
        assert!(SessionId::parse(&"\u{e9}".repeat(42)).is_ok());
    }

    #[test]
    fn error_quotes_a_bounded_part_of_the_value() {
        let err = SessionId::parse(&"/".repeat(10_000))
            .unwrap_err()
            .to_string();
        assert!(err.len() < 400, "{err}");
        assert!(err.contains("session id"), "{err}");
    }

    #[test]
    fn content_ref_is_stable_and_well_formed() {
        // SHA-256("") = e3b0c442 98fc1c14 9afbf4c8 996fb924 …; its first 15 bytes in base32.
        assert_eq!(ContentRef::of("").as_str(), "ctx_4oymiquy7qobjgx36tejs35z");
        assert_eq!(ContentRef::of("a"), ContentRef::of("a"));
        assert_ne!(ContentRef::of("a"), ContentRef::of("b"));
    }

    #[test]
    fn tenants_are_short_hex_or_anonymous() {
        let a = Tenant::from_api_key(Some("sk-a"));
        let b = Tenant::from_api_key(Some("sk-b"));
        assert_ne!(a, b);
        assert_eq!(a, Tenant::from_api_key(Some("sk-a")));
        assert_eq!(a.as_str().len(), TENANT_HEX_LEN);
        assert!(Tenant::is_valid(a.as_str()));
        assert!(!a.as_str().contains("sk-a"));
        assert_eq!(Tenant::from_api_key(None).as_str(), "anonymous");
        assert_eq!(Tenant::from_api_key(Some("")).as_str(), "anonymous");
        assert!(!Tenant::is_valid("../x"));
    }

    #[test]
    fn derived_session_ids_are_valid_and_stable() {
        let a = SessionId::derive(b"first messages");
        assert_eq!(a, SessionId::derive(b"first messages"));
        assert_ne!(a, SessionId::derive(b"other"));
        assert_eq!(SessionId::parse(a.as_str()).unwrap(), a);
    }

    #[test]
    fn file_names_carry_kind_and_ref() {
        let r = ContentRef::of("x");
        assert_eq!(
            ContentKind::ToolResult.file_name(&r),
            format!("tool_result-{r}.txt")
        );
        assert_eq!(
            ContentKind::Messages.file_name(&r),
            format!("messages-{r}.json")
        );
    }

    proptest! {
        #[test]
        fn every_computed_ref_parses(content in any::<String>()) {
            let r = ContentRef::of(&content);
            prop_assert_eq!(ContentRef::parse(r.as_str()).unwrap(), r);
        }

        #[test]
        fn a_printable_session_name_reads_back_from_its_stored_form(
            // At most 21 characters: 4 bytes each at worst, 12 once escaped, within the limits
            // (96 bytes, 255 escaped) that `parse` enforces and other tests cover.
            name in "[^\\p{Cc}]{1,21}",
        ) {
            let id = SessionId::parse(&name).unwrap();
            prop_assert_eq!(id.name(), name.as_str());
            prop_assert_eq!(SessionId::from_stored(id.as_str()), Some(id.clone()));
            // One case only and no character a key, a glob or a path could read as syntax.
            prop_assert!(id.as_str().bytes().all(|b| matches!(
                b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'%'
            )), "{}", id);
        }

        #[test]
        fn whatever_parses_is_a_plain_file_name(value in any::<String>()) {
            for parsed in [
                ContentRef::parse(&value).map(|r| r.0),
                SessionId::parse(&value).map(|s| s.0),
                StateKey::parse(&value).map(|k| k.0),
            ].into_iter().flatten() {
                let path = std::path::Path::new(&parsed);
                prop_assert_eq!(path.components().count(), 1);
                prop_assert!(matches!(
                    path.components().next(),
                    Some(std::path::Component::Normal(_))
                ));
                prop_assert!(!parsed.starts_with('.'));
            }
        }
    }
}
