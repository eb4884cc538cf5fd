//! The bundle store the operator keeps when Manager has none. A Bundle is
//! expanded here, as Manager's own store would (`super::super::expansion`),
//! into one published Manager job per replica and job; each job's id and
//! tags say which bundle, replica, job and spec revision it is
//! ([`TAG_BUNDLE`] ...), so after a restart or a leader change the jobs
//! Manager holds are known again as soon as their Bundle is applied. What
//! the published job cannot carry (requirements, placement rules, the
//! template, dormancy, verdicts) is added back here to every job event
//! before the core reads it, so the core sees the same jobs and bundle
//! events whichever store is used.
//!
//! A job event for a bundle this store does not hold (yet: a new leader
//! hears Manager's snapshot before its Bundles are applied) is kept back,
//! and told once the bundle is applied.
//!
//! The store also follows the bundles of a Manager that has its own store
//! ([`BundleStore::mirror`]), so that Manager can be changed under a running
//! operator without a gap: downgraded to the published API, it still holds
//! every job the bundles expanded into (under the same ids, without the
//! tags), and the store carries on from what it followed; upgraded, the
//! bundles stored here are handed to Manager's store
//! ([`BundleStore::to_hand_over`]), which adopts the jobs as they run.
//! Everything here is plain state:
//! it decides which calls to make and which events to tell, and
//! `super::Port` makes the calls.

use std::collections::{BTreeMap, BTreeSet};

use crate::manager::expansion::expand;
use crate::manager::proto::common;
use crate::manager::proto::manager::{self as pb, event_stream_event::Event, job_history_entry::HistoryEntry};
use crate::manager::wire;
use crate::model::{Bundle, BundleJobRef, JobId, TerminalVerdict, UnixMillis, VerdictKind};

/// The bundle a Manager job was expanded from.
pub const TAG_BUNDLE: &str = "automanager.norsk.video/bundle";
/// Its replica index (0 the primary, 1 the backup).
pub const TAG_REPLICA: &str = "automanager.norsk.video/replica";
/// Its job name within the bundle.
pub const TAG_JOB: &str = "automanager.norsk.video/job";
/// The bundle's generation the job was written for.
pub const TAG_REVISION: &str = "automanager.norsk.video/revision";
/// A digest of the bundle spec the job was written for, so a spec changed
/// while no operator ran is told from one that did not change.
pub const TAG_SPEC: &str = "automanager.norsk.video/spec";

/// A call to make on Manager for the store.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// `CreateJob` (published fields and tags only).
    Create(pb::Job),
    /// `UpdateJob`.
    Update(pb::Job),
    /// `StopJob` of one live instance.
    Stop {
        /// The job.
        job_id: String,
        /// The instance key.
        role: String,
        /// Where it runs.
        node_id: String,
    },
    /// `DeleteJob`.
    Delete(String),
}

/// What an operation on the store comes to: the events to tell the core
/// first, then the calls to make.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Told before the calls are made.
    pub events: Vec<pb::EventStreamEvent>,
    /// Made in order; the first failure ends the operation.
    pub calls: Vec<Call>,
}

/// Why the store refused an operation (Manager's own answers to the same).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `NOT_FOUND`.
    #[error("bundle {0:?} is not stored")]
    UnknownBundle(String),
    /// `NOT_FOUND`.
    #[error("job {0:?} is not stored")]
    UnknownJob(String),
    /// `ALREADY_EXISTS`.
    #[error("bundle {0:?} was created with a different spec (use UpdateBundle)")]
    DifferentSpec(String),
    /// `FAILED_PRECONDITION`.
    #[error("{0}")]
    FailedPrecondition(String),
}

impl Refusal {
    /// The gRPC code Manager would answer with.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::UnknownBundle(_) | Self::UnknownJob(_) => tonic::Code::NotFound,
            Self::DifferentSpec(_) => tonic::Code::AlreadyExists,
            Self::FailedPrecondition(_) => tonic::Code::FailedPrecondition,
        }
    }
}

/// A bundle to hand to Manager's own store, with what the operator kept of
/// it.
#[derive(Clone, Debug, PartialEq)]
pub struct Handover {
    /// The bundle as applied.
    pub bundle: Bundle,
    /// Its verdict (broken), if any.
    pub verdict: Option<TerminalVerdict>,
    /// Its manual jobs started.
    pub started: Vec<BundleJobRef>,
    /// Its dropped jobs' verdicts.
    pub dropped: Vec<(JobId, TerminalVerdict)>,
    /// It is being deleted: Manager is to finish the deletion.
    pub deleting: bool,
}

