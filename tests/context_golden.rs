//! The golden corpus: every request of the sample traffic (`gen-traffic`'s default corpus,
//! generated here), replayed session by session through the context manager in every mode, as
//! the proxy replays a conversation (one manager per session and mode, decisions carried from
//! request to request in its store), and the SHA-256 of each body it would forward compared
//! with `tests/fixtures/context_golden.txt`.
//!
//! It pins what the manager forwards byte for byte, so a change meant to be behaviour-neutral
//! (a refactoring of the engine, another model under it) proves it is. A change of behaviour
//! rewrites the file on purpose: `GOLDEN_BLESS=1 cargo test --test context_golden`, and the
//! diff shows which sessions, modes and requests changed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use context_proxy::context::{ContextConfig, ContextManager, Mode};
use context_proxy::corpus::Session;
use context_proxy::store::{Backend, Store, StoreConfig, Tenant};
use context_proxy::tokens::{CountSettings, Counter, Encoding};
use context_proxy::traffic::{generate, TrafficConfig};
use sha2::{Digest, Sha256};

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/context_golden.txt"
);

/// What the file says of a request forwarded as the client sent it.
const UNCHANGED: &str = "unchanged";

const MODES: [Mode; 4] = [Mode::Off, Mode::Compact, Mode::Compress, Mode::Auto];

/// `(session, mode, request)` → the SHA-256 of the forwarded body, in hex.
type Hashes = BTreeMap<(String, &'static str, usize), String>;

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Off => "off",
        Mode::Compact => "compact",
        Mode::Compress => "compress",
        Mode::Auto => "auto",
    }
}

async fn manager() -> ContextManager {
    let store_cfg = StoreConfig {
        backend: Backend::Memory,
        ..StoreConfig::default()
    };
    let store: Arc<dyn Store> = context_proxy::store::open(&store_cfg)
        .await
        .expect("memory store");
    let counter = Counter::new(Encoding::O200kBase, CountSettings::default());
    ContextManager::new(ContextConfig::default(), counter, store)
}

/// Every request of `session` in `mode`, through one manager, as the proxy would forward it.
async fn replay(session: &Session, mode: Mode, out: &mut Hashes) {
    let manager = manager().await;
    let tenant = Tenant::from_api_key(Some(&format!("sk-golden-{}", session.id)));
    for k in 0..session.request_count() {
        let mut body = session.request(k);
        let managed = manager
            .manage(&tenant, Some(&session.id), &mut body, mode, None)
            .await;
        // A body the manager leaves alone is forwarded as the client sent it.
        let forwarded = managed
            .body
            .as_deref()
            .map_or_else(|| UNCHANGED.to_string(), |b| hex(&Sha256::digest(b)));
        out.insert((session.id.clone(), mode_name(mode), k), forwarded);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The whole corpus in every mode: each (session, mode) is one job, longest sessions first,
/// taken by a few threads in turn.
fn corpus_hashes() -> Hashes {
    let sessions = generate(&TrafficConfig::default());
    let mut jobs: Vec<(&Session, Mode)> = sessions
        .iter()
        .flat_map(|s| MODES.map(|mode| (s, mode)))
        .collect();
    jobs.sort_by_key(|(s, _)| std::cmp::Reverse(s.messages.len()));
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let mut all = Hashes::new();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (jobs, next) = (&jobs, &next);
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    let mut out = Hashes::new();
                    while let Some(&(session, mode)) =
                        jobs.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        runtime.block_on(replay(session, mode, &mut out));
                    }
                    out
                })
            })
            .collect();
        for h in handles {
            all.extend(h.join().expect("replay thread"));
        }
    });
    all
}

fn render(hashes: &Hashes) -> String {
    let mut out = String::from(
        "# SHA-256 of every body the context manager forwards for the default sample corpus\n\
         # (tests/context_golden.rs): session mode request sha256. Rewrite: GOLDEN_BLESS=1.\n",
    );
    for ((session, mode, k), hash) in hashes {
        let _ = writeln!(out, "{session} {mode} {k} {hash}");
    }
    out
}

#[test]
fn the_corpus_is_forwarded_byte_for_byte_as_recorded() {
    let hashes = corpus_hashes();
    let requests = hashes.len() / MODES.len();
    assert!(requests > 100, "the corpus has {requests} requests");
    let now = render(&hashes);
    if std::env::var_os("GOLDEN_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(GOLDEN, &now).expect("write the golden file");
        return;
    }
    let recorded = std::fs::read_to_string(GOLDEN)
        .expect("tests/fixtures/context_golden.txt (make it with GOLDEN_BLESS=1)");
    let differ: Vec<(&str, &str)> = recorded
        .lines()
        .zip(now.lines())
        .filter(|(a, b)| a != b)
        .take(10)
        .collect();
    assert!(
        differ.is_empty() && recorded.lines().count() == now.lines().count(),
        "forwarded bodies differ from the golden file ({} lines recorded, {} now); first \
         differences (recorded / now):\n{}",
        recorded.lines().count(),
        now.lines().count(),
        differ
            .iter()
            .map(|(a, b)| format!("  {a}\n  {b}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
