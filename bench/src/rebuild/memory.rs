//! Sampling the nodes' resident memory: every [`SAMPLE_INTERVAL`] a task reads `VmRSS`
//! from `/proc/<pid>/status` of each node process and keeps each node's highest figure
//! since the bench last took them (one window: the fill, before a wipe, during a rebuild).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

/// How often every node's resident memory is read.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The running sampler; it stops when dropped.
pub(crate) struct MemorySampler {
    shared: Arc<Mutex<Shared>>,
    task: JoinHandle<()>,
}

/// Per node (by index): its process id while it runs, and its highest resident bytes in
/// the current window.
struct Shared {
    pids: Vec<Option<u32>>,
    max_bytes: Vec<Option<u64>>,
}

impl MemorySampler {
    /// Starts sampling the processes `pids` (by node index; `None`: not running).
    pub(crate) fn start(pids: Vec<Option<u32>>) -> MemorySampler {
        let shared = Arc::new(Mutex::new(Shared {
            max_bytes: vec![None; pids.len()],
            pids,
        }));
        let task = tokio::spawn(sample(shared.clone()));
        MemorySampler { shared, task }
    }

    /// Follows a node whose process changed (killed: `None`, restarted: its new pid).
    pub(crate) fn set_pid(&self, index: usize, pid: Option<u32>) {
        self.shared.lock().expect("sampler lock").pids[index] = pid;
    }

    /// Each node's highest resident bytes since the last call (`None`: never read), and
    /// starts a new window.
    pub(crate) fn take_max(&self) -> Vec<Option<u64>> {
        let mut shared = self.shared.lock().expect("sampler lock");
        let count = shared.max_bytes.len();
        std::mem::replace(&mut shared.max_bytes, vec![None; count])
    }
}

impl Drop for MemorySampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn sample(shared: Arc<Mutex<Shared>>) {
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let pids = shared.lock().expect("sampler lock").pids.clone();
        // procfs answers from memory: reading it does not block on a disk.
        let readings: Vec<Option<u64>> = pids.iter().map(|pid| pid.and_then(rss_bytes)).collect();
        shared
            .lock()
            .expect("sampler lock")
            .record(&pids, &readings);
    }
}

impl Shared {
    /// Keeps the highest of each node's `readings`, taken of the processes `pids`.
    fn record(&mut self, pids: &[Option<u32>], readings: &[Option<u64>]) {
        for (index, reading) in readings.iter().enumerate() {
            // A node restarted since the read belongs to the next sample.
            if self.pids[index] != pids[index] {
                continue;
            }
            if let Some(bytes) = *reading {
                let max = &mut self.max_bytes[index];
                *max = Some(max.map_or(bytes, |m| m.max(bytes)));
            }
        }
    }
}

/// The resident memory of process `pid`, or `None` if it cannot be read (gone, or no
/// procfs).
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// `VmRSS:    123456 kB` in a `/proc/<pid>/status` text, in bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_bytes() {
        let status = "Name:\ttributary\nVmPeak:\t  900000 kB\nVmRSS:\t  204800 kB\nThreads:\t9\n";
        assert_eq!(parse_vm_rss(status), Some(200 * 1024 * 1024));
        assert_eq!(
            parse_vm_rss("Name:\tkthreadd\n"),
            None,
            "kernel threads have none"
        );
        assert_eq!(parse_vm_rss("VmRSS:\t12 pages\n"), None);
    }

    #[test]
    fn keeps_the_highest_figure_of_each_process_it_still_follows() {
        let mut shared = Shared {
            pids: vec![Some(10), Some(20), None],
            max_bytes: vec![None; 3],
        };
        let pids = shared.pids.clone();
        shared.record(&pids, &[Some(5), Some(7), None]);
        shared.record(&pids, &[Some(9), Some(3), None]);
        assert_eq!(shared.max_bytes, [Some(9), Some(7), None]);
        // Node 2 restarted while its old process was read: that reading is dropped.
        shared.pids[1] = Some(21);
        shared.record(&pids, &[Some(1), Some(100), None]);
        assert_eq!(shared.max_bytes, [Some(9), Some(7), None]);
    }

    #[test]
    fn reads_this_process() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(rss_bytes(std::process::id()).is_some_and(|b| b > 0));
        }
    }
}