/// One bundle as the store holds it.
#[derive(Clone, Debug)]
struct Stored {
    /// The bundle as it was applied.
    applied: Bundle,
    /// Whether Manager's own bundle store holds it too: a bundle created
    /// while Manager had none is handed to Manager when it gains one.
    on_manager: bool,
    /// As Manager's store would hold it: generation, state and verdict
    /// included.
    bundle: pb::Bundle,
    /// The digest of its spec ([`TAG_SPEC`]).
    digest: String,
    /// Its jobs as expanded, additions set, by id.
    expanded: BTreeMap<String, pb::Job>,
    /// Manual jobs started (`StartBundleJob`): no longer dormant.
    started: BTreeSet<String>,
    /// Dropped jobs' verdicts, by id.
    dropped: BTreeMap<String, pb::TerminalVerdict>,
}

/// The bundles the operator stores, and the last word Manager said of each
/// of their jobs.
#[derive(Debug, Default)]
pub struct BundleStore {
    bundles: BTreeMap<String, Stored>,
    /// Every bundle job Manager told of, as it told it, by id.
    jobs: BTreeMap<String, pb::JobWithHistory>,
}

impl BundleStore {
    /// `CreateBundle`: stored and expanded. The jobs Manager already holds
    /// for it (a restart, a leader change) are kept as they are when their
    /// spec digest matches — and a broken verdict the bundle comes with
    /// stands then — brought to the new revision when it does not; the
    /// missing ones are created.
    pub fn create(&mut self, bundle: &Bundle, now: UnixMillis) -> Result<Plan, Refusal> {
        let id = bundle.bundle_id.0.clone();
        let digest = spec_digest(bundle);
        if let Some(stored) = self.bundles.get(&id) {
            if stored.bundle.state == pb::BundleState::Deleting as i32 {
                return Err(Refusal::FailedPrecondition(format!(
                    "create bundle {id:?}: it is being deleted"
                )));
            }
            return if stored.digest == digest {
                Ok(Plan::default())
            } else {
                Err(Refusal::DifferentSpec(id))
            };
        }
        let held: Vec<&pb::Job> = self.jobs_of(&id).filter_map(|j| j.job.as_ref()).collect();
        let revision = held.iter().filter_map(|j| tag_u64(j, TAG_REVISION)).max();
        let same = !held.is_empty() && held.iter().all(|j| j.tags.get(TAG_SPEC) == Some(&digest));
        let generation = match revision {
            Some(r) if same => r,
            Some(r) => r + 1,
            None => 1,
        };
        let mut stored = self.store(bundle, digest, generation, now);
        // A verdict the caller recorded for this very spec stands: the
        // jobs Manager holds were written for it (a new term re-applying a
        // bundle that broke under the previous one).
        if same {
            stored.bundle.terminal_verdict = bundle
                .terminal_verdict
                .as_ref()
                .filter(|v| v.kind == VerdictKind::Broken)
                .map(wire::verdict_to_pb);
        }
        let mut plan = Plan {
            events: vec![bundle_updated(&stored.bundle)],
            calls: Vec::new(),
        };
        self.bundles.insert(id.clone(), stored);
        plan.calls = self.converge(&id);
        // Jobs kept back until the bundle was known are told now.
        let kept_back: Vec<String> = self.jobs_of(&id).map(|j| job_id_of(j).to_owned()).collect();
        plan.events.extend(kept_back.iter().filter_map(|j| self.retell(j)));
        Ok(plan)
    }

    /// `UpdateBundle`: a new revision, always live, verdicts cleared.
    pub fn update(&mut self, bundle: &Bundle, now: UnixMillis) -> Result<Plan, Refusal> {
        let id = bundle.bundle_id.0.clone();
        let Some(old) = self.bundles.get(&id) else {
            return Err(Refusal::UnknownBundle(id));
        };
        let generation = old.bundle.generation + 1;
        let started = old.started.clone();
        let mut stored = self.store(bundle, spec_digest(bundle), generation, now);
        stored.started = started
            .into_iter()
            .filter(|j| stored.expanded.contains_key(j))
            .collect();
        let events = vec![bundle_updated(&stored.bundle)];
        self.bundles.insert(id.clone(), stored);
        Ok(Plan {
            events,
            calls: self.converge(&id),
        })
    }

