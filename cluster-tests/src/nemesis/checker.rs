//! The checker: judges a recorded [`History`] after the run. Pure: the history in, a
//! report out, so every rule is unit-tested on hand-made histories (below) and a run can be
//! judged again from its saved `history.json`.
//!
//! What it asserts, against the partitions as read back at the end (`History::finals`):
//! - every acknowledged event is stored exactly once, in its partition, at the sequence
//!   number and offset its acknowledgement gave (else lost, duplicated or misplaced);
//! - an unacknowledged (indeterminate) event is stored at most once; a batch is stored
//!   whole and contiguously, or not at all;
//! - nothing is stored that no producer sent;
//! - one producer's acknowledged batches to a partition are stored in the order it sent them;
//! - sequence numbers are gap-free from the first retained event, offsets grow;
//! - every plain reader saw a gap-free run of the final partition from its beginning: the
//!   same events in the same order, none of them later missing or changed;
//! - processors saw only stored events, without gaps within an ownership tenure, and between
//!   them skipped no event; two processors' tenures of one partition overlap at most by the
//!   hand-off bound;
//! - checkpoints never move back and always name a stored event;
//! - management calls took effect as answered;
//! - replicas of a partition are identical;
//! - every healed fault was followed by full availability within the recovery bound.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use super::history::{
    CallOutcome, Delivered, EventId, History, ManagementOp, Millis, SendOutcome, SendRecord,
};

/// The time bounds the checker holds the run to.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Longest two processors may both process one partition (the displacement hand-off).
    pub handoff_max_ms: u64,
    /// Longest from a fault's heal to full availability.
    pub recovery_max_ms: u64,
}

/// The kinds of violations, in the order the report lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    /// An acknowledged event is not stored.
    Lost,
    /// An event is stored more than once.
    Duplicated,
    /// An acknowledged event is stored elsewhere than its acknowledgement said.
    Misplaced,
    /// A batch is stored in part, or not contiguously.
    PartialBatch,
    /// A stored event no producer sent.
    Phantom,
    /// A producer's acknowledged batches are stored out of their order.
    Reordered,
    /// The stored sequence numbers have a gap or a repeat, or offsets do not grow.
    SequenceGap,
    /// A reader skipped or repeated events, or saw one the final partition does not have.
    ReaderDivergence,
    /// A processor saw an event the final partition does not have, or skipped events.
    ProcessorDivergence,
    /// Two processors began processing batches of one partition over a common stretch of time
    /// longer than the hand-off bound.
    ProcessorOverlap,
    /// A checkpoint moved back or named no stored event.
    CheckpointBackwards,
    /// A management call's effect differs from its answer.
    Management,
    /// Replicas of a partition differ.
    ReplicaDivergence,
    /// After a fault was healed, full availability took longer than the bound (or never came).
    SlowRecovery,
}

impl ViolationKind {
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::Lost => "lost",
            ViolationKind::Duplicated => "duplicated",
            ViolationKind::Misplaced => "misplaced",
            ViolationKind::PartialBatch => "partial batch",
            ViolationKind::Phantom => "phantom",
            ViolationKind::Reordered => "reordered",
            ViolationKind::SequenceGap => "sequence gap",
            ViolationKind::ReaderDivergence => "reader divergence",
            ViolationKind::ProcessorDivergence => "processor divergence",
            ViolationKind::ProcessorOverlap => "processor overlap",
            ViolationKind::CheckpointBackwards => "checkpoint",
            ViolationKind::Management => "management",
            ViolationKind::ReplicaDivergence => "replica divergence",
            ViolationKind::SlowRecovery => "slow recovery",
        }
    }
}

/// One broken rule, with what a person needs to find it in the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub detail: String,
}

/// The checker's findings and the run's figures.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Events whose send was acknowledged.
    pub acked_events: u64,
    /// Events whose send was never acknowledged.
    pub indeterminate_events: u64,
    /// Of those, how many are stored.
    pub indeterminate_stored: u64,
    /// Acknowledged events not stored.
    pub lost: u64,
    /// Events stored more than once (each extra copy counts).
    pub duplicated: u64,
    /// Pairs of one producer's acknowledged batches stored in the wrong order.
    pub reordered: u64,
    /// Events delivered to plain readers.
    pub delivered_events: u64,
    /// Events handed to processors.
    pub processed_events: u64,
    pub checkpoint_samples: u64,
    /// Longest two processors' tenures of one partition overlapped.
    pub max_handoff_ms: u64,
    /// Per fault kind, the longest time from a heal to full availability.
    pub max_recovery_ms: BTreeMap<String, u64>,
    /// Faults injected per kind.
    pub faults: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
}

