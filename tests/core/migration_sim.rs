//! The migration saga end to end: the AutoManager runtime against the
//! Manager simulator over loopback, both on a compressed clock. Jobs are
//! migrated under each strategy and seen running on their target (and only
//! there); a job that refuses a handover or never starts keeps running on
//! its source; `close()` rolls back a migration in flight.

use std::collections::BTreeMap;
use std::time::Duration;

use norsk_auto_manager::automanager::{
    AutoSettings, CommandError, MigrationEnd, MigrationId, MigrationOptions, MigrationPhase, MigrationRefusal,
    MigrationState, MigrationStrategy, Notification,
};
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::{Bundle, BundleId, JobHistoryEntry, JobId, NodeId};
use tokio::sync::broadcast;

use crate::sim_support::Sim;
use crate::support::runtime::{self, Setup, stop};

const TIME_SCALE: f64 = 1000.0;
const WAIT: Duration = Duration::from_secs(60);

async fn start(nodes: &[(&str, f64)], tune: impl FnOnce(&mut AutoSettings)) -> Setup {
    runtime::start(17, TIME_SCALE, nodes, tune).await
}

fn bundle(i: usize) -> Bundle {
    Bundle {
        bundle_id: BundleId(format!("b{i}")),
        spec: yaml_serde::from_str(
            "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n",
        )
        .expect("bundle parses"),
        ..Bundle::default()
    }
}

fn job(i: usize) -> JobId {
    JobId(format!("b{i}/0/encode"))
}