    /// `DeleteBundle`: the stop-then-delete saga. The bundle is deleting
    /// until Manager has deleted its last job ([`BundleStore::seen`] tells
    /// `bundle_deleted` then), or at once when Manager holds none.
    pub fn delete(&mut self, bundle_id: &str) -> Result<Plan, Refusal> {
        let Some(stored) = self.bundles.get_mut(bundle_id) else {
            // Jobs Manager runs of a bundle no longer stored anywhere (its
            // resource or document went while no operator ran): stopped
            // and deleted, or they would run unowned for ever.
            let held: Vec<&pb::JobWithHistory> = self.jobs_of(bundle_id).collect();
            if held.is_empty() {
                return Err(Refusal::UnknownBundle(bundle_id.to_owned()));
            }
            let mut plan = Plan {
                events: vec![bundle_deleted(bundle_id)],
                calls: Vec::new(),
            };
            for job in held {
                plan.calls.extend(stops(job));
                plan.calls.push(Call::Delete(job_id_of(job).to_owned()));
            }
            return Ok(plan);
        };
        stored.bundle.state = pb::BundleState::Deleting as i32;
        let mut plan = Plan {
            events: vec![bundle_updated(&stored.bundle)],
            calls: Vec::new(),
        };
        let held: Vec<&pb::JobWithHistory> = self.jobs_of(bundle_id).collect();
        if held.is_empty() {
            self.bundles.remove(bundle_id);
            plan.events.push(bundle_deleted(bundle_id));
            return Ok(plan);
        }
        for job in held {
            let job_id = job_id_of(job).to_owned();
            plan.calls.extend(stops(job));
            plan.calls.push(Call::Delete(job_id));
        }
        Ok(plan)
    }

    /// `StartBundleJob` / `StopBundleJob`: a manual job becomes placeable,
    /// or dormant again (its instance is the core's to stop).
    pub fn toggle(&mut self, job: &BundleJobRef, start: bool) -> Result<Plan, Refusal> {
        let job_id = crate::model::runtime_job_id(&job.bundle_id, job.replica_index, &job.job_name).0;
        let stored = self
            .bundles
            .get_mut(&job.bundle_id.0)
            .ok_or_else(|| Refusal::UnknownBundle(job.bundle_id.0.clone()))?;
        if !stored.expanded.contains_key(&job_id) {
            return Err(Refusal::UnknownJob(job_id));
        }
        if start {
            stored.started.insert(job_id.clone());
        } else {
            stored.started.remove(&job_id);
        }
        Ok(Plan {
            events: self.retell(&job_id).into_iter().collect(),
            calls: Vec::new(),
        })
    }

    /// `SetTerminalVerdict`: a broken bundle or a dropped job, refused for a
    /// generation that is no longer the bundle's (0: unconditional).
    pub fn verdict(
        &mut self,
        bundle_id: &str,
        job: Option<&JobId>,
        verdict: &TerminalVerdict,
        generation: u64,
    ) -> Result<Plan, Refusal> {
        let stored = self
            .bundles
            .get_mut(bundle_id)
            .ok_or_else(|| Refusal::UnknownBundle(bundle_id.to_owned()))?;
        if generation != 0 && generation != stored.bundle.generation {
            return Err(Refusal::FailedPrecondition(format!(
                "the verdict is for generation {generation} of bundle {bundle_id:?}, which is at {}",
                stored.bundle.generation
            )));
        }
        let verdict = wire::verdict_to_pb(verdict);
        let Some(job) = job else {
            stored.bundle.terminal_verdict = Some(verdict);
            return Ok(Plan {
                events: vec![bundle_updated(&stored.bundle)],
                calls: Vec::new(),
            });
        };
        if !stored.expanded.contains_key(&job.0) {
            return Err(Refusal::UnknownJob(job.0.clone()));
        }
        stored.dropped.insert(job.0.clone(), verdict);
        Ok(Plan {
            events: self.retell(&job.0).into_iter().collect(),
            calls: Vec::new(),
        })
    }