impl CheckReport {
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty()
    }

    /// Violations per kind.
    pub fn counts(&self) -> BTreeMap<ViolationKind, usize> {
        let mut counts = BTreeMap::new();
        for v in &self.violations {
            *counts.entry(v.kind).or_default() += 1;
        }
        counts
    }

    /// The violations for a person: counts per kind, then the first `max_lines` details.
    pub fn render(&self, max_lines: usize) -> String {
        let mut out = String::new();
        if self.violations.is_empty() {
            out.push_str("  checker: no violations\n");
            return out;
        }
        let counts: Vec<String> = self
            .counts()
            .iter()
            .map(|(kind, n)| format!("{} {n}", kind.name()))
            .collect();
        let _ = writeln!(
            out,
            "  checker: {} violations ({})",
            self.violations.len(),
            counts.join(", ")
        );
        for v in self.violations.iter().take(max_lines) {
            let _ = writeln!(out, "    {}: {}", v.kind.name(), v.detail);
        }
        if self.violations.len() > max_lines {
            let _ = writeln!(
                out,
                "    ... and {} more (history.json in the run directory)",
                self.violations.len() - max_lines
            );
        }
        out
    }

    fn violation(&mut self, kind: ViolationKind, detail: String) {
        self.violations.push(Violation { kind, detail });
    }
}

/// Where an event is stored: partition, sequence number, offset.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    partition: String,
    sequence: i64,
    offset: i64,
}

/// Judges `history`.
pub fn check(history: &History, bounds: Bounds) -> CheckReport {
    let mut report = CheckReport::default();
    let finals: BTreeMap<&str, &[Delivered]> = history
        .finals
        .iter()
        .map(|f| (f.partition.as_str(), f.events.as_slice()))
        .collect();
    let stored = check_final_partitions(history, &mut report);
    check_sends(history, &stored, &mut report);
    check_readers(history, &finals, &mut report);
    check_processors(history, &finals, bounds, &mut report);
    check_checkpoints(history, &finals, &mut report);
    check_management(history, &mut report);
    check_faults(history, bounds, &mut report);
    report.violations.sort_by_key(|v| v.kind);
    report
}

/// Numbering of each final partition and replica agreement; returns where each event is.
fn check_final_partitions(
    history: &History,
    report: &mut CheckReport,
) -> HashMap<EventId, Vec<Stored>> {
    let sent: BTreeSet<EventId> = history
        .sends
        .iter()
        .flat_map(|s| s.events.iter().copied())
        .collect();
    let mut stored: HashMap<EventId, Vec<Stored>> = HashMap::new();
    for partition in &history.finals {
        let name = &partition.partition;
        for pair in partition.events.windows(2) {
            if pair[1].sequence != pair[0].sequence + 1 || pair[1].offset <= pair[0].offset {
                report.violation(
                    ViolationKind::SequenceGap,
                    format!(
                        "partition {name}: sequence {} (offset {}) is followed by sequence {} \
                         (offset {})",
                        pair[0].sequence, pair[0].offset, pair[1].sequence, pair[1].offset
                    ),
                );
            }
        }
        if let Some(first) = partition.events.first()
            && first.sequence != 0
        {
            report.violation(
                ViolationKind::SequenceGap,
                format!(
                    "partition {name}: the first event has sequence {} (nothing expires in a run)",
                    first.sequence
                ),
            );
        }
        for event in &partition.events {
            match event.id {
                Some(id) if sent.contains(&id) => stored.entry(id).or_default().push(Stored {
                    partition: name.clone(),
                    sequence: event.sequence,
                    offset: event.offset,
                }),
                Some(id) => report.violation(
                    ViolationKind::Phantom,
                    format!(
                        "partition {name} sequence {}: event {id} was never sent",
                        event.sequence
                    ),
                ),
                None => report.violation(
                    ViolationKind::Phantom,
                    format!(
                        "partition {name} sequence {}: a body no workload producer sent",
                        event.sequence
                    ),
                ),
            }
        }
        let count = partition.events.len() as u64;
        let digests: BTreeSet<&String> = partition.replicas.values().map(|(d, _)| d).collect();
        let counts_agree = partition.replicas.values().all(|(_, n)| *n == count);
        if partition.replicas.is_empty() {
            report.violation(
                ViolationKind::ReplicaDivergence,
                format!("partition {name}: no replica could be digested"),
            );
        } else if digests.len() > 1 || !counts_agree {
            let each: Vec<String> = partition
                .replicas
                .iter()
                .map(|(node, (digest, n))| format!("node {node}: {n} events, {digest}"))
                .collect();
            report.violation(
                ViolationKind::ReplicaDivergence,
                format!(
                    "partition {name}: {count} events read through the leader, replicas differ: \
                     {}",
                    each.join("; ")
                ),
            );
        }
    }
    stored
}

