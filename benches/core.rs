//! The AutoManager core's performance targets (figures, not tests):
//! - on a 5,000-node fleet, a node hosting 200 jobs is lost: every recovery
//!   placement decided and its `StartJob` emitted within 20 ms of the
//!   `NodeStopped` input;
//! - at least 10,000 job events per second through the core on one core.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use norsk_auto_manager::automanager::{Action, Input, Rpc};
use norsk_auto_manager::model::{ManagerEvent, NodeId, RuntimeJob};

#[path = "support/fleet.rs"]
mod fleet;

use fleet::{NOW, fleet};

fn node_loss(c: &mut Criterion) {
    let core = fleet(5_000, 200, 5_000);
    let starts = |actions: &[Action]| {
        actions
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Call {
                        rpc: Rpc::StartJob { .. },
                        ..
                    }
                )
            })
            .count()
    };
    let mut probe = core.clone();
    let actions = probe
        .handle(
            Input::Event(Box::new(ManagerEvent::NodeStopped(NodeId::from("hot")))),
            NOW,
        )
        .actions;
    assert_eq!(starts(&actions), 200, "every job of the lost node is re-placed");
    let mut group = c.benchmark_group("core");
    group.sample_size(20);
    group.bench_function("node_loss_5000_nodes_200_jobs_recovered", |b| {
        b.iter_batched(
            || core.clone(),
            |mut core| {
                let step = core.handle(
                    Input::Event(Box::new(ManagerEvent::NodeStopped(NodeId::from("hot")))),
                    NOW,
                );
                // Returned, so freeing the forked core is not timed.
                (core, step)
            },
            BatchSize::LargeInput,
        )
    });
    // The part of the recovery that is the core's own: the placement view
    // of the fleet built from its nodes and bindings.
    group.bench_function("fleet_view_5000_nodes_5200_jobs", |b| b.iter(|| core.view()));
    group.finish();
}

fn job_events(c: &mut Criterion) {
    let core = fleet(1_000, 0, 2_000);
    let jobs: Vec<RuntimeJob> = core.jobs().map(|r| r.job.clone()).collect();
    let mut group = c.benchmark_group("core");
    group.throughput(Throughput::Elements(jobs.len() as u64));
    group.sample_size(20);
    group.bench_function("job_updated_events_1000_nodes_2000_jobs", |b| {
        b.iter_batched(
            || core.clone(),
            |mut core| {
                for job in &jobs {
                    core.handle(Input::Event(Box::new(ManagerEvent::JobUpdated(job.clone()))), NOW);
                }
                core
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, node_loss, job_events);
criterion_main!(benches);