    /// A job event from Manager: recorded, and returned with what the
    /// store adds, or kept back (`None`) while its bundle is not stored. A
    /// plain job's event passes as it is. A job deleted while its bundle
    /// was deleting may end the saga (`bundle_deleted` follows it).
    pub fn seen(&mut self, event: Event) -> Vec<Event> {
        match event {
            Event::JobActive(pb::JobActive {
                job_with_history: Some(j),
            }) if is_bundle_job(&j) => self.record(j, |j| {
                Event::JobActive(pb::JobActive {
                    job_with_history: Some(j),
                })
            }),
            Event::JobPending(pb::JobPending {
                job_with_history: Some(j),
            }) if is_bundle_job(&j) => self.record(j, |j| {
                Event::JobPending(pb::JobPending {
                    job_with_history: Some(j),
                })
            }),
            Event::JobUpdated(pb::JobUpdated {
                job_with_history: Some(j),
            }) if is_bundle_job(&j) => self.record(j, |j| {
                Event::JobUpdated(pb::JobUpdated {
                    job_with_history: Some(j),
                })
            }),
            Event::JobOutOfWindow(pb::JobOutOfWindow {
                job_with_history: Some(j),
            }) if is_bundle_job(&j) => self.record(j, |j| {
                Event::JobOutOfWindow(pb::JobOutOfWindow {
                    job_with_history: Some(j),
                })
            }),
            Event::JobDeleted(deleted) => {
                let job_id = deleted.job_id.as_ref().map(|j| j.job_id.clone()).unwrap_or_default();
                let Some(gone) = self.jobs.remove(&job_id) else {
                    return vec![Event::JobDeleted(deleted)];
                };
                let bundle_id = gone.job.as_ref().and_then(bundle_of).unwrap_or_default();
                let mut events = Vec::new();
                if self.bundles.contains_key(&bundle_id) {
                    events.push(Event::JobDeleted(deleted));
                }
                let deleting = self
                    .bundles
                    .get(&bundle_id)
                    .is_some_and(|b| b.bundle.state == pb::BundleState::Deleting as i32);
                if deleting && self.jobs_of(&bundle_id).next().is_none() {
                    self.bundles.remove(&bundle_id);
                    events.extend(bundle_deleted(&bundle_id).event);
                }
                events
            }
            other => vec![other],
        }
    }

    /// A Manager event, on a Manager with its own bundle store: what it says
    /// of its bundles is followed here (the spec, generation, state and
    /// verdict of each; which manual jobs are started and which jobs are
    /// dropped), so the store holds them should Manager lose its store.
    pub fn mirror(&mut self, event: &Event) {
        match event {
            Event::BundleUpdated(pb::BundleUpdated { bundle: Some(b) }) => {
                let Ok(bundle) = wire::bundle_from_pb(b, &mut wire::Notes::new()) else {
                    return;
                };
                let digest = spec_digest(&bundle);
                let kept = self.bundles.remove(&b.bundle_id).filter(|s| s.digest == digest);
                // Expanded as of no particular time: a job of a scheduled
                // bundle that has to be written again is written `PRE` with
                // its date, and Manager opens its window at that date, or
                // at once when it has passed.
                let mut stored = self.store(&bundle, digest, b.generation, 0);
                if let Some(kept) = kept {
                    stored.started = kept.started;
                    stored.dropped = kept.dropped;
                }
                stored.on_manager = true;
                stored.bundle.state = b.state;
                stored.bundle.terminal_verdict = b.terminal_verdict.clone();
                self.bundles.insert(b.bundle_id.clone(), stored);
            }
            Event::BundleDeleted(deleted) => {
                self.bundles.remove(&deleted.bundle_id);
            }
            Event::JobActive(pb::JobActive {
                job_with_history: Some(j),
            })
            | Event::JobPending(pb::JobPending {
                job_with_history: Some(j),
            })
            | Event::JobUpdated(pb::JobUpdated {
                job_with_history: Some(j),
            })
            | Event::JobOutOfWindow(pb::JobOutOfWindow {
                job_with_history: Some(j),
            }) => {
                let Some(job) = j.job.as_ref() else { return };
                let Some(stored) = bundle_of(job).and_then(|b| self.bundles.get_mut(&b)) else {
                    return;
                };
                let id = job_id_of(j).to_owned();
                let Some(expanded) = stored.expanded.get(&id) else {
                    return;
                };
                if expanded.dormant && !job.dormant {
                    stored.started.insert(id.clone());
                } else {
                    stored.started.remove(&id);
                }
                match &job.terminal_verdict {
                    Some(v) => stored.dropped.insert(id, v.clone()),
                    None => stored.dropped.remove(&id),
                };
            }
            _ => {}
        }
    }

    /// Manager no longer has a bundle store (it was downgraded): every
    /// bundle is the operator's alone from now on.
    pub fn manager_forgot(&mut self) {
        for stored in self.bundles.values_mut() {
            stored.on_manager = false;
        }
    }

