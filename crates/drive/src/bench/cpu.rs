//! CPU time of the processes taking part in a run (Linux `/proc/<pid>/task/*/schedstat`, which
//! counts nanoseconds on the CPU per thread, user and kernel together). Dividing by the number
//! of requests says what each process spends on one request, which is what bounds throughput
//! when the machine's cores are the limit.

use std::time::Duration;

/// Time on the CPU so far of every live thread of `pid` (`None` when /proc cannot tell).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read: it then simply does not count.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(Duration::from_nanos(total))
}

/// The processes of the benchmark: this one (the load generator), the mock and the proxy.
#[derive(Debug, Clone, Copy)]
pub struct Processes {
    pub bench: u32,
    pub mock: u32,
    pub proxy: u32,
}

/// CPU time per request of each process over one run, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuPerRequest {
    pub bench_us: f64,
    pub mock_us: f64,
    pub proxy_us: f64,
}

impl CpuPerRequest {
    pub fn total_us(&self) -> f64 {
        self.bench_us + self.mock_us + self.proxy_us
    }
}

/// CPU times of the three processes at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot([Option<Duration>; 3]);

impl Processes {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot([
            cpu_time(self.bench),
            cpu_time(self.mock),
            cpu_time(self.proxy),
        ])
    }
}

impl Snapshot {
    /// What each process spent per request between `self` and `later`, over `requests`.
    pub fn per_request(&self, later: &Snapshot, requests: usize) -> CpuPerRequest {
        let us = |i: usize| match (self.0[i], later.0[i]) {
            (Some(a), Some(b)) if requests > 0 => {
                b.saturating_sub(a).as_secs_f64() * 1e6 / requests as f64
            }
            _ => f64::NAN,
        };
        CpuPerRequest {
            bench_us: us(0),
            mock_us: us(1),
            proxy_us: us(2),
        }
    }
}
