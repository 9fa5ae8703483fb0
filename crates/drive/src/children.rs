//! The mock upstream and the proxy as child processes of the current executable (the
//! `context-proxy` binary, whose subcommands these tools are), each killed when its guard is
//! dropped. A child is ready once it has printed its `… listening on http://ADDR` line.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

/// A child process that is killed when dropped.
pub struct ChildGuard(Child);

impl ChildGuard {
    /// The child's process id (for its CPU time and memory in `/proc`).
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `args` on the current executable and reads the `… listening on http://ADDR` line.
pub fn spawn_self(args: &[&str]) -> std::io::Result<(ChildGuard, SocketAddr)> {
    spawn(&std::env::current_exe()?, args)
}

/// Starts `exe` with `args` and reads the `… listening on http://ADDR` line.
fn spawn(exe: &std::path::Path, args: &[&str]) -> std::io::Result<(ChildGuard, SocketAddr)> {
    let mut child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected first line {line:?}")))?;
    Ok((guard, addr))
}

/// Starts the proxy: `exe` with `args`, or this executable when `exe` is `None`.
pub fn spawn_proxy(
    exe: Option<&std::path::Path>,
    args: &[&str],
) -> std::io::Result<(ChildGuard, SocketAddr)> {
    match exe {
        Some(exe) => spawn(exe, args),
        None => spawn_self(args),
    }
}