    /// The bundles to hand to a Manager that now has a bundle store: every
    /// live one held only here, with its verdict, started manual jobs and
    /// dropped jobs, and whether it is being deleted (Manager's store then
    /// finishes the deletion).
    pub fn to_hand_over(&self) -> Vec<Handover> {
        let mut notes = wire::Notes::new();
        self.bundles
            .values()
            .filter(|s| !s.on_manager)
            .map(|s| Handover {
                deleting: s.bundle.state == pb::BundleState::Deleting as i32,
                bundle: s.applied.clone(),
                verdict: s
                    .bundle
                    .terminal_verdict
                    .as_ref()
                    .map(|v| wire::verdict_from_pb(v, &mut notes)),
                started: s
                    .started
                    .iter()
                    .filter_map(|id| s.expanded.get(id)?.bundle_ref.as_ref())
                    .map(|r| BundleJobRef {
                        bundle_id: s.applied.bundle_id.clone(),
                        replica_index: r.replica_index,
                        job_name: r.job_name.clone(),
                    })
                    .collect(),
                dropped: s
                    .dropped
                    .iter()
                    .map(|(id, v)| (JobId(id.clone()), wire::verdict_from_pb(v, &mut notes)))
                    .collect(),
            })
            .collect()
    }

    /// Manager's store holds `bundle_id` now.
    pub fn handed_over(&mut self, bundle_id: &str) {
        if let Some(stored) = self.bundles.get_mut(bundle_id) {
            stored.on_manager = true;
        }
    }

    /// What a new stream's snapshot lacks from a Manager without a bundle
    /// store: every bundle stored here, told before its jobs.
    pub fn snapshot(&self) -> Vec<pb::EventStreamEvent> {
        self.bundles.values().map(|b| bundle_updated(&b.bundle)).collect()
    }

    /// Forgets Manager's word on every job: a new stream's snapshot tells
    /// it all again.
    pub fn reconnecting(&mut self) {
        self.jobs.clear();
    }

    fn store(&self, bundle: &Bundle, digest: String, generation: u64, now: UnixMillis) -> Stored {
        let mut pb_bundle = wire::bundle_to_pb(bundle);
        pb_bundle.state = pb::BundleState::Live as i32;
        pb_bundle.terminal_verdict = None;
        pb_bundle.generation = generation;
        let expanded = expand(&pb_bundle, now)
            .into_iter()
            .map(|mut job| {
                let id = job.job_id.as_ref().map(|j| j.job_id.clone()).unwrap_or_default();
                tag(&mut job, &digest, generation);
                (id, job)
            })
            .collect();
        Stored {
            applied: bundle.clone(),
            on_manager: false,
            bundle: pb_bundle,
            digest,
            expanded,
            started: BTreeSet::new(),
            dropped: BTreeMap::new(),
        }
    }

    /// The calls that bring Manager's jobs of `bundle_id` to its stored
    /// revision: missing jobs created, jobs of another revision updated,
    /// jobs no longer in the bundle stopped and deleted.
    fn converge(&self, bundle_id: &str) -> Vec<Call> {
        let Some(stored) = self.bundles.get(bundle_id) else {
            return Vec::new();
        };
        let mut calls = Vec::new();
        for (job_id, job) in &stored.expanded {
            let wanted = published(job);
            match self.jobs.get(job_id).and_then(|j| j.job.as_ref()) {
                None => calls.push(Call::Create(wanted)),
                Some(held) if held.tags.get(TAG_SPEC) != Some(&stored.digest) => {
                    // The window Manager keeps (pending, active, over) is
                    // Manager's; the new revision is dated as expanded.
                    let state = if held.state == pb::job::JobState::Post as i32 && same_date(held, &wanted) {
                        held.state
                    } else {
                        wanted.state
                    };
                    calls.push(Call::Update(pb::Job { state, ..wanted }));
                }
                Some(_) => {}
            }
        }
        for held in self.jobs_of(bundle_id) {
            let job_id = job_id_of(held);
            if !stored.expanded.contains_key(job_id) {
                calls.extend(stops(held));
                calls.push(Call::Delete(job_id.to_owned()));
            }
        }
        calls
    }

    fn record(&mut self, job: pb::JobWithHistory, wrap: impl Fn(pb::JobWithHistory) -> Event) -> Vec<Event> {
        let id = job_id_of(&job).to_owned();
        self.jobs.insert(id.clone(), job);
        self.enriched(&id).map(wrap).into_iter().collect()
    }

    /// `job_id` told again as Manager last told it, with what the store
    /// adds now.
    fn retell(&self, job_id: &str) -> Option<pb::EventStreamEvent> {
        self.enriched(job_id).map(|j| {
            wrap(Event::JobUpdated(pb::JobUpdated {
                job_with_history: Some(j),
            }))
        })
    }

