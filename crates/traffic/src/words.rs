//! Vocabularies and small atoms every content generator draws from: English words, identifier
//! parts, names, places, CJK sentences, emoji, timestamps and ids.
//!
//! Only data and tiny helpers live here; the shapes of files, logs and pages are elsewhere.

use super::rng::Rng;

/// Appends formatted text to a `String`; writing to a `String` cannot fail.
macro_rules! put {
    ($dst:expr, $($arg:tt)*) => {{
        let _ = ::std::fmt::Write::write_fmt($dst, format_args!($($arg)*));
    }};
}
pub(crate) use put;

/// Common English words for prose.
pub const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
    "an",
    "but",
    "have",
    "has",
    "more",
    "one",
    "can",
    "also",
    "other",
    "than",
    "when",
    "their",
    "these",
    "some",
    "into",
    "only",
    "most",
    "between",
    "after",
    "where",
    "while",
    "both",
    "each",
    "many",
    "such",
    "through",
    "system",
    "data",
    "model",
    "time",
    "process",
    "result",
    "value",
    "number",
    "level",
    "example",
    "approach",
    "method",
    "research",
    "study",
    "analysis",
    "performance",
    "network",
    "energy",
    "market",
    "policy",
    "change",
    "growth",
    "design",
    "structure",
    "function",
    "evidence",
    "support",
    "increase",
    "reduce",
    "improve",
    "measure",
    "report",
    "suggest",
    "require",
    "provide",
    "include",
    "develop",
    "consider",
    "remain",
    "significant",
    "recent",
    "large",
    "small",
    "high",
    "low",
    "new",
    "early",
    "different",
    "important",
    "common",
    "specific",
    "global",
    "local",
    "public",
    "private",
    "average",
    "total",
    "annual",
    "regional",
    "urban",
    "rural",
    "economic",
    "social",
    "technical",
    "scientific",
    "practical",
    "critical",
    "however",
    "therefore",
    "although",
    "because",
    "during",
    "without",
    "within",
    "across",
    "against",
    "around",
    "under",
    "over",
    "about",
    "before",
    "since",
    "until",
    "often",
    "usually",
    "typically",
    "generally",
    "particularly",
    "especially",
    "approximately",
    "roughly",
    "nearly",
    "water",
    "climate",
    "temperature",
    "battery",
    "storage",
    "solar",
    "wind",
    "carbon",
    "emissions",
    "cost",
    "price",
    "supply",
    "demand",
    "production",
    "capacity",
    "efficiency",
    "population",
    "health",
    "education",
    "transport",
    "infrastructure",
    "technology",
    "software",
    "hardware",
    "memory",
    "compute",
    "latency",
    "throughput",
    "security",
    "privacy",
    "users",
    "customers",
    "companies",
    "governments",
    "researchers",
    "engineers",
    "scientists",
    "teams",
    "decade",
    "century",
    "year",
    "month",
    "quarter",
    "percent",
    "share",
    "rate",
    "trend",
    "factor",
    "source",
    "period",
    "region",
    "country",
    "city",
    "industry",
    "sector",
    "survey",
];

/// Nouns of prose (singular).
pub const PROSE_NOUNS: &[&str] = &[
    "system",
    "market",
    "study",
    "policy",
    "price",
    "cost",
    "battery",
    "network",
    "team",
    "company",
    "region",
    "report",
    "model",
    "survey",
    "technology",
    "sector",
    "city",
    "project",
    "government",
    "researcher",
    "customer",
    "plant",
    "grid",
    "factory",
    "program",
    "standard",
    "household",
    "investor",
    "utility",
    "developer",
    "user",
    "platform",
    "dataset",
    "sample",
    "trial",
    "result",
    "supplier",
    "consumer",
    "country",
    "school",
    "hospital",
    "farm",
    "engine",
    "process",
    "method",
    "approach",
    "framework",
    "benchmark",
    "workload",
    "design",
    "budget",
];

/// Verbs of prose (base form, regular).
pub const PROSE_VERBS: &[&str] = &[
    "reduce",
    "increase",
    "improve",
    "support",
    "affect",
    "limit",
    "boost",
    "show",
    "suggest",
    "require",
    "replace",
    "expand",
    "lower",
    "raise",
    "shape",
    "track",
    "measure",
    "double",
    "outpace",
    "favor",
    "explain",
    "predict",
    "change",
    "delay",
    "accelerate",
    "stabilize",
];