/// Every send against where its events are stored.
fn check_sends(
    history: &History,
    stored: &HashMap<EventId, Vec<Stored>>,
    report: &mut CheckReport,
) {
    // Acknowledged batches per (producer, partition), with where each batch's first event
    // is stored.
    let mut acked_order: BTreeMap<(u32, &str), Vec<(i64, &SendRecord)>> = BTreeMap::new();
    for send in &history.sends {
        let places: Vec<Option<&Stored>> = send
            .events
            .iter()
            .map(|id| {
                let found = stored.get(id).map_or(&[][..], Vec::as_slice);
                if found.len() > 1 {
                    report.duplicated += found.len() as u64 - 1;
                    let at: Vec<String> = found
                        .iter()
                        .map(|s| format!("{}@{}", s.partition, s.sequence))
                        .collect();
                    report.violation(
                        ViolationKind::Duplicated,
                        format!(
                            "event {id} of producer {} is stored {} times: {}",
                            send.producer,
                            found.len(),
                            at.join(", ")
                        ),
                    );
                }
                found.first()
            })
            .collect();
        check_batch_whole(send, &places, report);
        match &send.outcome {
            SendOutcome::Acked {
                first_sequence,
                offsets,
            } => {
                report.acked_events += send.events.len() as u64;
                for (i, (id, place)) in send.events.iter().zip(&places).enumerate() {
                    let want_sequence = first_sequence + i as i64;
                    let want_offset = offsets.get(i).copied().unwrap_or(-1);
                    match place {
                        None => {
                            report.lost += 1;
                            report.violation(
                                ViolationKind::Lost,
                                format!(
                                    "event {id} acknowledged at {} ms as partition {} sequence \
                                     {want_sequence} is not stored",
                                    send.acked_ms.unwrap_or_default(),
                                    send.partition
                                ),
                            );
                        }
                        Some(s)
                            if s.partition != send.partition
                                || s.sequence != want_sequence
                                || s.offset != want_offset =>
                        {
                            report.violation(
                                ViolationKind::Misplaced,
                                format!(
                                    "event {id} acknowledged as partition {} sequence \
                                     {want_sequence} offset {want_offset} is stored as \
                                     partition {} sequence {} offset {}",
                                    send.partition, s.partition, s.sequence, s.offset
                                ),
                            );
                        }
                        Some(_) => {}
                    }
                }
                if let Some(Some(first)) = places.first() {
                    acked_order
                        .entry((send.producer, send.partition.as_str()))
                        .or_default()
                        .push((first.sequence, send));
                }
            }
            SendOutcome::Indeterminate { .. } => {
                report.indeterminate_events += send.events.len() as u64;
                report.indeterminate_stored += places.iter().filter(|p| p.is_some()).count() as u64;
            }
        }
    }
    for ((producer, partition), mut batches) in acked_order {
        batches.sort_by_key(|(_, send)| send.invoked_ms);
        for pair in batches.windows(2) {
            let (earlier_sequence, earlier) = pair[0];
            let (later_sequence, later) = pair[1];
            // Only batches sent one after the other: the later one started after the
            // earlier one's acknowledgement.
            let sequential = earlier
                .acked_ms
                .is_some_and(|acked| acked <= later.invoked_ms);
            if sequential && later_sequence <= earlier_sequence {
                report.reordered += 1;
                report.violation(
                    ViolationKind::Reordered,
                    format!(
                        "producer {producer}, partition {partition}: batch {} (sent at {} ms) is \
                         stored at sequence {later_sequence}, before batch {} (acknowledged at \
                         {} ms) at sequence {earlier_sequence}",
                        later.events[0],
                        later.invoked_ms,
                        earlier.events[0],
                        earlier.acked_ms.unwrap_or_default()
                    ),
                );
            }
        }
    }
}