    /// Manager's last word on `job_id` with the additions its bundle's
    /// expansion carries; none while the bundle is not stored (or no
    /// longer has the job).
    fn enriched(&self, job_id: &str) -> Option<pb::JobWithHistory> {
        let held = self.jobs.get(job_id)?;
        let job = held.job.as_ref()?;
        let stored = self.bundles.get(&bundle_of(job)?)?;
        let expanded = stored.expanded.get(job_id)?;
        let mut job = job.clone();
        job.bundle_ref = expanded.bundle_ref.clone();
        job.requirements = expanded.requirements.clone();
        job.template = expanded.template.clone();
        job.dormant = expanded.dormant && !stored.started.contains(job_id);
        job.terminal_verdict = stored.dropped.get(job_id).cloned();
        job.intra_replica = expanded.intra_replica.clone();
        job.parameters = expanded.parameters.clone();
        Some(pb::JobWithHistory {
            job: Some(job),
            history_entry: held.history_entry.clone(),
        })
    }

    fn jobs_of<'a>(&'a self, bundle_id: &'a str) -> impl Iterator<Item = &'a pb::JobWithHistory> + 'a {
        self.jobs
            .values()
            .filter(move |j| j.job.as_ref().and_then(bundle_of).is_some_and(|b| b == bundle_id))
    }
}

/// The digest of a bundle's spec as Manager stores it (which manual jobs
/// run is not part of it): 64-bit FNV-1a of its canonical JSON, which is
/// stable across builds (the standard hasher is not promised to be).
pub fn spec_digest(bundle: &Bundle) -> String {
    let spec = bundle.spec.with_started(&BTreeSet::new());
    let json = serde_json::to_vec(&spec).unwrap_or_default();
    let digest = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{digest:016x}")
}

/// Sets the tags that say which bundle, replica, job and revision `job` is.
fn tag(job: &mut pb::Job, digest: &str, generation: u64) {
    let Some(bundle_ref) = job.bundle_ref.clone() else {
        return;
    };
    job.tags.insert(TAG_BUNDLE.to_owned(), bundle_ref.bundle_id);
    job.tags
        .insert(TAG_REPLICA.to_owned(), bundle_ref.replica_index.to_string());
    job.tags.insert(TAG_JOB.to_owned(), bundle_ref.job_name);
    job.tags.insert(TAG_REVISION.to_owned(), generation.to_string());
    job.tags.insert(TAG_SPEC.to_owned(), digest.to_owned());
}

/// The job as a published Manager stores it: the published fields only.
fn published(job: &pb::Job) -> pb::Job {
    pb::Job {
        job_id: job.job_id.clone(),
        description: job.description.clone(),
        tags: job.tags.clone(),
        start_date_time: job.start_date_time,
        state: job.state,
        ..Default::default()
    }
}

fn same_date(a: &pb::Job, b: &pb::Job) -> bool {
    a.start_date_time == b.start_date_time
}

fn is_bundle_job(job: &pb::JobWithHistory) -> bool {
    job.job.as_ref().and_then(bundle_of).is_some()
}

/// The bundle a Manager job was expanded from: its tag says, or — a job
/// written by a Manager's own bundle store, which tags nothing, and kept
/// by that Manager downgraded to the published API — its id does, which
/// is always `<namespace>/<name>/<replica index>/<job name>`.
fn bundle_of(job: &pb::Job) -> Option<String> {
    if let Some(bundle) = job.tags.get(TAG_BUNDLE) {
        return Some(bundle.clone());
    }
    let id = job.job_id.as_ref()?.job_id.as_str();
    let parts: Vec<&str> = id.split('/').collect();
    match parts.as_slice() {
        [namespace, name, replica, job_name]
            if !namespace.is_empty() && !name.is_empty() && !job_name.is_empty() && replica.parse::<u32>().is_ok() =>
        {
            Some(format!("{namespace}/{name}"))
        }
        _ => None,
    }
}

fn tag_u64(job: &pb::Job, name: &str) -> Option<u64> {
    job.tags.get(name)?.parse().ok()
}

fn job_id_of(job: &pb::JobWithHistory) -> &str {
    job.job
        .as_ref()
        .and_then(|j| j.job_id.as_ref())
        .map_or("", |id| id.job_id.as_str())
}

