//! The migration saga's cost in the core (a figure, not a test): on a
//! 5,000-node fleet with 5,200 running jobs, 200 `migrateJob` commands of
//! the jobs of one node, each target placed by the engine and its
//! `StartJob` emitted, as one step.

use std::collections::BTreeMap;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use norsk_auto_manager::automanager::{
    Action, AutoManagerCore, AutoSettings, Command, CommandId, Input, MigrationOptions, MigrationStrategy, Rpc,
    validate_auto_settings,
};
use norsk_auto_manager::model::{
    Bundle, BundleId, BundleJobRef, BundleSpec, InstanceKey, JobHistoryEntry, JobState, ManagerEvent, NodeId, NodeInfo,
    NodeInventory, ProviderMetadata, RuntimeJob, runtime_job_id, tags,
};

const NOW: i64 = 1_000_000;

fn event(core: &mut AutoManagerCore, event: ManagerEvent) -> Vec<Action> {
    core.handle(Input::Event(Box::new(event)), NOW).actions
}

fn node(core: &mut AutoManagerCore, id: &str, vcpus: f64) {
    let info = NodeInfo {
        node_id: NodeId::from(id),
        tags: BTreeMap::from([(tags::POOL.to_owned(), "production".to_owned())]),
        created_at: None,
        provider: ProviderMetadata::Unknown,
    };
    event(core, ManagerEvent::NodeStarted(info));
    event(
        core,
        ManagerEvent::NodeInventory {
            node_id: NodeId::from(id),
            inventory: NodeInventory::local_server(String::new(), format!("az{}", id.len() % 3), String::new(), vcpus),
        },
    );
}

/// A running bundle job on `node`, as Manager's snapshot carries it.
fn running_job(bundle: &Bundle, node: &str) -> RuntimeJob {
    let spec = bundle.spec.jobs[0].clone();
    RuntimeJob {
        job_id: runtime_job_id(&bundle.bundle_id, 0, &spec.job_name),
        state: JobState::Active,
        tags: BTreeMap::new(),
        start_date_time: None,
        bundle_ref: Some(BundleJobRef {
            bundle_id: bundle.bundle_id.clone(),
            replica_index: 0,
            job_name: spec.job_name.clone(),
        }),
        spec,
        context: None,
        dormant: false,
        terminal_verdict: None,
        history: vec![JobHistoryEntry::Running {
            at: None,
            role: InstanceKey("primary".into()),
            node_id: Some(NodeId::from(node)),
        }],
    }
}

/// A hydrated core: `nodes` cluster nodes of 16 vCPUs, plus node `hot`
/// (256 vCPUs) running `hot_jobs` one-vCPU jobs, plus `spread_jobs` jobs
/// spread over the fleet.
fn fleet(nodes: usize, hot_jobs: usize, spread_jobs: usize) -> AutoManagerCore {
    let settings = AutoSettings {
        url: "bench:1".into(),
        placement_pools: serde_yaml::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n",
        )
        .expect("pools parse"),
        trace_placements: false,
        ..AutoSettings::default()
    };
    let mut core = AutoManagerCore::new(validate_auto_settings(settings).expect("valid"), NOW);
    for n in 0..nodes {
        node(&mut core, &format!("n{n:05}"), 16.0);
    }
    node(&mut core, "hot", 256.0);
    let spec: BundleSpec =
        serde_yaml::from_str("pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n")
            .expect("bundle parses");
    for i in 0..hot_jobs + spread_jobs {
        let bundle = Bundle {
            bundle_id: BundleId(format!("b{i}")),
            spec: spec.clone(),
            ..Bundle::default()
        };
        let host = if i < hot_jobs {
            "hot".to_owned()
        } else {
            format!("n{:05}", i % nodes)
        };
        event(&mut core, ManagerEvent::BundleUpdated(bundle.clone()));
        event(&mut core, ManagerEvent::JobActive(running_job(&bundle, &host)));
    }
    event(&mut core, ManagerEvent::InitialDataComplete);
    core
}

/// `migrateJob` (overlap) for each of the hot node's jobs.
fn migrations(hot_jobs: usize) -> Vec<Input> {
    (0..hot_jobs)
        .map(|i| Input::Command {
            id: CommandId(i as u64 + 1),
            command: Command::MigrateJob {
                job_id: runtime_job_id(&BundleId(format!("b{i}")), 0, "encode"),
                options: MigrationOptions {
                    strategy: MigrationStrategy::Overlap,
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
