//! Scenario tests of a job's own migration strategy
//! (`requirements.migrationStrategy`): drains, interruptions and
//! `migrateJob` move a job with the strategy it declares when their caller
//! gives none for it. Precedence: the caller's per-job strategy
//! (`strategyFor`), the caller's default, the job's declaration,
//! `stopThenStart`.

use std::collections::BTreeMap;

use norsk_auto_manager::automanager::{
    Command, DrainOptions, DrainPhase, InterruptionNotice, MigrationId, MigrationOptions, MigrationStrategy, Rpc,
    StrategyFor,
};
use norsk_auto_manager::model::{InterruptionKind, JobId, NodeId};

use crate::support::migration::*;
use crate::support::*;

/// `live` declares `overlap`, `plain` declares nothing, `coop` declares
/// `handover`.
const DECLARED: &str = "pool: production\njobs:\n  - {jobName: live, requirements: {requiredCapacity: 1, migrationStrategy: overlap}}\n  - {jobName: plain, requirements: {requiredCapacity: 1}}\n  - {jobName: coop, requirements: {requiredCapacity: 1, migrationStrategy: handover}}\n";

fn job(name: &str) -> JobId {
    JobId::from(format!("b1/0/{name}").as_str())
}

/// `live` declares `overlap`, `plain` declares nothing.
const LIVE_AND_PLAIN: &str = "pool: production\njobs:\n  - {jobName: live, requirements: {requiredCapacity: 1, migrationStrategy: overlap}}\n  - {jobName: plain, requirements: {requiredCapacity: 1}}\n";

/// The jobs of [`DECLARED`] running on node `a`.
fn declared_jobs_on_a() -> Harness {
    jobs_on_a(DECLARED)
}

/// The jobs of bundle `b1` (`spec`) running on node `a` (placed while `b`
/// was cordoned).
fn jobs_on_a(spec: &str) -> Harness {
    let mut h = Harness::hydrated();
    h.command(Command::CordonNode(NodeId::from("b")));
    h.bundle("b1", spec);
    let started = h.start_all();
    h.command(Command::UncordonNode(NodeId::from("b")));
    assert!(
        started.iter().all(|(_, node)| node == &NodeId::from("a")),
        "{started:?}"
    );
    h.take_replies();
    h.take_notifications();
    h
}

fn drain_a(h: &mut Harness, options: DrainOptions) {
    let id = h.command(Command::DrainNode {
        node_id: NodeId::from("a"),
        options,
    });
    let replies: Vec<_> = h.take_replies().into_iter().filter(|(reply, _)| *reply == id).collect();
    assert!(matches!(&replies[..], [(_, Ok(_))]), "the drain starts: {replies:?}");
}

/// Each job's migration id, as the drain of `a` recorded it.
fn drain_migrations(h: &Harness) -> BTreeMap<JobId, MigrationId> {
    let drain = h.core.drain_status(&NodeId::from("a")).expect("a drain of a");
    drain
        .jobs
        .iter()
        .map(|j| (j.job_id.clone(), j.migration_id.clone().expect("a migration")))
        .collect()
}

/// Each job's strategy, as the drain of `a` moves it.
fn drain_strategies(h: &Harness) -> BTreeMap<String, MigrationStrategy> {
    drain_migrations(h)
        .into_iter()
        .map(|(job, id)| (job.to_string(), state(h, &id).strategy))
        .collect()
}

fn strategies(pairs: &[(&str, MigrationStrategy)]) -> BTreeMap<String, MigrationStrategy> {
    pairs.iter().map(|(name, s)| (job(name).to_string(), *s)).collect()
}