/// The `StopJob`s of every instance of `job` that Manager's history shows
/// provisioned or running and not yet stopping.
fn stops(job: &pb::JobWithHistory) -> Vec<Call> {
    let mut live: BTreeMap<String, String> = BTreeMap::new();
    for entry in job.history_entry.iter().filter_map(|e| e.history_entry.as_ref()) {
        let node = |m: &Option<common::NodeMetadata>| {
            m.as_ref()
                .and_then(|m| m.node_id.as_ref())
                .map(|n| n.node_id.clone())
                .unwrap_or_default()
        };
        match entry {
            HistoryEntry::JobProvisioned(e) => {
                live.insert(e.role.clone(), node(&e.node_metadata));
            }
            HistoryEntry::JobRunning(e) => {
                live.insert(e.role.clone(), node(&e.node_metadata));
            }
            HistoryEntry::JobStopping(e) => {
                live.remove(&e.role);
            }
            HistoryEntry::JobStopped(e) => {
                live.remove(&e.role);
            }
            _ => {}
        }
    }
    live.into_iter()
        .map(|(role, node_id)| Call::Stop {
            job_id: job_id_of(job).to_owned(),
            role,
            node_id,
        })
        .collect()
}

fn wrap(event: Event) -> pb::EventStreamEvent {
    pb::EventStreamEvent { event: Some(event) }
}

fn bundle_updated(bundle: &pb::Bundle) -> pb::EventStreamEvent {
    wrap(Event::BundleUpdated(pb::BundleUpdated {
        bundle: Some(bundle.clone()),
    }))
}