/// Adjectives of prose.
pub const PROSE_ADJECTIVES: &[&str] = &[
    "large",
    "small",
    "recent",
    "significant",
    "modest",
    "rapid",
    "steady",
    "higher",
    "lower",
    "regional",
    "national",
    "global",
    "annual",
    "early",
    "new",
    "typical",
    "average",
    "local",
    "major",
    "long-term",
    "short-term",
    "independent",
    "public",
    "private",
    "older",
    "newer",
];

/// Sentence openers.
pub const OPENERS: &[&str] = &[
    "However",
    "In practice",
    "By contrast",
    "Overall",
    "Meanwhile",
    "As a result",
    "In most cases",
    "Notably",
    "At the same time",
    "In the long run",
    "For now",
    "In short",
];

/// Prepositions that take a noun phrase.
pub const PREPOSITIONS: &[&str] = &[
    "in", "across", "for", "among", "within", "over", "during", "after",
];

/// Identifier parts: nouns of software.
pub const NOUNS: &[&str] = &[
    "cache", "request", "response", "buffer", "session", "token", "handler", "config", "index",
    "store", "queue", "worker", "client", "server", "router", "parser", "header", "payload",
    "message", "event", "record", "entry", "batch", "chunk", "frame", "stream", "channel",
    "schema", "field", "column", "table", "row", "node", "edge", "graph", "tree", "path", "file",
    "block", "page", "segment", "offset", "limit", "budget", "policy", "rule", "filter", "metric",
    "counter", "span", "trace", "log", "user", "account", "order", "item", "price", "invoice",
    "report", "summary", "context", "prompt", "model", "tool", "result", "error", "state",
    "snapshot", "manifest", "plugin", "module", "package", "target", "profile",
];

/// Identifier parts: verbs of software.
pub const VERBS: &[&str] = &[
    "parse",
    "load",
    "build",
    "send",
    "read",
    "write",
    "flush",
    "resolve",
    "fetch",
    "update",
    "insert",
    "remove",
    "merge",
    "split",
    "encode",
    "decode",
    "validate",
    "render",
    "compute",
    "apply",
    "collect",
    "dispatch",
    "register",
    "lookup",
    "refresh",
    "compact",
    "compress",
    "serialize",
    "normalize",
    "retry",
    "schedule",
    "spawn",
    "close",
    "open",
    "drain",
    "emit",
    "handle",
    "check",
    "count",
    "estimate",
    "select",
    "sort",
    "format",
    "convert",
    "prepare",
];

/// Adjectives used in identifiers and names.
pub const ADJECTIVES: &[&str] = &[
    "max", "min", "default", "current", "pending", "active", "stale", "raw", "inner", "outer",
    "total", "partial", "local", "remote", "cached", "shared", "next", "last", "first", "new",
];

/// First names.
pub const FIRST_NAMES: &[&str] = &[
    "Alice", "Bruno", "Chen", "Dana", "Emeka", "Fatima", "Grace", "Hiro", "Ingrid", "Jonas",
    "Kavya", "Lucas", "Mei", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tariq", "Uma",
    "Victor", "Wen", "Ximena", "Yusuf", "Zoe", "Marta", "Pablo", "Aiko", "Lena",
];

/// Last names.
pub const LAST_NAMES: &[&str] = &[
    "Smith",
    "Garcia",
    "Wang",
    "Müller",
    "Okafor",
    "Khan",
    "Rossi",
    "Tanaka",
    "Novak",
    "Silva",
    "Kowalski",
    "Nguyen",
    "Johansson",
    "Dubois",
    "Patel",
    "Kim",
    "Haddad",
    "Ivanova",
    "Brown",
    "Fischer",
    "Moreau",
    "Sato",
    "Lopez",
    "Andersen",
    "Cohen",
    "Schmidt",
    "Costa",
    "Yilmaz",
];

/// Cities, for addresses and prose.
pub const CITIES: &[&str] = &[
    "Berlin",
    "Lyon",
    "Osaka",
    "Toronto",
    "Austin",
    "Lisbon",
    "Nairobi",
    "Seoul",
    "Melbourne",
    "Porto",
    "Denver",
    "Krakow",
    "Singapore",
    "Bogotá",
    "Helsinki",
    "Chicago",
    "Milan",
    "Pune",
];