/// Creates `count` one-job bundles and waits until every job runs;
/// returns job -> node.
async fn running_jobs(s: &mut Setup, count: usize) -> BTreeMap<JobId, NodeId> {
    for i in 0..count {
        s.am.create_bundle(bundle(i)).await.expect("bundle accepted");
    }
    let mut running = BTreeMap::new();
    let follow = async {
        while running.len() < count {
            match s.events.recv().await {
                Ok(Notification::JobUpdated { job }) => {
                    if let Some(JobHistoryEntry::Running {
                        node_id: Some(node), ..
                    }) = job.history.last()
                    {
                        running.insert(job.job_id.clone(), node.clone());
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => panic!("fell {n} notifications behind"),
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow).await.expect("every job runs");
    running
}

/// Follows notifications until every migration in `ids` has ended; returns
/// each one's final state.
async fn until_ended(s: &mut Setup, ids: &[MigrationId]) -> BTreeMap<MigrationId, MigrationState> {
    let mut ended = BTreeMap::new();
    let follow = async {
        while ended.len() < ids.len() {
            match s.events.recv().await {
                Ok(Notification::MigrationPhase(state))
                    if state.phase.is_ended() && ids.contains(&state.migration_id) =>
                {
                    ended.insert(state.migration_id.clone(), *state);
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => panic!("fell {n} notifications behind"),
                Err(broadcast::error::RecvError::Closed) => panic!("the AutoManager stopped"),
            }
        }
    };
    tokio::time::timeout(WAIT, follow)
        .await
        .unwrap_or_else(|_| panic!("timed out; {} of {} migrations ended", ended.len(), ids.len()));
    ended
}

/// Every live instance in the simulator: job -> [(node, key, phase, runtime role)].
async fn instances(sim: &Sim) -> BTreeMap<JobId, Vec<(NodeId, String, String, String)>> {
    let mut all: BTreeMap<JobId, Vec<_>> = BTreeMap::new();
    for node in sim.snapshot().await.nodes {
        for i in node.instances {
            all.entry(i.job_id)
                .or_default()
                .push((node.id.clone(), i.role, i.phase, i.runtime_role));
        }
    }
    all
}

/// Waits until the simulator holds exactly `want` live instances per job
/// (stopping ones finish stopping on the simulator's clock).
async fn settled(sim: &Sim, want: impl Fn(&JobId, &[(NodeId, String, String, String)]) -> bool) {
    let check = async {
        loop {
            let now = instances(sim).await;
            if now.iter().all(|(job, list)| want(job, list)) {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, check).await.expect("the simulator settled");
}

/// Phase deadlines far beyond what a loaded machine can stretch the
/// compressed clock by (30 s of simulated time is 30 ms here): the tests
/// that use it are about the saga's path, not its deadlines.
fn patient(settings: &mut AutoSettings) {
    let m = &mut settings.migration;
    for ms in [
        &mut m.placing_timeout_ms,
        &mut m.preparing_timeout_ms,
        &mut m.starting_timeout_ms,
        &mut m.awaiting_ready_timeout_ms,
        &mut m.stopping_output_timeout_ms,
        &mut m.applying_timeout_ms,
        &mut m.stopping_source_timeout_ms,
        &mut m.starting_target_timeout_ms,
    ] {
        *ms = 3_600_000;
    }
}

/// Starts a migration of `job`. The core refuses one (`NotRunning`) while
/// the answer to the job's `StartJob` is still on its way, although Manager
/// already reports the instance running: on a loaded machine the answer can
/// trail the event, so the refusal is waited out (bounded by `WAIT`).
async fn migrate_once_running(s: &Setup, job: &JobId, options: MigrationOptions) -> MigrationId {
    let attempt = async {
        loop {
            match s.am.migrate_job(job.clone(), options.clone()).await {
                Ok(id) => return id,
                Err(CommandError::Migration(MigrationRefusal::NotRunning { .. })) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) => panic!("migration of {job} refused: {e:?}"),
            }
        }
    };
    tokio::time::timeout(WAIT, attempt)
        .await
        .unwrap_or_else(|_| panic!("{job} was never running for the core"))
}

async fn migrate_all(s: &mut Setup, jobs: usize, strategy: MigrationStrategy) {
    let sources = running_jobs(s, jobs).await;
    let mut ids = Vec::new();
    for job in sources.keys() {
        let options = MigrationOptions {
            strategy: Some(strategy),
            ..MigrationOptions::default()
        };
        ids.push(migrate_once_running(s, job, options).await);
    }
    let ended = until_ended(s, &ids).await;
    let mut targets = BTreeMap::new();
    for state in ended.values() {
        assert_eq!(state.end(), Some(MigrationEnd::Completed), "{state:?}");
        assert_ne!(state.target_node_id, sources[&state.job_id]);
        targets.insert(state.job_id.clone(), state.clone());
    }
    settled(&s.sim, |job, list| {
        list.len() == 1 && list[0].2 == "running" && targets.get(job).is_none_or(|t| t.target_node_id == list[0].0)
    })
    .await;
    for (job, list) in instances(&s.sim).await {
        let (node, key, _, role) = &list[0];
        let t = &targets[&job];
        assert_eq!(node, &t.target_node_id, "{job} runs on its target");
        assert_eq!(key, t.target_key.as_str(), "{job} wears the target's key");
        assert_eq!(role, "primary", "{job}'s runtime is told its slot");
    }
    for (job, t) in &targets {
        let state =
            s.am.migration_for_job(job.clone())
                .await
                .expect("query")
                .expect("known");
        assert_eq!(state.migration_id, t.migration_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_then_start_moves_jobs_onto_their_targets() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], patient).await;
    migrate_all(&mut s, 6, MigrationStrategy::StopThenStart).await;
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_moves_jobs_onto_their_targets() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], patient).await;
    migrate_all(&mut s, 6, MigrationStrategy::Overlap).await;
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_moves_jobs_onto_their_targets() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], patient).await;
    migrate_all(&mut s, 6, MigrationStrategy::Handover).await;
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_refuses_the_handover_keeps_running_on_its_source() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], patient).await;
    let sources = running_jobs(&mut s, 1).await;
    s.sim
        .admin
        .clone()
        .set_job_behaviour(sim_admin::SetJobBehaviourRequest {
            job_id: job(0).0,
            behaviour: sim_admin::JobBehaviour::RefuseHandover as i32,
        })
        .await
        .expect("behaviour set");
    let options = MigrationOptions {
        strategy: Some(MigrationStrategy::Handover),
        ..MigrationOptions::default()
    };
    let id = migrate_once_running(&s, &job(0), options).await;
    let ended = until_ended(&mut s, std::slice::from_ref(&id)).await;
    assert_eq!(ended[&id].phase, MigrationPhase::Aborted);
    assert!(!ended[&id].past_point_of_no_return);
    settled(&s.sim, |_, list| list.len() == 1).await;
    let list = &instances(&s.sim).await[&job(0)];
    assert_eq!((&list[0].0, list[0].1.as_str()), (&sources[&job(0)], "primary"));
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_never_starts_is_aborted_at_its_deadline() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], |settings| {
        patient(settings);
        settings.migration.starting_timeout_ms = 10_000;
    })
    .await;
    let sources = running_jobs(&mut s, 1).await;
    s.sim
        .admin
        .clone()
        .set_job_behaviour(sim_admin::SetJobBehaviourRequest {
            job_id: job(0).0,
            behaviour: sim_admin::JobBehaviour::HangStart as i32,
        })
        .await
        .expect("behaviour set");
    let options = MigrationOptions {
        strategy: Some(MigrationStrategy::Overlap),
        ..MigrationOptions::default()
    };
    let id = migrate_once_running(&s, &job(0), options).await;
    let ended = until_ended(&mut s, std::slice::from_ref(&id)).await;
    assert_eq!(ended[&id].reason.as_deref(), Some("starting deadline passed"));
    settled(&s.sim, |_, list| list.len() == 1).await;
    assert_eq!(instances(&s.sim).await[&job(0)][0].0, sources[&job(0)]);
    stop(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_rolls_back_a_migration_in_flight() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], patient).await;
    let sources = running_jobs(&mut s, 1).await;
    s.sim
        .admin
        .clone()
        .set_job_behaviour(sim_admin::SetJobBehaviourRequest {
            job_id: job(0).0,
            behaviour: sim_admin::JobBehaviour::HangStart as i32,
        })
        .await
        .expect("behaviour set");
    let options = MigrationOptions {
        strategy: Some(MigrationStrategy::Overlap),
        ..MigrationOptions::default()
    };
    migrate_once_running(&s, &job(0), options).await;
    settled(&s.sim, |_, list| list.len() == 2).await;
    let Setup { sim, am, join, .. } = s;
    am.close().await;
    join.await.expect("the loop ends cleanly");
    // The abort and the target's stop were sent before the channel closed.
    settled(&sim, |_, list| list.len() == 1).await;
    let list = &instances(&sim).await[&job(0)];
    assert_eq!((&list[0].0, list[0].1.as_str()), (&sources[&job(0)], "primary"));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_holds_the_channel_open_only_for_its_grace() {
    let mut s = start(&[("n1", 8.0), ("n2", 8.0)], patient).await;
    running_jobs(&mut s, 1).await;
    s.sim
        .admin
        .clone()
        .set_job_behaviour(sim_admin::SetJobBehaviourRequest {
            job_id: job(0).0,
            behaviour: sim_admin::JobBehaviour::HangStart as i32,
        })
        .await
        .expect("behaviour set");
    let options = MigrationOptions {
        strategy: Some(MigrationStrategy::Overlap),
        ..MigrationOptions::default()
    };
    migrate_once_running(&s, &job(0), options).await;
    settled(&s.sim, |_, list| list.len() == 2).await;
    // Manager takes 3 s (wall clock) to handle the rollback's calls; the
    // grace is CLOSE_ABORT_GRACE_MS of the compressed clock (5 ms here).
    for rpc in ["SendMigrationSignal", "StopJob"] {
        s.sim
            .admin
            .clone()
            .rpc_fault(sim_admin::RpcFaultRequest {
                rpc: rpc.to_owned(),
                delay_ms: 3_000,
                failure_rate: 0.0,
                clear: false,
            })
            .await
            .expect("fault set");
    }
    let Setup { sim, am, join, .. } = s;
    am.close().await;
    join.await.expect("the loop ends cleanly");
    // close() returned before Manager handled the stop: the target is
    // still there, not stopping.
    let list = &instances(&sim).await[&job(0)];
    let target = list
        .iter()
        .find(|(_, key, _, _)| key.contains('@'))
        .expect("the target");
    assert_ne!(target.2, "stopping", "close() waited for Manager: {list:?}");
    sim.shutdown().await;
}
