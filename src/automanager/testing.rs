//! A core for the edges' unit tests (the status functions of the
//! controllers and `standalone`): hydrated from a fleet of cluster nodes of
//! pool `production`, bundles announced as Manager announces them, starts
//! answered at will; read through the [`ReadModel`] as the edges read it.
//! Only what the status functions read is played; the core's own rules are
//! tested in `tests/core`.

use std::collections::BTreeMap;

use crate::model::{
    Bundle, BundleId, BundleJobRef, BundleSpec, JobHistoryEntry, JobState, ManagerEvent, NodeId, NodeInfo,
    NodeInventory, ProviderMetadata, RuntimeJob, StartMode, UnixMillis, runtime_job_id, tags,
};

use super::core::AutoManagerCore;
use super::protocol::{Action, Input, RequestId, Rpc};
use super::settings::{AutoSettings, validate_auto_settings};
use super::views::ReadModel;

/// Pool `production`: one fixed tier of cluster nodes.
pub const POOLS: &str = "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n";

/// A bundle of one job taking half a vCPU.
pub const ONE_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 0.5}}\n";

/// The settings of [`POOLS`].
pub fn settings() -> AutoSettings {
    AutoSettings {
        url: "manager.test:6789".into(),
        placement_pools: yaml_serde::from_str(POOLS).expect("pools parse"),
        trace_placements: false,
        ..AutoSettings::default()
    }
}

/// The core, its clock, and the calls it asked for and were not answered.
pub struct TestCore {
    core: AutoManagerCore,
    pub now: UnixMillis,
    calls: Vec<(RequestId, Rpc)>,
}

impl TestCore {
    /// The core as the edges read it now.
    pub fn read(&self) -> ReadModel<'_> {
        self.core.read(self.now)
    }

    /// The core itself, for the core's own unit tests.
    pub(super) fn core_mut(&mut self) -> &mut AutoManagerCore {
        &mut self.core
    }

    /// A core on `settings` hydrated from cluster nodes `nodes` (id and
    /// vCPUs) of pool `production`.
    pub fn hydrated_with(settings: AutoSettings, nodes: &[(&str, f64)]) -> Self {
        let now = 1_000_000;
        let valid = validate_auto_settings(settings).expect("settings are valid");
        let mut core = Self {
            core: AutoManagerCore::new(valid, now),
            now,
            calls: Vec::new(),
        };
        for (id, capacity) in nodes {
            core.node_started(id);
            core.event(ManagerEvent::NodeInventory {
                node_id: NodeId::from(*id),
                inventory: inventory(*capacity),
            });
        }
        core.event(ManagerEvent::InitialDataComplete);
        core
    }

    /// [`hydrated_with`](Self::hydrated_with) the [`settings`].
    pub fn hydrated(nodes: &[(&str, f64)]) -> Self {
        Self::hydrated_with(settings(), nodes)
    }

    /// Manager reports `id` started (no inventory yet): see [`node_info`].
    pub fn node_started(&mut self, id: &str) {
        self.event(ManagerEvent::NodeStarted(node_info(id)));
    }

    /// Feeds one event from Manager's stream.
    pub fn event(&mut self, event: ManagerEvent) {
        self.input(Input::Event(Box::new(event)));
    }

    /// Hands the core a command (its answer is not kept).
    pub fn command(&mut self, command: super::protocol::Command) {
        self.input(Input::Command {
            id: super::protocol::CommandId(0),
            command,
        });
    }

    fn input(&mut self, input: Input) {
        let step = self.core.handle(input, self.now);
        self.calls.extend(step.actions.into_iter().filter_map(|a| match a {
            Action::Call { id, rpc } => Some((id, rpc)),
            _ => None,
        }));
    }

    /// Manager stores bundle `id` of `spec_yaml` and announces its jobs
    /// active, one per replica and job; the spec.
    pub fn bundle(&mut self, id: &str, spec_yaml: &str) -> BundleSpec {
        let spec: BundleSpec = yaml_serde::from_str(spec_yaml).expect("bundle parses");
        let bundle_id = BundleId::from(id);
        self.event(ManagerEvent::BundleUpdated(Bundle {
            bundle_id: bundle_id.clone(),
            spec: spec.clone(),
            state: Default::default(),
            terminal_verdict: None,
            generation: 1,
        }));
        for replica_index in 0..spec.replica_count() {
            for job in &spec.jobs {
                let mut job = job.clone();
                job.parameters = spec.parameters_for(replica_index, &job);
                self.event(ManagerEvent::JobActive(RuntimeJob {
                    job_id: runtime_job_id(&bundle_id, replica_index, &job.job_name),
                    state: JobState::Active,
                    tags: BTreeMap::new(),
                    start_date_time: None,
                    bundle_ref: Some(BundleJobRef {
                        bundle_id: bundle_id.clone(),
                        replica_index,
                        job_name: job.job_name.clone(),
                    }),
                    dormant: job.start_mode == StartMode::Manual,
                    spec: job,
                    context: None,
                    terminal_verdict: None,
                    history: vec![JobHistoryEntry::Created { at: None }],
                }));
            }
        }
        spec
    }

    /// Manager accepts every call asked for; every job it started reaches
    /// running.
    pub fn start_all(&mut self) {
        for (id, rpc) in std::mem::take(&mut self.calls) {
            self.input(Input::RpcResult { id, result: Ok(()) });
            let Rpc::StartJob {
                job_id,
                instance_key,
                node_id,
                ..
            } = rpc
            else {
                continue;
            };
            let mut runtime = self.core.job(&job_id).expect("a started job is known").job.clone();
            runtime.history.push(JobHistoryEntry::Running {
                at: Some(self.now),
                role: instance_key,
                node_id: Some(node_id),
            });
            self.event(ManagerEvent::JobUpdated(runtime));
        }
    }
}

/// Node `id` of tier `cluster` of pool `production`, as Manager describes
/// it.
pub fn node_info(id: &str) -> NodeInfo {
    NodeInfo {
        node_id: NodeId::from(id),
        tags: BTreeMap::from([
            (tags::POOL.to_owned(), "production".to_owned()),
            (tags::TIER.to_owned(), "cluster".to_owned()),
        ]),
        created_at: None,
        provider: ProviderMetadata::Unknown,
    }
}

/// A cluster node's inventory of `capacity` vCPUs in zone `az1`.
fn inventory(capacity: f64) -> NodeInventory {
    NodeInventory::local_server("", "az1", "", capacity)
}