/// A batch is one entry: stored whole and contiguously in one partition, or not at all.
fn check_batch_whole(send: &SendRecord, places: &[Option<&Stored>], report: &mut CheckReport) {
    let found = places.iter().filter(|p| p.is_some()).count();
    if found == 0 {
        return;
    }
    let contiguous = places.windows(2).all(|pair| match (pair[0], pair[1]) {
        (Some(a), Some(b)) => a.partition == b.partition && b.sequence == a.sequence + 1,
        _ => false,
    });
    if found < places.len() || !contiguous {
        let at: Vec<String> = send
            .events
            .iter()
            .zip(places)
            .map(|(id, p)| match p {
                Some(s) => format!("{id}@{}/{}", s.partition, s.sequence),
                None => format!("{id}@missing"),
            })
            .collect();
        report.violation(
            ViolationKind::PartialBatch,
            format!(
                "a batch of producer {} to partition {} is not stored whole and contiguously: {}",
                send.producer,
                send.partition,
                at.join(", ")
            ),
        );
    }
}

/// The final partition's event at `sequence`, if it has one.
fn final_at(events: &[Delivered], sequence: i64) -> Option<&Delivered> {
    let first = events.first()?.sequence;
    let index = usize::try_from(sequence.checked_sub(first)?).ok()?;
    events.get(index).filter(|e| e.sequence == sequence)
}

/// How `delivered` differs from the final partition's event at its sequence number, if it
/// does: "saw X as sequence N; the partition holds Y".
fn differs_from_final(events: &[Delivered], delivered: &Delivered) -> Option<String> {
    let stored = final_at(events, delivered.sequence);
    (stored != Some(delivered)).then(|| {
        format!(
            "saw {} as sequence {}; the partition holds {}",
            describe(Some(delivered)),
            delivered.sequence,
            describe(stored)
        )
    })
}

fn describe(event: Option<&Delivered>) -> String {
    match event {
        Some(e) => format!(
            "{} at offset {}",
            e.id.map_or("an unknown body".to_owned(), |id| format!("event {id}")),
            e.offset
        ),
        None => "nothing".into(),
    }
}

/// Plain readers: each a gap-free run of its final partition from the beginning.
fn check_readers(
    history: &History,
    finals: &BTreeMap<&str, &[Delivered]>,
    report: &mut CheckReport,
) {
    for reader in &history.readers {
        report.delivered_events += reader.events.len() as u64;
        let events = finals
            .get(reader.partition.as_str())
            .copied()
            .unwrap_or(&[]);
        let mut expected = events.first().map_or(0, |e| e.sequence);
        for delivered in &reader.events {
            if delivered.sequence != expected {
                report.violation(
                    ViolationKind::ReaderDivergence,
                    format!(
                        "reader {} of partition {}: expected sequence {expected} next, got {}",
                        reader.reader, reader.partition, delivered.sequence
                    ),
                );
            }
            if let Some(difference) = differs_from_final(events, delivered) {
                report.violation(
                    ViolationKind::ReaderDivergence,
                    format!(
                        "reader {} of partition {} {difference}",
                        reader.reader, reader.partition
                    ),
                );
            }
            expected = delivered.sequence + 1;
        }
    }
}

/// A processor's run of one partition: from the start of its first call to the start of its
/// last (a call hands its events over at its start; a slow checkpoint inside it is no
/// processing alongside a new owner).
#[derive(Debug)]
struct Tenure<'a> {
    processor: &'a str,
    started_ms: Millis,
    ended_ms: Millis,
}