/// Products sold by the support agent's shop.
pub const PRODUCTS: &[&str] = &[
    "Wireless Earbuds Pro",
    "USB-C Charging Hub",
    "Ergonomic Office Chair",
    "4K Monitor 27\"",
    "Mechanical Keyboard (Brown switches)",
    "Stainless Water Bottle 750ml",
    "Trail Running Shoes",
    "Noise-Cancelling Headphones",
    "Smart Thermostat",
    "Cast Iron Skillet 12\"",
    "Yoga Mat",
    "Espresso Machine",
    "Laptop Sleeve 14\"",
    "LED Desk Lamp",
    "Portable SSD 1TB",
    "Backpack 28L",
    "Electric Toothbrush",
    "Air Purifier",
    "Phone Case (Clear)",
    "Bluetooth Speaker Mini",
];

/// Carriers for shipping lookups.
pub const CARRIERS: &[&str] = &["UPS", "DHL", "FedEx", "USPS", "DPD", "Royal Mail", "PostNL"];

/// Web domains for research sources.
pub const DOMAINS: &[&str] = &[
    "en.wikipedia.org",
    "arxiv.org",
    "www.nature.com",
    "www.iea.org",
    "ourworldindata.org",
    "www.reuters.com",
    "www.bbc.com",
    "docs.python.org",
    "doc.rust-lang.org",
    "github.com",
    "stackoverflow.com",
    "www.sciencedirect.com",
    "www.mckinsey.com",
    "www.oecd.org",
    "www.nytimes.com",
    "medium.com",
    "news.ycombinator.com",
    "www.theverge.com",
    "www.nist.gov",
    "zh.wikipedia.org",
    "www.nikkei.com",
    "blog.cloudflare.com",
    "www.brookings.edu",
];

/// Research topics: (short name, phrase used in questions and titles).
pub const TOPICS: &[(&str, &str)] = &[
    ("batteries", "grid-scale battery storage"),
    ("heat-pumps", "heat pump adoption in cold climates"),
    ("rust-async", "async runtimes in Rust"),
    ("llm-context", "long-context language models"),
    ("coffee", "the economics of specialty coffee"),
    ("ev-charging", "public EV charging networks"),
    ("sleep", "sleep and memory consolidation"),
    ("desalination", "seawater desalination costs"),
    ("microplastics", "microplastics in drinking water"),
    ("remote-work", "remote work and productivity"),
    ("fusion", "private fusion energy startups"),
    ("semiconductors", "semiconductor supply chains"),
];

/// Sentences in Chinese, Japanese and Korean, for pages and customers that are not English.
pub const CJK: &[&str] = &[
    "储能系统的成本在过去十年中下降了大约百分之九十。",
    "研究人员认为，电网规模的电池可以在用电高峰时段提供稳定的电力。",
    "这项技术仍然面临原材料供应和回收利用方面的挑战。",
    "根据最新的统计数据，全国新增装机容量同比增长了百分之三十五。",
    "专家指出，政策支持是推动市场发展的关键因素之一。",
    "我的订单已经一个星期了还没有发货，请帮我查一下。",
    "请问可以改成寄到公司地址吗？",
    "此外，城市交通的电动化也在加快推进。",
    "数据显示，用户满意度在第三季度明显提高。",
    "蓄電池の価格は年々下がっており、導入が進んでいます。",
    "この研究では、睡眠中の記憶の定着について調べました。",
    "注文した商品がまだ届いていません。確認していただけますか。",
    "東京の平均気温は過去百年で約三度上昇しました。",
    "多くの企業がリモートワークを継続しています。",
    "배터리 가격은 지난 10년 동안 크게 하락했습니다.",
    "주문한 상품이 아직 도착하지 않았어요.",
    "연구진은 새로운 방법이 효율을 높일 수 있다고 밝혔다.",
];

/// Emoji as they appear in pages, chats and commit messages.
pub const EMOJI: &[&str] = &[
    "🚀", "✅", "⚠️", "🔥", "👍", "📦", "🎉", "💡", "🐛", "❤️", "😊", "🙏", "📈", "🌍", "⚡", "🔋",
    "☕", "🛠️", "📉", "🤔",
];

/// The plural of a regular English noun.
pub fn plural(noun: &str) -> String {
    match noun.strip_suffix('y') {
        Some(stem) if !stem.ends_with(['a', 'e', 'o', 'u']) => format!("{stem}ies"),
        _ if noun.ends_with('s') || noun.ends_with("sh") || noun.ends_with("ch") => {
            format!("{noun}es")
        }
        _ => format!("{noun}s"),
    }
}

