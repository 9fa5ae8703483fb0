//! Tests of what is particular to the fs backend: the tree a person reads, atomic writes, crash
//! leftovers, tampered files, sweeping, permissions. The behaviour every backend shares is in
//! `conformance.rs`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::store::ManualClock;

const DAY: Duration = Duration::from_secs(86_400);

struct Fixture {
    store: FsStore,
    clock: Arc<ManualClock>,
    dir: tempfile::TempDir,
    tenant: Tenant,
    session: SessionId,
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(SystemTime::now()));
        let cfg = StoreConfig {
            path: dir.path().join("data"),
            ..StoreConfig::default()
        };
        let store = FsStore::open(&cfg, clock.clone()).await.unwrap();
        // The tests sweep when they choose to, not when the background task does.
        store.close().await;
        Fixture {
            store,
            clock,
            dir,
            tenant: Tenant::from_api_key(Some("sk-test")),
            session: SessionId::parse("s1").unwrap(),
        }
    }

    fn tenant_dir(&self) -> PathBuf {
        self.store.root().join(self.tenant.as_str())
    }

    fn session_dir(&self) -> PathBuf {
        self.tenant_dir().join(self.session.as_str())
    }

    async fn put(&self, content: &str) -> ContentRef {
        self.store
            .put_content(
                &self.tenant,
                &self.session,
                ContentKind::ToolResult,
                content,
            )
            .await
            .unwrap()
    }
}

/// Every file under `dir`, as paths relative to it, sorted.
fn files(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}

#[tokio::test]
async fn the_tree_is_human_readable() {
    let f = Fixture::new().await;
    let r = f.put("the whole tool result\n").await;
    let m = f
        .store
        .put_content(&f.tenant, &f.session, ContentKind::Messages, "[]")
        .await
        .unwrap();
    let record = serde_json::json!({"event": "offload", "ref": r.as_str()});
    f.store
        .append_log(&f.tenant, &f.session, &record)
        .await
        .unwrap();
    let multiline = serde_json::json!({"summary": "one\ntwo\r\n\u{4e2d}"});
    f.store
        .append_log(&f.tenant, &f.session, &multiline)
        .await
        .unwrap();
    let key = StateKey::parse("compact-abc").unwrap();
    f.store
        .put_state(&f.tenant, &f.session, &key, b"{\"upto\":3}")
        .await
        .unwrap();

    let tenant = f.tenant.as_str();
    let mut expected = [
        format!("{tenant}/_refs/{m}"),
        format!("{tenant}/_refs/{r}"),
        format!("{tenant}/s1/context.jsonl"),
        format!("{tenant}/s1/messages-{m}.json"),
        format!("{tenant}/s1/state/compact-abc"),
        format!("{tenant}/s1/tool_result-{r}.txt"),
    ];
    expected.sort();
    assert_eq!(files(f.store.root()), expected);
    let read = |p: PathBuf| fs::read_to_string(p).unwrap();
    assert_eq!(
        read(f.session_dir().join(format!("tool_result-{r}.txt"))),
        "the whole tool result\n"
    );
    assert_eq!(
        read(f.tenant_dir().join("_refs").join(r.as_str())),
        format!("s1/tool_result-{r}.txt\n")
    );
    let journal = read(f.session_dir().join("context.jsonl"));
    let first = format!("{{\"event\":\"offload\",\"ref\":\"{r}\"}}\n");
    assert!(journal.starts_with(&first), "{journal}");
    let lines: Vec<serde_json::Value> = journal
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines, [record, multiline]);
    assert_eq!(
        read(f.session_dir().join("state/compact-abc")),
        "{\"upto\":3}"
    );

    let anonymous = Tenant::from_api_key(None);
    f.store
        .put_content(&anonymous, &f.session, ContentKind::UserText, "hi")
        .await
        .unwrap();
    let r = ContentRef::of("hi");
    assert!(f
        .store
        .root()
        .join(format!("anonymous/s1/user_text-{r}.txt"))
        .is_file());
}

