//! The job store: create, update, delete, complete and search, as Manager
//! keeps plain jobs (bundle jobs live in the same store). Deleting a job
//! with live instances stops them first; the job goes once the last has
//! stopped (the same mechanism finishes a bundle's stop-then-delete saga).
//!
//! A job's window: a `PRE` job with a `start_date_time` is announced with
//! `job_pending` and turns `ACTIVE` at that date (`job_active`), as Manager
//! streams it; `CompleteJob` ends the window (`POST`).

use std::collections::BTreeSet;

use super::{SimJob, World, job_id_of, job_ref, millis, node_ref, required, timestamp};
use crate::manager::proto::manager::{
    self as pb, date_filter, event_stream_event::Event, id_filter, job::JobState, job_filter,
    job_history_entry::HistoryEntry, job_history_job_stopping::Reason as StopReason, tag_filter,
};
use crate::sim::RequestError;

impl World {
    /// `CreateJob`: stores a job; creating an identical job again is a
    /// no-op, a different one with the same id is ALREADY_EXISTS. The hash
    /// is the job's revision (1 on create, +1 per update).
    pub fn create_job(&mut self, mut job: pb::Job) -> Result<pb::JobHash, RequestError> {
        let job_id = required(job_id_of(&job.job_id), "job_id")?.to_owned();
        if let Some(existing) = self.jobs.get(&job_id) {
            job.current_hash = existing.job.current_hash;
            if existing.job == job {
                return Ok(pb::JobHash { hash: job.current_hash });
            }
            return Err(RequestError::AlreadyExists {
                what: format!("job {job_id:?}"),
                why: "it was created with a different spec (use UpdateJob)".to_owned(),
            });
        }
        job.current_hash = 1;
        self.insert_job(job);
        Ok(pb::JobHash { hash: 1 })
    }

    /// Stores a new job with its creation in the history and streams it.
    pub(super) fn insert_job(&mut self, job: pb::Job) {
        let job_id = job_id_of(&job.job_id).to_owned();
        let created = HistoryEntry::JobCreated(pb::JobHistoryJobCreated {
            timestamp: Some(timestamp(self.now())),
        });
        let stored = SimJob {
            job,
            history: vec![pb::JobHistoryEntry {
                history_entry: Some(created),
            }],
        };
        self.emit(job_event(&stored));
        self.jobs.insert(job_id.clone(), stored);
        self.arm_window(&job_id);
    }

    /// A `PRE` job with a date turns `ACTIVE` at it: the timer is set
    /// whenever a job is stored or replaced (a re-dated job's earlier timer
    /// finds the date moved and does nothing).
    fn arm_window(&mut self, job_id: &str) {
        let Some(job) = self.jobs.get(job_id).map(|j| &j.job) else {
            return;
        };
        if job.state != JobState::Pre as i32 {
            return;
        }
        if let Some(start) = job.start_date_time.as_ref().map(millis) {
            let delay = start - self.now();
            self.schedule(delay, super::Action::WindowOpens(job_id.to_owned()));
        }
    }

    /// A `PRE` job's date has come: it is `ACTIVE` from now on
    /// (`job_active`). A job re-dated later, completed or deleted meanwhile
    /// is left as it is.
    pub(super) fn open_window(&mut self, job_id: &str) {
        let now = self.now();
        let Some(stored) = self.jobs.get_mut(job_id) else {
            return;
        };
        let due = stored
            .job
            .start_date_time
            .as_ref()
            .map(millis)
            .is_some_and(|s| s <= now);
        if stored.job.state != JobState::Pre as i32 || !due {
            return;
        }
        stored.job.state = JobState::Active as i32;
        let event = job_event(stored);
        self.emit(event);
    }

    /// `UpdateJob`: replaces the job, keeping its history (with the previous
    /// job in a `JobUpdated` entry).
    pub fn update_job(&mut self, job: pb::Job) -> Result<pb::JobHash, RequestError> {
        let job_id = required(job_id_of(&job.job_id), "job_id")?.to_owned();
        self.job(&job_id)?;
        Ok(pb::JobHash {
            hash: self.replace_job(&job_id, job),
        })
    }