/// Whether the target of each job was created prepared-not-started
/// (`deferStart`, the stopThenStart way) — what Manager is actually told.
fn deferred_starts(calls: &[Rpc]) -> BTreeMap<String, bool> {
    calls
        .iter()
        .filter_map(|rpc| match rpc {
            Rpc::StartMigrationTarget {
                job_id, defer_start, ..
            } => Some((job_id.to_string(), *defer_start)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_drain_without_a_strategy_moves_each_job_with_the_one_it_declares() {
    let mut h = declared_jobs_on_a();
    drain_a(&mut h, DrainOptions::default());
    assert_eq!(
        drain_strategies(&h),
        strategies(&[
            ("live", MigrationStrategy::Overlap),
            ("plain", MigrationStrategy::StopThenStart),
            ("coop", MigrationStrategy::Handover),
        ])
    );
    let told = deferred_starts(&calls(&mut h));
    assert_eq!(
        told.get(&job("live").to_string()),
        Some(&false),
        "overlap starts the target"
    );
    assert_eq!(
        told.get(&job("plain").to_string()),
        Some(&true),
        "stopThenStart prepares it"
    );
}

#[test]
fn a_drain_without_a_strategy_ends_done_with_each_job_moved_its_own_way() {
    let mut h = jobs_on_a(LIVE_AND_PLAIN);
    drain_a(&mut h, DrainOptions::default());
    let ids = drain_migrations(&h);
    calls(&mut h);
    // overlap: the target runs, then the source is stopped.
    let live = &ids[&job("live")];
    target_runs(&mut h, live);
    calls(&mut h);
    source_stops(&mut h, live);
    // stopThenStart: prepared, the source stopped, the target started.
    let plain = &ids[&job("plain")];
    prepared(&mut h, plain);
    calls(&mut h);
    source_stops(&mut h, plain);
    calls(&mut h);
    target_runs(&mut h, plain);
    calls(&mut h);
    for name in ["live", "plain"] {
        assert_eq!(bound(&h, &job(name)).0, NodeId::from("b"), "{name} lives on b");
    }
    let drain = h.core.drain_status(&NodeId::from("a")).expect("a drain of a");
    assert_eq!(drain.phase, DrainPhase::Done, "{drain:?}");
}

#[test]
fn the_callers_default_strategy_wins_over_the_declaration() {
    let mut h = declared_jobs_on_a();
    drain_a(
        &mut h,
        DrainOptions {
            strategy_for: StrategyFor::all(MigrationStrategy::StopThenStart),
            ..DrainOptions::default()
        },
    );
    assert_eq!(
        drain_strategies(&h),
        strategies(&[
            ("live", MigrationStrategy::StopThenStart),
            ("plain", MigrationStrategy::StopThenStart),
            ("coop", MigrationStrategy::StopThenStart),
        ])
    );
}

#[test]
fn the_callers_per_job_strategy_wins_over_its_default_and_the_declaration() {
    let mut h = declared_jobs_on_a();
    let strategy_for = StrategyFor {
        default: None,
        jobs: BTreeMap::from([(job("coop"), MigrationStrategy::Overlap)]),
    };
    drain_a(
        &mut h,
        DrainOptions {
            strategy_for,
            ..DrainOptions::default()
        },
    );
    assert_eq!(
        drain_strategies(&h),
        strategies(&[
            ("live", MigrationStrategy::Overlap),
            ("plain", MigrationStrategy::StopThenStart),
            ("coop", MigrationStrategy::Overlap),
        ])
    );
}

#[test]
fn an_interruption_without_a_strategy_uses_the_declaration() {
    let mut h = declared_jobs_on_a();
    let deadline = h.now + 120_000;
    let id = h.command(Command::HandleNodeInterruption {
        node_id: NodeId::from("a"),
        notice: InterruptionNotice {
            kind: InterruptionKind::SpotInterruption,
            deadline: Some(deadline),
            strategy_for: StrategyFor::default(),
        },
    });
    assert!(h.take_replies().iter().any(|(reply, r)| *reply == id && r.is_ok()));
    assert_eq!(
        h.core.drain_status(&NodeId::from("a")).map(|d| d.phase),
        Some(DrainPhase::Migrating)
    );
    assert_eq!(
        drain_strategies(&h),
        strategies(&[
            ("live", MigrationStrategy::Overlap),
            ("plain", MigrationStrategy::StopThenStart),
            ("coop", MigrationStrategy::Handover),
        ])
    );
}

#[test]
fn a_migration_without_a_strategy_uses_the_declaration_and_an_explicit_one_wins() {
    let mut h = declared_jobs_on_a();
    let own = try_migrate(&mut h, &job("live"), MigrationOptions::default()).expect("the migration starts");
    assert_eq!(state(&h, &own).strategy, MigrationStrategy::Overlap);
    let plain = try_migrate(&mut h, &job("plain"), MigrationOptions::default()).expect("the migration starts");
    assert_eq!(state(&h, &plain).strategy, MigrationStrategy::StopThenStart);
    let given = try_migrate(&mut h, &job("coop"), options(MigrationStrategy::Overlap)).expect("the migration starts");
    assert_eq!(state(&h, &given).strategy, MigrationStrategy::Overlap);
}

#[test]
fn nothing_declared_and_nothing_given_is_stop_then_start() {
    let (mut h, job, _) = running_job();
    let id = try_migrate(&mut h, &job, MigrationOptions::default()).expect("the migration starts");
    assert_eq!(state(&h, &id).strategy, MigrationStrategy::StopThenStart);
}

/// A co-located pair: `encode` declares `overlap`, `package` nothing.
const PAIR: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, migrationStrategy: overlap}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}\n";

#[test]
fn a_co_located_group_drained_without_a_strategy_moves_each_member_with_its_own() {
    let mut h = jobs_on_a(PAIR);
    drain_a(&mut h, DrainOptions::default());
    assert_eq!(
        drain_strategies(&h),
        strategies(&[
            ("encode", MigrationStrategy::Overlap),
            ("package", MigrationStrategy::StopThenStart),
        ])
    );
    let targets: Vec<NodeId> = drain_migrations(&h)
        .values()
        .map(|id| state(&h, id).target_node_id)
        .collect();
    assert!(
        targets.windows(2).all(|w| w[0] == w[1]),
        "one target for the group: {targets:?}"
    );
}