/// The third-person singular of a regular English verb.
pub fn third_person(verb: &str) -> String {
    plural(verb)
}

/// The past tense of a regular English verb.
pub fn past(verb: &str) -> String {
    if verb.ends_with('e') {
        format!("{verb}d")
    } else {
        format!("{verb}ed")
    }
}

/// "a" or "an" before `word`.
pub fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// A word from `WORDS`.
pub fn word(rng: &mut Rng) -> &'static str {
    rng.pick(WORDS)
}

/// A `snake_case` identifier of two or three parts.
pub fn snake(rng: &mut Rng) -> String {
    let mut s = String::new();
    if rng.chance(30) {
        s.push_str(rng.pick(ADJECTIVES));
        s.push('_');
    }
    s.push_str(rng.pick(NOUNS));
    if rng.chance(40) {
        s.push('_');
        s.push_str(rng.pick(NOUNS));
    }
    s
}

/// A `verb_noun` function name.
pub fn fn_name(rng: &mut Rng) -> String {
    format!("{}_{}", rng.pick(VERBS), rng.pick(NOUNS))
}

/// An `UpperCamelCase` type name of one or two parts.
pub fn camel(rng: &mut Rng) -> String {
    let mut s = capitalize(rng.pick(NOUNS));
    if rng.chance(60) {
        s.push_str(&capitalize(rng.pick(NOUNS)));
    }
    s
}

/// `word` with its first letter in upper case.
pub fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// "First Last".
pub fn person(rng: &mut Rng) -> String {
    format!("{} {}", rng.pick(FIRST_NAMES), rng.pick(LAST_NAMES))
}

/// A wall-clock instant in whole milliseconds since the Unix epoch, for logs and records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instant(pub u64);

impl Instant {
    /// Some moment in 2024 or 2025.
    pub fn random(rng: &mut Rng) -> Instant {
        const START_2024_MS: u64 = 1_704_067_200_000;
        Instant(START_2024_MS + rng.below(730 * 86_400_000))
    }

    /// This instant plus `ms` milliseconds.
    pub fn plus_ms(self, ms: u64) -> Instant {
        Instant(self.0 + ms)
    }

    /// `YYYY-MM-DD`.
    pub fn date(self) -> String {
        let (y, m, d) = civil_from_days((self.0 / 86_400_000) as i64);
        format!("{y:04}-{m:02}-{d:02}")
    }

    /// `YYYY-MM-DDTHH:MM:SSZ`.
    pub fn iso(self) -> String {
        let secs = (self.0 / 1000) % 86_400;
        format!(
            "{}T{:02}:{:02}:{:02}Z",
            self.date(),
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    pub fn iso_ms(self) -> String {
        let secs = (self.0 / 1000) % 86_400;
        format!(
            "{}T{:02}:{:02}:{:02}.{:03}Z",
            self.date(),
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            self.0 % 1000
        )
    }

    /// `Mon DD HH:MM`, as `ls -l` shows it.
    pub fn ls(self) -> String {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let (_, m, d) = civil_from_days((self.0 / 86_400_000) as i64);
        let secs = (self.0 / 1000) % 86_400;
        format!(
            "{} {:>2} {:02}:{:02}",
            MONTHS[(m - 1) as usize],
            d,
            secs / 3600,
            secs / 60 % 60
        )
    }
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_calendar_dates() {
        assert_eq!(Instant(0).iso(), "1970-01-01T00:00:00Z");
        assert_eq!(Instant(1_709_164_800_000).date(), "2024-02-29");
        assert_eq!(
            Instant(1_735_689_599_999).iso_ms(),
            "2024-12-31T23:59:59.999Z"
        );
        assert_eq!(Instant(1_710_411_720_000).ls(), "Mar 14 10:22");
    }

    #[test]
    fn identifiers_are_well_formed() {
        let mut rng = Rng::new(1);
        for _ in 0..100 {
            let s = snake(&mut rng);
            assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
            let c = camel(&mut rng);
            assert!(c.starts_with(|ch: char| ch.is_ascii_uppercase()), "{c}");
        }
        assert_eq!(capitalize("émile"), "Émile");
        assert_eq!(plural("study"), "studies");
        assert_eq!(plural("survey"), "surveys");
        assert_eq!(plural("process"), "processes");
        assert_eq!(third_person("reduce"), "reduces");
        assert_eq!(past("boost"), "boosted");
        assert_eq!(article("engine"), "an");
    }
}