    /// Replaces a stored job (which must exist) and streams it; returns the
    /// new revision.
    pub(super) fn replace_job(&mut self, job_id: &str, mut job: pb::Job) -> i64 {
        let now = self.now();
        let Some(stored) = self.jobs.get_mut(job_id) else {
            return 0;
        };
        job.current_hash = stored.job.current_hash + 1;
        let previous = std::mem::replace(&mut stored.job, job);
        stored.history.push(pb::JobHistoryEntry {
            history_entry: Some(HistoryEntry::JobUpdated(pb::JobHistoryJobUpdated {
                timestamp: Some(timestamp(now)),
                previous_job: Some(previous),
            })),
        });
        let hash = stored.job.current_hash;
        self.emit_job_updated(job_id);
        self.arm_window(job_id);
        hash
    }

    /// `DeleteJob`: stops the job's instances, then deletes it.
    pub fn delete_job(&mut self, job_id: &str) -> Result<(), RequestError> {
        self.job(job_id)?;
        self.doom_job(job_id);
        self.reap();
        Ok(())
    }

    /// Marks a job for deletion and stops its live instances; `reap`
    /// deletes it once none is left.
    pub(super) fn doom_job(&mut self, job_id: &str) {
        self.doomed.insert(job_id.to_owned());
        let roles: Vec<String> = self.live_instances_of(job_id).map(|(r, _)| r.to_owned()).collect();
        for role in roles {
            self.stop_instance(job_id, &role, StopReason::JobStoppedUserRequested);
        }
    }

    /// `CompleteJob`: the job's window is over: its instances stop and it
    /// moves to POST.
    pub fn complete_job(&mut self, job_id: &str) -> Result<(), RequestError> {
        self.job(job_id)?;
        let roles: Vec<String> = self.live_instances_of(job_id).map(|(r, _)| r.to_owned()).collect();
        for role in roles {
            self.stop_instance(job_id, &role, StopReason::JobStoppedUserRequested);
        }
        let now = self.now();
        if let Some(stored) = self.jobs.get_mut(job_id) {
            stored.job.state = JobState::Post as i32;
            stored.history.push(pb::JobHistoryEntry {
                history_entry: Some(HistoryEntry::JobCompleted(pb::JobHistoryJobCompleted {
                    timestamp: Some(timestamp(now)),
                })),
            });
        }
        self.emit_job_updated(job_id);
        Ok(())
    }

    /// `JobSearch`: every job matching all filters, with its live instances.
    pub fn job_search(&self, req: &pb::JobSearchRequest) -> Result<Vec<pb::CurrentJob>, RequestError> {
        let filters: Vec<&job_filter::JobFilter> =
            req.job_filter.iter().filter_map(|f| f.job_filter.as_ref()).collect();
        let mut found = Vec::new();
        for (job_id, stored) in &self.jobs {
            let mut matched = true;
            for filter in &filters {
                matched &= matches(job_id, &stored.job, filter)?;
            }
            if matched {
                found.push(pb::CurrentJob {
                    job: Some(stored.job.clone()),
                    instances: self
                        .live_instances_of(job_id)
                        .map(|(role, i)| pb::RunningJob {
                            job_key: Some(super::instances::active_key(job_id, role)),
                            node_id: node_ref(&i.node_id),
                        })
                        .collect(),
                });
            }
        }
        Ok(found)
    }

    /// Deletes doomed jobs that have no instance left, then bundles whose
    /// stop-then-delete saga has no job left: `job_deleted` for each job,
    /// then `bundle_deleted`. A deleting bundle's jobs all go together, once
    /// every instance of every one of them has stopped: stop, then delete.
    pub(super) fn reap(&mut self) {
        let busy: BTreeSet<String> = self
            .deleting
            .iter()
            .filter(|b| {
                self.bundle_job_ids(b)
                    .any(|j| self.live_instances_of(j).next().is_some())
            })
            .cloned()
            .collect();
        let ready: Vec<String> = self
            .doomed
            .iter()
            .filter(|job| self.live_instances_of(job).next().is_none())
            .filter(|job| {
                let bundle = self.jobs.get(*job).and_then(|j| bundle_of(&j.job));
                bundle.is_none_or(|b| !busy.contains(b))
            })
            .cloned()
            .collect();
        for job_id in ready {
            self.doomed.remove(&job_id);
            if self.jobs.remove(&job_id).is_some() {
                self.rejections.remove(&job_id);
                self.behaviours.remove(&job_id);
                self.emit(Event::JobDeleted(pb::JobDeleted {
                    job_id: job_ref(&job_id),
                }));
            }
        }
        let finished: Vec<String> = self
            .deleting
            .iter()
            .filter(|b| self.bundle_job_ids(b).next().is_none())
            .cloned()
            .collect();
        for bundle_id in finished {
            self.deleting.remove(&bundle_id);
            self.bundles.remove(&bundle_id);
            self.emit(Event::BundleDeleted(pb::BundleDeleted { bundle_id }));
        }
    }