/// Processors: only stored events, gap-free within a tenure, no event skipped between
/// tenures, and tenures of one partition overlapping at most by the hand-off.
fn check_processors(
    history: &History,
    finals: &BTreeMap<&str, &[Delivered]>,
    bounds: Bounds,
    report: &mut CheckReport,
) {
    let mut calls: Vec<_> = history.processor_calls.iter().collect();
    calls.sort_by_key(|c| (c.started_ms, c.ended_ms));
    // (partition, processor, tenure) -> last sequence processed and the tenure's span.
    let mut tenures: BTreeMap<(&str, &str, u32), (i64, Tenure)> = BTreeMap::new();
    let mut processed: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for call in calls {
        report.processed_events += call.events.len() as u64;
        let events = finals.get(call.partition.as_str()).copied().unwrap_or(&[]);
        let key = (
            call.partition.as_str(),
            call.processor.as_str(),
            call.tenure,
        );
        let (last, tenure) = tenures.entry(key).or_insert((
            -1,
            Tenure {
                processor: &call.processor,
                started_ms: call.started_ms,
                ended_ms: call.started_ms,
            },
        ));
        tenure.ended_ms = tenure.ended_ms.max(call.started_ms);
        for delivered in &call.events {
            if *last >= 0 && delivered.sequence != *last + 1 {
                report.violation(
                    ViolationKind::ProcessorDivergence,
                    format!(
                        "{} (tenure {}) of partition {}: sequence {} followed sequence {last}",
                        call.processor, call.tenure, call.partition, delivered.sequence
                    ),
                );
            }
            *last = delivered.sequence;
            if let Some(difference) = differs_from_final(events, delivered) {
                report.violation(
                    ViolationKind::ProcessorDivergence,
                    format!(
                        "{} of partition {} {difference}",
                        call.processor, call.partition
                    ),
                );
            }
            processed
                .entry(call.partition.as_str())
                .or_default()
                .insert(delivered.sequence);
        }
    }
    // Checkpoints are made after processing, and an owner starts after the checkpoint, so
    // every event up to the last one processed was processed by someone.
    for (partition, sequences) in &processed {
        let first = finals
            .get(partition)
            .and_then(|e| e.first())
            .map_or(0, |e| e.sequence);
        let last = *sequences.last().expect("not empty");
        let skipped: Vec<i64> = (first..=last).filter(|s| !sequences.contains(s)).collect();
        if !skipped.is_empty() {
            report.violation(
                ViolationKind::ProcessorDivergence,
                format!(
                    "partition {partition}: no processor processed sequences {} (of {first}..={last})",
                    ranges(&skipped)
                ),
            );
        }
    }
    let mut per_partition: BTreeMap<&str, Vec<&Tenure>> = BTreeMap::new();
    for ((partition, _, _), (_, tenure)) in &tenures {
        per_partition.entry(partition).or_default().push(tenure);
    }
    for (partition, list) in per_partition {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.processor == b.processor {
                    continue;
                }
                let overlap_ms = a
                    .ended_ms
                    .min(b.ended_ms)
                    .saturating_sub(a.started_ms.max(b.started_ms));
                report.max_handoff_ms = report.max_handoff_ms.max(overlap_ms);
                if overlap_ms > bounds.handoff_max_ms {
                    report.violation(
                        ViolationKind::ProcessorOverlap,
                        format!(
                            "partition {partition}: {} ({}..{} ms) and {} ({}..{} ms) processed \
                             it at once for {overlap_ms} ms (bound {} ms)",
                            a.processor,
                            a.started_ms,
                            a.ended_ms,
                            b.processor,
                            b.started_ms,
                            b.ended_ms,
                            bounds.handoff_max_ms
                        ),
                    );
                }
            }
        }
    }
}

