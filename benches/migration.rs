//! The migration saga's cost in the core (a figure, not a test): on a
//! 5,000-node fleet with 5,200 running jobs, 200 `migrateJob` commands of
//! the jobs of one node, each target placed by the engine and its
//! `StartJob` emitted, as one step.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use norsk_auto_manager::automanager::{Action, Command, CommandId, Input, MigrationOptions, MigrationStrategy, Rpc};
use norsk_auto_manager::model::{BundleId, runtime_job_id};

#[path = "support/fleet.rs"]
mod fleet;

use fleet::{NOW, fleet};

/// `migrateJob` (overlap) for each of the hot node's jobs.
fn migrations(hot_jobs: usize) -> Vec<Input> {
    (0..hot_jobs)
        .map(|i| Input::Command {
            id: CommandId(i as u64 + 1),
            command: Command::MigrateJob {
                job_id: runtime_job_id(&BundleId(format!("b{i}")), 0, "encode"),
                options: MigrationOptions {
                    strategy: Some(MigrationStrategy::Overlap),
                    ..MigrationOptions::default()
                },
            },
        })
        .collect()
}

fn migrate_a_node(c: &mut Criterion) {
    let core = fleet(5_000, 200, 5_000);
    let mut probe = core.clone();
    let actions = probe.handle_all(migrations(200), NOW).actions;
    let targets = actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::Call {
                    rpc: Rpc::StartMigrationTarget { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(targets, 200, "every job's target is placed and started");
    let mut group = c.benchmark_group("migration");
    group.sample_size(20);
    group.bench_function("migrate_200_jobs_on_5000_nodes", |b| {
        b.iter_batched(
            || (core.clone(), migrations(200)),
            |(mut core, inputs)| {
                let step = core.handle_all(inputs, NOW);
                // Returned, so freeing the forked core is not timed.
                (core, step)
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

criterion_group!(benches, migrate_a_node);
criterion_main!(benches);