fn bundle_deleted(bundle_id: &str) -> pb::EventStreamEvent {
    wrap(Event::BundleDeleted(pb::BundleDeleted {
        bundle_id: bundle_id.to_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::wire::{job_id_to_pb, millis_to_pb};

    fn bundle(bitrate: &str, verdict: Option<&str>) -> Bundle {
        Bundle {
            bundle_id: "ns/ch1".into(),
            spec: yaml_serde::from_str(&format!(
                "pool: p\njobs:\n  - {{jobName: encode, parameters: {{bitrate: '{bitrate}'}}}}\n"
            ))
            .expect("spec parses"),
            terminal_verdict: verdict.map(|reason| TerminalVerdict {
                kind: VerdictKind::Broken,
                reason: reason.to_owned(),
                at: None,
            }),
            ..Bundle::default()
        }
    }

    /// Manager's word on a job the store wrote: what `call` created, as a
    /// published Manager holds it, running on `node`.
    fn held(call: &Call, node: &str) -> Event {
        let Call::Create(job) = call else {
            panic!("not a create: {call:?}");
        };
        let running = pb::JobHistoryEntry {
            history_entry: Some(HistoryEntry::JobRunning(pb::JobHistoryJobRunning {
                timestamp: Some(millis_to_pb(1)),
                role: "primary".into(),
                node_metadata: Some(common::NodeMetadata {
                    node_id: Some(common::NodeId { node_id: node.into() }),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        };
        Event::JobActive(pb::JobActive {
            job_with_history: Some(pb::JobWithHistory {
                job: Some(job.clone()),
                history_entry: vec![running],
            }),
        })
    }

    fn told_bundle(events: &[pb::EventStreamEvent]) -> pb::Bundle {
        events
            .iter()
            .find_map(|e| match &e.event {
                Some(Event::BundleUpdated(b)) => b.bundle.clone(),
                _ => None,
            })
            .expect("bundle_updated told")
    }

    #[test]
    fn a_new_term_keeps_what_runs_and_a_recorded_verdict_only_for_an_unchanged_spec() {
        // The first term writes the job.
        let mut first = BundleStore::default();
        let plan = first.create(&bundle("5000", None), 0).expect("created");
        assert_eq!(plan.calls.len(), 1);
        let job = held(&plan.calls[0], "n1");
        let Call::Create(written) = &plan.calls[0] else {
            unreachable!()
        };
        assert!(
            written.bundle_ref.is_none() && written.requirements.is_none(),
            "published fields only"
        );
        assert_eq!(written.tags[TAG_REVISION], "1");

        // A new term hears the job before its Bundle: kept back.
        let mut next = BundleStore::default();
        assert!(next.seen(job.clone()).is_empty());
        // The Bundle applied with the verdict its status records, for the
        // same spec: nothing is written, the verdict stands, the job is told
        // with its spec.
        let plan = next
            .create(&bundle("5000", Some("restart ceiling")), 0)
            .expect("created");
        assert!(plan.calls.is_empty(), "{:?}", plan.calls);
        let told = told_bundle(&plan.events);
        assert_eq!(told.generation, 1);
        assert_eq!(
            told.terminal_verdict.map(|v| v.reason),
            Some("restart ceiling".to_owned())
        );
        let Some(Event::JobUpdated(pb::JobUpdated {
            job_with_history: Some(j),
        })) = &plan.events[1].event
        else {
            panic!("the kept-back job is told: {:?}", plan.events);
        };
        assert!(
            j.job.as_ref().is_some_and(|j| j.bundle_ref.is_some()),
            "told with its spec"
        );
        assert_eq!(j.history_entry.len(), 1, "and Manager's history");

        // A spec changed while no operator ran: a new revision, the verdict
        // void (an update revives).
        let mut changed = BundleStore::default();
        changed.seen(job);
        let plan = changed
            .create(&bundle("3000", Some("restart ceiling")), 0)
            .expect("created");
        assert!(told_bundle(&plan.events).terminal_verdict.is_none());
        assert_eq!(told_bundle(&plan.events).generation, 2);
        let [Call::Update(rewritten)] = plan.calls.as_slice() else {
            panic!("one update: {:?}", plan.calls);
        };
        assert_eq!(rewritten.tags[TAG_REVISION], "2");
        assert_eq!(rewritten.job_id, Some(job_id_to_pb(&"ns/ch1/0/encode".into())));
    }

    #[test]
    fn a_delete_stops_what_runs_deletes_the_jobs_and_ends_when_manager_has() {
        let mut store = BundleStore::default();
        let plan = store.create(&bundle("5000", None), 0).expect("created");
        store.seen(held(&plan.calls[0], "n1"));
        let plan = store.delete("ns/ch1").expect("deleting");
        assert_eq!(told_bundle(&plan.events).state, pb::BundleState::Deleting as i32);
        assert_eq!(
            plan.calls,
            [
                Call::Stop {
                    job_id: "ns/ch1/0/encode".into(),
                    role: "primary".into(),
                    node_id: "n1".into(),
                },
                Call::Delete("ns/ch1/0/encode".into()),
            ]
        );
        let ended = store.seen(Event::JobDeleted(pb::JobDeleted {
            job_id: Some(job_id_to_pb(&"ns/ch1/0/encode".into())),
        }));
        assert!(
            matches!(ended.as_slice(), [Event::JobDeleted(_), Event::BundleDeleted(b)] if b.bundle_id == "ns/ch1"),
            "{ended:?}"
        );
        assert!(store.snapshot().is_empty(), "the bundle is no longer stored");
    }

    #[test]
    fn a_bundle_followed_on_a_full_manager_is_carried_on_after_a_downgrade_and_handed_back_after_an_upgrade() {
        let mut store = BundleStore::default();
        let applied = bundle("5000", None);
        let mut on_manager = wire::bundle_to_pb(&applied);
        on_manager.generation = 3;
        store.mirror(&Event::BundleUpdated(pb::BundleUpdated {
            bundle: Some(on_manager),
        }));
        assert!(store.to_hand_over().is_empty(), "Manager's store holds it");

        // Downgraded: the job Manager kept, untagged, is known by its id and
        // told with its bundle's additions.
        store.manager_forgot();
        assert_eq!(told_bundle(&store.snapshot()).generation, 3, "the revision carries on");
        let kept = pb::Job {
            job_id: Some(job_id_to_pb(&"ns/ch1/0/encode".into())),
            ..Default::default()
        };
        let told = store.seen(held(&Call::Create(kept), "n1"));
        let [Event::JobActive(active)] = told.as_slice() else {
            panic!("the job is told: {told:?}");
        };
        let job = active
            .job_with_history
            .as_ref()
            .and_then(|j| j.job.as_ref())
            .expect("job");
        assert_eq!(job.bundle_ref.as_ref().map(|r| r.bundle_id.as_str()), Some("ns/ch1"));

        // Upgraded: handed back once.
        let handover = store.to_hand_over();
        assert_eq!(handover.len(), 1);
        assert_eq!(handover[0].bundle.bundle_id, applied.bundle_id);
        store.handed_over("ns/ch1");
        assert!(store.to_hand_over().is_empty(), "handed over once");
    }

    #[test]
    fn a_job_id_names_its_bundle_only_in_the_bundle_job_form() {
        let job = |id: &str| pb::Job {
            job_id: Some(job_id_to_pb(&id.into())),
            ..Default::default()
        };
        assert_eq!(bundle_of(&job("ns/ch1/1/encode")).as_deref(), Some("ns/ch1"));
        assert_eq!(bundle_of(&job("ns/ch1/x/encode")), None, "the replica is a number");
        assert_eq!(bundle_of(&job("plain-job")), None);
        assert_eq!(bundle_of(&job("a/b/0/c/d")), None);
    }
}