#[tokio::test]
async fn content_is_written_once_across_sessions() {
    let f = Fixture::new().await;
    let r = f.put("same").await;
    let path = f.session_dir().join(format!("tool_result-{r}.txt"));
    let before = fs::metadata(&path).unwrap();
    let other = SessionId::parse("s2").unwrap();
    let again = f
        .store
        .put_content(&f.tenant, &other, ContentKind::ToolResult, "same")
        .await
        .unwrap();
    assert_eq!(again, r);
    assert!(!f.tenant_dir().join("s2").exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(&path).unwrap().ino(), before.ino());
    }
    let _ = before;
    assert_eq!(
        f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
        Some("same")
    );
}

#[tokio::test]
async fn writes_leave_no_temporary_files() {
    let f = Fixture::new().await;
    let key = StateKey::parse("k").unwrap();
    for i in 0..20 {
        f.put(&format!("content {i}")).await;
        f.store
            .put_state(&f.tenant, &f.session, &key, format!("{i}").as_bytes())
            .await
            .unwrap();
    }
    f.store.ping().await.unwrap();
    let all = files(f.store.root());
    assert!(all.iter().all(|p| !p.contains(TEMP_PREFIX)), "{all:?}");
}

#[tokio::test]
async fn concurrent_writers_leave_one_intact_file() {
    let f = Fixture::new().await;
    let store = Arc::new(f.store);
    let content = "中文 ".repeat(50_000);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (store, t, s, c) = (
            store.clone(),
            f.tenant.clone(),
            f.session.clone(),
            content.clone(),
        );
        tasks.push(tokio::spawn(async move {
            store.put_content(&t, &s, ContentKind::ToolResult, &c).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), ContentRef::of(&content));
    }
    let r = ContentRef::of(&content);
    let all = files(store.root());
    assert_eq!(all.len(), 2, "{all:?}");
    let on_disk = fs::read_to_string(
        store
            .root()
            .join(f.tenant.as_str())
            .join("s1")
            .join(format!("tool_result-{r}.txt")),
    )
    .unwrap();
    assert_eq!(on_disk, content);
}

#[tokio::test]
async fn a_crash_leftover_temporary_file_is_ignored_then_deleted() {
    let f = Fixture::new().await;
    let r = f.put("kept").await;
    // As if a crash struck mid-write: a half-written temporary file beside the real ones.
    let leftover = f.session_dir().join(format!("{TEMP_PREFIX}999999-0"));
    fs::write(&leftover, "ha").unwrap();
    let in_refs = f
        .tenant_dir()
        .join(REFS_DIR)
        .join(format!("{TEMP_PREFIX}1-1"));
    fs::write(&in_refs, "s1/../../x").unwrap();
    assert_eq!(
        f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
        Some("kept")
    );
    assert_eq!(f.store.sweep().await.unwrap(), 0);
    assert!(leftover.exists(), "too young to be a leftover");
    f.clock.advance(2 * TEMP_GRACE);
    assert_eq!(f.store.sweep().await.unwrap(), 2);
    assert!(!leftover.exists() && !in_refs.exists());
    assert_eq!(
        f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
        Some("kept")
    );
}

#[tokio::test]
async fn a_torn_journal_line_is_skipped_and_not_glued_to_the_next() {
    let f = Fixture::new().await;
    let one = serde_json::json!({"n": 1});
    let two = serde_json::json!({"n": 2});
    f.store
        .append_log(&f.tenant, &f.session, &one)
        .await
        .unwrap();
    let path = f.session_dir().join(LOG_FILE);
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"{\"n\": 9, \"torn").unwrap();
    drop(file);
    f.store
        .append_log(&f.tenant, &f.session, &two)
        .await
        .unwrap();
    assert_eq!(
        f.store.read_log(&f.tenant, &f.session).await.unwrap(),
        [one, two]
    );
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
}