    /// The ids of a bundle's runtime jobs (`<bundle id>/<replica>/<name>`,
    /// so a range of the ordered store).
    pub(super) fn bundle_job_ids<'a>(&'a self, bundle_id: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        let prefix = format!("{bundle_id}/");
        self.jobs
            .range(prefix.clone()..)
            .take_while(move |(id, _)| id.starts_with(&prefix))
            .filter(move |(_, j)| bundle_of(&j.job) == Some(bundle_id))
            .map(|(id, _)| id)
    }

    /// The job `job_id`, or NOT_FOUND.
    pub(super) fn job(&self, job_id: &str) -> Result<&SimJob, RequestError> {
        let job_id = required(job_id, "job_id")?;
        self.jobs
            .get(job_id)
            .ok_or_else(|| RequestError::UnknownJob(job_id.to_owned()))
    }
}

/// The bundle a job was expanded from.
pub(crate) fn bundle_of(job: &pb::Job) -> Option<&str> {
    job.bundle_ref.as_ref().map(|r| r.bundle_id.as_str())
}

/// The event a job is announced with: active, pending (before its window)
/// or out of window (completed).
pub(crate) fn job_event(job: &SimJob) -> Event {
    let with_history = Some(job.with_history());
    match JobState::try_from(job.job.state) {
        Ok(JobState::Pre) => Event::JobPending(pb::JobPending {
            job_with_history: with_history,
        }),
        Ok(JobState::Post) => Event::JobOutOfWindow(pb::JobOutOfWindow {
            job_with_history: with_history,
        }),
        _ => Event::JobActive(pb::JobActive {
            job_with_history: with_history,
        }),
    }
}

fn matches(job_id: &str, job: &pb::Job, filter: &job_filter::JobFilter) -> Result<bool, RequestError> {
    let regex = || RequestError::Unsupported("regular-expression job filters".to_owned());
    Ok(match filter {
        job_filter::JobFilter::IdFilter(f) => match &f.comparison {
            Some(id_filter::Comparison::Eq(v)) => job_id == v,
            Some(id_filter::Comparison::Neq(v)) => job_id != v,
            Some(id_filter::Comparison::Re(_)) => return Err(regex()),
            None => true,
        },
        job_filter::JobFilter::TagFilter(f) => {
            let tag = job.tags.get(&f.tag_name);
            match &f.comparison {
                Some(tag_filter::Comparison::Eq(v)) => tag == Some(v),
                Some(tag_filter::Comparison::Neq(v)) => tag != Some(v),
                Some(tag_filter::Comparison::Exists(e)) => tag.is_some() == *e,
                Some(tag_filter::Comparison::Re(_)) => return Err(regex()),
                None => true,
            }
        }
        job_filter::JobFilter::DateFilter(f) => {
            let Some(start) = job.start_date_time.as_ref().map(millis) else {
                return Ok(false);
            };
            match &f.comparison {
                Some(date_filter::Comparison::Eq(t)) => start == millis(t),
                Some(date_filter::Comparison::Lt(t)) => start < millis(t),
                Some(date_filter::Comparison::Lte(t)) => start <= millis(t),
                Some(date_filter::Comparison::Gt(t)) => start > millis(t),
                Some(date_filter::Comparison::Gte(t)) => start >= millis(t),
                Some(date_filter::Comparison::Within(w)) => {
                    w.start_date.as_ref().is_none_or(|s| start >= millis(s))
                        && w.end_date.as_ref().is_none_or(|e| start <= millis(e))
                }
                None => true,
            }
        }
    })
}
