//! One rebuild: a follower wiped and restarted (and, for the second, SIGKILLed part-way
//! through the install), measured from before the wipe until its replica is caught up and
//! every replica reads the same.

use anyhow::{Context as _, bail};
use tokio::time::Instant;
use tributary_client::Client;

use super::memory::MemorySampler;
use super::replicas::{self, IDENTICAL_TIMEOUT, await_identical, await_settled, cluster_status};
use super::report::{self, RebuildRecord};
use super::sends::{PacedSends, Window};
use super::{
    HUB, INSTALLED_METRIC, KILL_AT_RECEIVED_SHARE, PARTITION, POLL_INTERVAL, PROGRESS_INTERVAL,
    READY_TIMEOUT, RECEIVED_METRIC, RebuildArgs, SENT_METRIC, node_index,
};
use crate::local_cluster::LocalCluster;
use crate::metrics;

/// What every rebuild needs: the cluster, a client per node, the memory sampler and the
/// partition as filled.
pub(super) struct Bench<'a> {
    pub(super) args: &'a RebuildArgs,
    pub(super) cluster: &'a mut LocalCluster,
    pub(super) clients: Vec<Client>,
    pub(super) sampler: MemorySampler,
    pub(super) partition_bytes: u64,
}

impl Bench<'_> {
    /// Wipes a follower and measures its rebuild (`number` counts from 1); with `kill`, the
    /// node is SIGKILLed part-way through the install and restarted.
    pub(super) async fn rebuild(
        &mut self,
        number: usize,
        kill: bool,
    ) -> anyhow::Result<RebuildRecord> {
        let leader_node = await_settled(&self.clients[0]).await?;
        let leader = node_index(self.cluster, leader_node)?;
        // The rebuilds take the followers in turn.
        let followers: Vec<usize> = (0..self.cluster.nodes.len())
            .filter(|i| *i != leader)
            .collect();
        let victim = followers[(number - 1) % followers.len()];
        let victim_node = self.cluster.nodes[victim].id;
        eprintln!(
            "rebuild {number}: {} of paced sends and memory before wiping node {victim_node} \
             (node {leader_node} leads)...",
            humantime::format_duration(self.args.baseline)
        );
        let sends = PacedSends::start(
            &self.clients[leader],
            HUB,
            PARTITION,
            self.args.sends_per_second,
        );
        self.sampler.take_max();
        // A measurement window, not a wait for a condition.
        tokio::time::sleep(self.args.baseline).await;
        let rss_before = self.sampler.take_max();
        sends.enter(Window::During);
        let leader_metrics = self.cluster.nodes[leader].metrics_url();
        let sent_at_wipe = read_counter(&leader_metrics, SENT_METRIC).await.ok();

        self.wipe(victim).await?;
        let restarted = Instant::now();
        let deadline = restarted + self.args.rebuild_timeout;
        self.restart(victim).await?;
        eprintln!("rebuild {number}: node {victim_node} wiped and restarted");
        let (killed_at_received_share, received_before_kill) = if kill {
            let received = self.kill_mid_install(victim, deadline).await?;
            let share = received as f64 / self.partition_bytes as f64;
            (Some(share), received)
        } else {
            (None, 0)
        };
        let snapshots_installed = self.await_rebuilt(leader, victim, deadline).await?;
        let rebuild_time = restarted.elapsed();
        let rss_during = self.sampler.take_max();
        let (sends_before, sends_during, last_send_error) = sends.finish().await;
        if let Some(error) = last_send_error {
            eprintln!("rebuild {number}: a paced send failed (and was retried): {error}");
        }
        // The node counts what it received since its last start.
        let received = read_counter(&self.cluster.nodes[victim].metrics_url(), RECEIVED_METRIC)
            .await
            .ok()
            .flatten()
            .map(|r| r + received_before_kill);
        let sent = read_counter(&leader_metrics, SENT_METRIC)
            .await
            .ok()
            .flatten()
            .map(|after| after.saturating_sub(sent_at_wipe.flatten().unwrap_or(0)));
        eprintln!(
            "rebuild {number}: node {victim_node} caught up after {:.1}s; comparing the replicas...",
            rebuild_time.as_secs_f64()
        );
        let identical = self.compare_replicas(number).await;
        let mib = |bytes: &[Option<u64>], index: usize| report::to_mib(bytes[index]);
        Ok(RebuildRecord {
            rebuilt_node: victim_node,
            leader_node,
            killed_mid_install: kill,
            killed_at_received_share,
            rebuild_seconds: rebuild_time.as_secs_f64(),
            throughput_mb_per_second: self.partition_bytes as f64
                / 1e6
                / rebuild_time.as_secs_f64().max(f64::EPSILON),
            bytes_sent: sent,
            bytes_received: received,
            snapshots_installed,
            leader_rss_before_mib: mib(&rss_before, leader),
            leader_rss_during_mib: mib(&rss_during, leader),
            rebuilt_rss_before_mib: mib(&rss_before, victim),
            rebuilt_rss_during_mib: mib(&rss_during, victim),
            sends_before,
            sends_during,
            replicas_identical: identical,
        })
    }

    /// Whether every replica reads the same events (waiting for them to agree), with a
    /// line saying so.
    async fn compare_replicas(&self, number: usize) -> bool {
        match await_identical(&self.clients).await {
            Ok(contents) => {
                eprintln!(
                    "rebuild {number}: the replicas are identical: {} events",
                    contents.summary.count
                );
                true
            }
            Err(last) => {
                eprintln!(
                    "rebuild {number}: the replicas are NOT identical after {}: {last}",
                    humantime::format_duration(IDENTICAL_TIMEOUT)
                );
                false
            }
        }
    }

    /// SIGKILLs node `index` and empties its data directory: it comes back as a new
    /// member with nothing.
    async fn wipe(&mut self, index: usize) -> anyhow::Result<()> {
        self.cluster.kill(index)?;
        self.sampler.set_pid(index, None);
        self.cluster.reap(index).await?;
        let dir = self.cluster.nodes[index].data_dir().to_path_buf();
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot list {}", dir.display()))?
                .path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.with_context(|| format!("cannot delete {}", path.display()))?;
        }
        Ok(())
    }

    /// Waits until node `index` is part-way through the install, SIGKILLs it and starts it
    /// again; returns the bytes it had received.
    async fn kill_mid_install(&mut self, index: usize, deadline: Instant) -> anyhow::Result<u64> {
        let received = self.await_received_share(index, deadline).await?;
        eprintln!(
            "    node {} has received {:.0}% of the partition without installing it: SIGKILL, \
             restart",
            self.cluster.nodes[index].id,
            received as f64 / self.partition_bytes as f64 * 100.0
        );
        self.cluster.kill(index)?;
        self.sampler.set_pid(index, None);
        self.cluster.reap(index).await?;
        self.restart(index).await?;
        Ok(received)
    }

    async fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        self.cluster.restart(index, READY_TIMEOUT).await?;
        self.sampler.set_pid(index, self.cluster.nodes[index].pid());
        Ok(())
    }

    /// Waits until node `index` has received [`KILL_AT_RECEIVED_SHARE`] of the partition's
    /// bytes while it has installed no snapshot; returns the bytes received.
    async fn await_received_share(
        &mut self,
        index: usize,
        deadline: Instant,
    ) -> anyhow::Result<u64> {
        let node = self.cluster.nodes[index].id;
        let url = self.cluster.nodes[index].metrics_url();
        let wanted = (self.partition_bytes as f64 * KILL_AT_RECEIVED_SHARE) as u64;
        loop {
            self.cluster.check_running()?;
            let page = metrics::http_get(&url).await;
            let (received, installed) = match &page {
                Ok(page) => (
                    metrics::counter_sum(page, RECEIVED_METRIC).map(|r| r as u64),
                    metrics::counter_sum(page, INSTALLED_METRIC).map_or(0, |i| i as u64),
                ),
                Err(_) => (None, 0),
            };
            let seen = || {
                format!(
                    "{RECEIVED_METRIC} {}, {INSTALLED_METRIC} {installed}",
                    received.map_or_else(|| "absent".to_owned(), |r| r.to_string())
                )
            };
            if installed > 0 {
                let why = if received.is_none() {
                    format!(
                        "this build does not count the bytes a rebuild receives ({RECEIVED_METRIC})"
                    )
                } else {
                    "the install was too quick to catch: lower --rebuild-bytes-per-second or \
                     raise --gigabytes"
                        .to_owned()
                };
                bail!(
                    "node {node} installed the snapshot before it had received {:.0}% of the \
                     partition ({}): {why}",
                    KILL_AT_RECEIVED_SHARE * 100.0,
                    seen()
                );
            }
            if let Some(received) = received
                && received >= wanted
            {
                return Ok(received);
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {node} did not receive {:.0}% of the partition ({wanted} bytes) within \
                     --rebuild-timeout {}; last seen: {}{}",
                    KILL_AT_RECEIVED_SHARE * 100.0,
                    humantime::format_duration(self.args.rebuild_timeout),
                    seen(),
                    page.err().map_or_else(String::new, |e| format!(" ({e:#})"))
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until node `victim`'s replica is rebuilt: the cluster status (from the node
    /// at `leader`) shows it a caught-up voter, and it installed a snapshot since it last
    /// started. Returns the snapshots it installed. Prints progress now and then.
    async fn await_rebuilt(
        &mut self,
        leader: usize,
        victim: usize,
        deadline: Instant,
    ) -> anyhow::Result<u64> {
        let node = self.cluster.nodes[victim].id;
        let url = self.cluster.nodes[victim].metrics_url();
        let started = Instant::now();
        let mut next_progress = started + PROGRESS_INTERVAL;
        loop {
            self.cluster.check_running()?;
            let page = metrics::http_get(&url).await;
            let status = cluster_status(&self.clients[leader]).await;
            let last = match (&status, &page) {
                (Ok(status), Ok(page)) => {
                    let installed =
                        metrics::counter_sum(page, INSTALLED_METRIC).map_or(0, |i| i as u64);
                    let received = metrics::counter_sum(page, RECEIVED_METRIC)
                        .map_or_else(|| "absent".to_owned(), |r| format!("{r:.0}"));
                    let counters =
                        format!("{INSTALLED_METRIC} {installed}, {RECEIVED_METRIC} {received}");
                    match replicas::rebuilt(status, HUB, PARTITION, node) {
                        Ok(()) if installed > 0 => return Ok(installed),
                        Ok(()) => format!(
                            "node {node} is caught up but installed no snapshot ({counters}): \
                             it caught up from the log"
                        ),
                        Err(why) => format!("{why} ({counters})"),
                    }
                }
                (Err(error), _) => format!("{error:#}"),
                (_, Err(error)) => format!("{error:#}"),
            };
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    "node {node}'s replica was not rebuilt within --rebuild-timeout {}; last \
                     seen: {last}",
                    humantime::format_duration(self.args.rebuild_timeout)
                );
            }
            if now >= next_progress {
                eprintln!(
                    "    {:.0}s: {last}",
                    now.duration_since(started).as_secs_f64()
                );
                next_progress = now + PROGRESS_INTERVAL;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// The counter `name` on the metrics page at `url` (`None`: the node does not show it).
async fn read_counter(url: &str, name: &str) -> anyhow::Result<Option<u64>> {
    let page = metrics::http_get(url).await?;
    Ok(metrics::counter_sum(&page, name).map(|value| value as u64))
}