#[tokio::test]
async fn a_tampered_pointer_cannot_lead_outside_the_root() {
    let f = Fixture::new().await;
    let secret = f.dir.path().join("secret.txt");
    fs::write(&secret, "secret").unwrap();
    let r = ContentRef::of("secret");
    let refs = f.tenant_dir().join(REFS_DIR);
    fs::create_dir_all(&refs).unwrap();
    for pointer in [
        "../../secret.txt\n",
        "s1/../../../secret.txt\n",
        &format!("{}\n", secret.display()),
        &format!("../s1/tool_result-{r}.txt\n"),
        &format!("s1/tool_result-{r}.txt/../../../../secret.txt\n"),
    ] {
        fs::write(refs.join(r.as_str()), pointer).unwrap();
        let err = f.store.get_content(&f.tenant, &r).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { .. }),
            "{pointer:?}: {err}"
        );
    }
}

#[tokio::test]
async fn content_edited_by_hand_is_reported_not_served() {
    let f = Fixture::new().await;
    let r = f.put("original").await;
    fs::write(
        f.session_dir().join(format!("tool_result-{r}.txt")),
        "edited",
    )
    .unwrap();
    let err = f.store.get_content(&f.tenant, &r).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    // Storing it again repairs it.
    f.put("original").await;
    assert_eq!(
        f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
        Some("original")
    );
    // An edit that keeps the size is caught on reading too.
    fs::write(
        f.session_dir().join(format!("tool_result-{r}.txt")),
        "ORIGINAL",
    )
    .unwrap();
    assert!(f.store.get_content(&f.tenant, &r).await.is_err());
    f.put("original").await;
    assert_eq!(
        f.store.get_content(&f.tenant, &r).await.unwrap().as_deref(),
        Some("original")
    );
}

#[tokio::test]
async fn the_sweeper_deletes_expired_files_and_empty_directories() {
    let f = Fixture::new().await;
    let old = f.put("old").await;
    let record = serde_json::json!({"n": 1});
    f.store
        .append_log(&f.tenant, &f.session, &record)
        .await
        .unwrap();
    let key = StateKey::parse("k").unwrap();
    f.store
        .put_state(&f.tenant, &f.session, &key, b"v")
        .await
        .unwrap();
    let other = SessionId::parse("s2").unwrap();
    f.clock.advance(20 * DAY);
    let young = f
        .store
        .put_content(&f.tenant, &other, ContentKind::ToolResult, "young")
        .await
        .unwrap();
    let unknown = f.session_dir().join("notes.md");
    fs::write(&unknown, "a person's notes").unwrap();
    f.clock.advance(15 * DAY);
    // content + pointer, journal, state record.
    assert_eq!(f.store.sweep().await.unwrap(), 4);
    let tenant = f.tenant.as_str();
    assert_eq!(
        files(f.store.root()),
        [
            format!("{tenant}/_refs/{young}"),
            format!("{tenant}/s1/notes.md"),
            format!("{tenant}/s2/tool_result-{young}.txt"),
        ]
    );
    assert!(!f.session_dir().join(STATE_DIR).exists());
    assert_eq!(f.store.get_content(&f.tenant, &old).await.unwrap(), None);
    fs::remove_file(unknown).unwrap();
    f.clock.advance(31 * DAY);
    assert_eq!(f.store.sweep().await.unwrap(), 2);
    assert!(files(f.store.root()).is_empty());
    assert!(!f.tenant_dir().exists());
    assert!(f.store.root().is_dir());
}

#[tokio::test]
async fn open_fails_clearly_when_the_path_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    fs::write(&path, "").unwrap();
    let cfg = StoreConfig {
        path: path.clone(),
        ..StoreConfig::default()
    };
    let err = FsStore::open(&cfg, Arc::new(crate::store::SystemClock))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn close_stops_the_sweeper_and_the_store_keeps_working() {
    let f = Fixture::new().await;
    f.store.close().await;
    f.put("still works").await;
}

#[cfg(unix)]
#[tokio::test]
async fn files_and_directories_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new().await;
    let r = f.put("private").await;
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&f.session_dir()), 0o700);
    assert_eq!(
        mode(&f.session_dir().join(format!("tool_result-{r}.txt"))),
        0o600
    );
}