/// `1, 2, 3, 7` as `1..=3, 7`.
fn ranges(sorted: &[i64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}..={}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// Checkpoints, sampled over time: never back, always a stored event.
fn check_checkpoints(
    history: &History,
    finals: &BTreeMap<&str, &[Delivered]>,
    report: &mut CheckReport,
) {
    report.checkpoint_samples = history.checkpoints.len() as u64;
    let mut samples: Vec<_> = history.checkpoints.iter().collect();
    samples.sort_by_key(|s| s.at_ms);
    let mut highest: BTreeMap<&str, (i64, Millis)> = BTreeMap::new();
    for sample in samples {
        if let Some((sequence, at_ms)) = highest.get(sample.partition.as_str())
            && sample.sequence < *sequence
        {
            report.violation(
                ViolationKind::CheckpointBackwards,
                format!(
                    "partition {}: the checkpoint was at sequence {sequence} at {at_ms} ms and \
                     at {} at {} ms",
                    sample.partition, sample.sequence, sample.at_ms
                ),
            );
        }
        let entry = highest
            .entry(sample.partition.as_str())
            .or_insert((sample.sequence, sample.at_ms));
        if sample.sequence >= entry.0 {
            *entry = (sample.sequence, sample.at_ms);
        }
        let events = finals
            .get(sample.partition.as_str())
            .copied()
            .unwrap_or(&[]);
        let stored = final_at(events, sample.sequence);
        if stored.is_none_or(|e| e.offset != sample.offset) {
            report.violation(
                ViolationKind::CheckpointBackwards,
                format!(
                    "partition {}: the checkpoint at {} ms names sequence {} offset {}; the \
                     partition holds {}",
                    sample.partition,
                    sample.at_ms,
                    sample.sequence,
                    sample.offset,
                    describe(stored)
                ),
            );
        }
    }
}

/// Each managed name is created at most once and deleted at most once: what exists at the
/// end must follow from the answers.
fn check_management(history: &History, report: &mut CheckReport) {
    // name -> (create outcome, delete outcome)
    type Outcomes<'a> = BTreeMap<&'a str, (Option<&'a CallOutcome>, Option<&'a CallOutcome>)>;
    let mut hubs: Outcomes = BTreeMap::new();
    let mut groups: Outcomes = BTreeMap::new();
    for record in &history.management {
        match &record.op {
            ManagementOp::CreateHub(name) => {
                hubs.entry(name).or_default().0 = Some(&record.outcome)
            }
            ManagementOp::DeleteHub(name) => {
                hubs.entry(name).or_default().1 = Some(&record.outcome)
            }
            ManagementOp::CreateGroup(name) => {
                groups.entry(name).or_default().0 = Some(&record.outcome)
            }
            ManagementOp::DeleteGroup(name) => {
                groups.entry(name).or_default().1 = Some(&record.outcome)
            }
        }
    }
    for (what, outcomes, existing) in [
        ("hub", &hubs, &history.final_hubs),
        ("consumer group", &groups, &history.final_groups),
    ] {
        let Some(existing) = existing else {
            continue;
        };
        for (name, (created, deleted)) in outcomes {
            let exists = existing.contains(*name);
            let expected = match (created, deleted) {
                (Some(CallOutcome::Ok), None | Some(CallOutcome::Failed(_))) => Some(true),
                (_, Some(CallOutcome::Ok)) => Some(false),
                (Some(CallOutcome::Failed(_)) | None, _) => Some(false),
                _ => None,
            };
            if let Some(expected) = expected
                && expected != exists
            {
                report.violation(
                    ViolationKind::Management,
                    format!(
                        "{what} {name}: created {}, deleted {}, yet it {} at the end",
                        answer(*created),
                        answer(*deleted),
                        if exists { "exists" } else { "does not exist" }
                    ),
                );
            }
        }
        for name in existing
            .iter()
            .filter(|n| !outcomes.contains_key(n.as_str()))
        {
            report.violation(
                ViolationKind::Management,
                format!("{what} {name} exists at the end but was never created"),
            );
        }
    }
}

fn answer(outcome: Option<&CallOutcome>) -> String {
    match outcome {
        None => "never".into(),
        Some(CallOutcome::Ok) => "ok".into(),
        Some(CallOutcome::Failed(e)) => format!("refused ({e})"),
        Some(CallOutcome::Indeterminate(e)) => format!("unanswered ({e})"),
    }
}

fn check_faults(history: &History, bounds: Bounds, report: &mut CheckReport) {
    for fault in &history.faults {
        *report.faults.entry(fault.kind.clone()).or_default() += 1;
        let Some(healed_ms) = fault.healed_ms else {
            continue;
        };
        let recovery_ms = fault.recovered_ms.map(|r| r.saturating_sub(healed_ms));
        let max = report
            .max_recovery_ms
            .entry(fault.kind.clone())
            .or_default();
        *max = (*max).max(recovery_ms.unwrap_or(u64::MAX));
        match recovery_ms {
            Some(ms) if ms <= bounds.recovery_max_ms => {}
            Some(ms) => report.violation(
                ViolationKind::SlowRecovery,
                format!(
                    "{} ({}): fully available {ms} ms after the heal (bound {} ms)",
                    fault.kind, fault.description, bounds.recovery_max_ms
                ),
            ),
            None => report.violation(
                ViolationKind::SlowRecovery,
                format!(
                    "{} ({}): not fully available again after the heal",
                    fault.kind, fault.description
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests;
