//! Bundles: stored as sent, expanded into one runtime job per (replica, job
//! name) with id `<bundle id>/<replica index>/<job name>` (replica 1, the
//! backup, only with a resilience policy), revised by updates, and removed
//! by the stop-then-delete saga. Terminal verdicts are recorded here too.
//!
//! A scheduled bundle's jobs carry its start as their `start_date_time`:
//! `PRE` before it (announced with `job_pending`), `ACTIVE` from it (see
//! `jobs.rs`). An update that changes the schedule re-dates them; one that
//! keeps it leaves a completed (`POST`) job completed.

use std::collections::BTreeMap;

use super::{World, job_id_of, job_ref, required, timestamp};
use crate::manager::expansion::{expand, replica_count};
use crate::manager::port::bundles::TAG_REVISION;
use crate::manager::proto::manager::{self as pb, event_stream_event::Event, job::JobState};
use crate::model::{BundleId, runtime_job_id};
use crate::sim::RequestError;

impl World {
    /// `CreateBundle`: stores the bundle (state live) and expands it.
    /// Idempotent for an identical spec; a different spec under the same id
    /// is ALREADY_EXISTS.
    ///
    /// Jobs already stored under the expansion's ids (an operator expanded
    /// the bundle itself while this Manager spoke only the published API)
    /// are adopted, not recreated: each keeps its history — so its running
    /// instances stay where they run — and its window, and is brought to
    /// the bundle's spec. The bundle continues the revision those jobs were
    /// written for (their `automanager.norsk.video/revision` tag), so a
    /// verdict judged for that revision still stands; a bundle with none is
    /// at generation 1.
    pub fn create_bundle(&mut self, bundle: pb::Bundle) -> Result<pb::BundleAck, RequestError> {
        validate(&bundle)?;
        let bundle_id = bundle.bundle_id.clone();
        if let Some(existing) = self.bundles.get(&bundle_id) {
            if existing.state == pb::BundleState::Deleting as i32 {
                return Err(RequestError::FailedPrecondition {
                    what: format!("create bundle {bundle_id:?}"),
                    why: "it is being deleted".to_owned(),
                });
            }
            if same_spec(existing, &bundle) {
                return Ok(ack(existing));
            }
            return Err(RequestError::AlreadyExists {
                what: format!("bundle {bundle_id:?}"),
                why: "it was created with a different spec (use UpdateBundle)".to_owned(),
            });
        }
        let now = self.now();
        let adopted: Vec<&pb::Job> = expand(&bundle, now)
            .iter()
            .filter_map(|j| self.jobs.get(job_id_of(&j.job_id)))
            .map(|j| &j.job)
            .collect();
        let generation = adopted
            .iter()
            .filter_map(|j| j.tags.get(TAG_REVISION)?.parse::<u64>().ok())
            .max()
            .unwrap_or(1);
        let stored = pb::Bundle {
            state: pb::BundleState::Live as i32,
            terminal_verdict: None,
            generation,
            ..bundle
        };
        self.bundles.insert(bundle_id.clone(), stored.clone());
        self.emit(Event::BundleUpdated(pb::BundleUpdated {
            bundle: Some(stored.clone()),
        }));
        self.write_expansion(&stored, false, true);
        self.audit("bundle.create", &bundle_id, &[("generation", generation.to_string())]);
        Ok(ack(&stored))
    }

    /// `UpdateBundle`: the new spec, state live, verdict cleared, the
    /// generation bumped; jobs the new spec adds are created, changed ones
    /// updated, and removed ones stopped then deleted.
    pub fn update_bundle(&mut self, bundle: pb::Bundle) -> Result<pb::BundleAck, RequestError> {
        validate(&bundle)?;
        let bundle_id = bundle.bundle_id.clone();
        let existing = self
            .bundles
            .get(&bundle_id)
            .ok_or_else(|| RequestError::UnknownBundle(bundle_id.clone()))?;
        if existing.state == pb::BundleState::Deleting as i32 {
            return Err(RequestError::FailedPrecondition {
                what: format!("update bundle {bundle_id:?}"),
                why: "it is being deleted".to_owned(),
            });
        }
        let rescheduled = existing.schedule != bundle.schedule;
        let stored = pb::Bundle {
            // A spec update is a revival by definition.
            state: pb::BundleState::Live as i32,
            terminal_verdict: None,
            generation: existing.generation + 1,
            ..bundle
        };
        self.bundles.insert(bundle_id.clone(), stored.clone());
        self.emit(Event::BundleUpdated(pb::BundleUpdated {
            bundle: Some(stored.clone()),
        }));
        self.write_expansion(&stored, rescheduled, false);
        self.audit(
            "bundle.update",
            &bundle_id,
            &[("generation", stored.generation.to_string())],
        );
        Ok(ack(&stored))
    }

    /// Brings the stored jobs to `bundle`'s expansion: missing jobs are
    /// created, changed ones replaced (their history, and so their
    /// instances, kept), and jobs the bundle no longer has stopped then
    /// deleted. `rescheduled`: the bundle's schedule changed, so a job
    /// whose window is over is re-dated rather than kept over. `adopting`:
    /// the bundle is being created over jobs stored without it.
    fn write_expansion(&mut self, bundle: &pb::Bundle, rescheduled: bool, adopting: bool) {
        let expanded: BTreeMap<String, pb::Job> = expand(bundle, self.now())
            .into_iter()
            .map(|j| (job_id_of(&j.job_id).to_owned(), j))
            .collect();
        let removed: Vec<String> = self
            .bundle_job_ids(&bundle.bundle_id)
            .filter(|id| !expanded.contains_key(*id))
            .cloned()
            .collect();
        for (job_id, mut job) in expanded {
            let Some(current) = self.jobs.get(&job_id) else {
                self.insert_job(job);
                continue;
            };
            // A manual job keeps its runtime toggle (StartBundleJob); an auto
            // job is never dormant. A job being adopted had no toggle here:
            // it is dormant as the bundle says until started.
            if !adopting {
                job.dormant = job.dormant && current.job.dormant;
            }
            // A completed job's window is over until a new schedule opens
            // another.
            if !rescheduled && current.job.state == JobState::Post as i32 {
                job.state = JobState::Post as i32;
            }
            job.current_hash = current.job.current_hash;
            self.doomed.remove(&job_id);
            if current.job != job {
                self.replace_job(&job_id, job);
            }
        }
        for job_id in removed {
            self.doom_job(&job_id);
        }
        self.reap();
    }

    /// `DeleteBundle`: the stop-then-delete saga. The bundle goes to
    /// DELETING, every instance of its jobs is stopped, then each job is
    /// deleted and finally the bundle (`bundle_deleted`). Idempotent.
    pub fn delete_bundle(&mut self, bundle_id: &str) -> Result<(), RequestError> {
        let bundle_id = required(bundle_id, "bundle_id")?.to_owned();
        let bundle = self
            .bundles
            .get_mut(&bundle_id)
            .ok_or_else(|| RequestError::UnknownBundle(bundle_id.clone()))?;
        if bundle.state == pb::BundleState::Deleting as i32 {
            return Ok(());
        }
        bundle.state = pb::BundleState::Deleting as i32;
        let snapshot = bundle.clone();
        self.emit(Event::BundleUpdated(pb::BundleUpdated { bundle: Some(snapshot) }));
        self.audit("bundle.delete", &bundle_id, &[]);
        self.deleting.insert(bundle_id.clone());
        let jobs: Vec<String> = self.bundle_job_ids(&bundle_id).cloned().collect();
        for job_id in jobs {
            self.doom_job(&job_id);
        }
        self.reap();
        Ok(())
    }

    /// `StartBundleJob` / `StopBundleJob`: flips a bundle job's dormant flag
    /// (a running worker is not stopped). A call that changes nothing emits
    /// nothing.
    pub fn set_bundle_job_dormant(&mut self, r: &pb::BundleJobRef, dormant: bool) -> Result<(), RequestError> {
        let bundle_id = required(&r.bundle_id, "bundle_id")?;
        required(&r.job_name, "job_name")?;
        if !self.bundles.contains_key(bundle_id) {
            return Err(RequestError::UnknownBundle(bundle_id.to_owned()));
        }
        let job_id = runtime_job_id(&BundleId::from(bundle_id), r.replica_index, &r.job_name).0;
        let stored = self
            .jobs
            .get_mut(&job_id)
            .ok_or_else(|| RequestError::UnknownJob(job_id.clone()))?;
        if stored.job.dormant != dormant {
            stored.job.dormant = dormant;
            self.emit_job_updated(&job_id);
        }
        Ok(())
    }

    /// `SetTerminalVerdict`: on the job when one is named (dropped), else on
    /// the bundle (broken); refused for a generation the bundle has left.
    pub fn set_terminal_verdict(&mut self, req: pb::SetTerminalVerdictRequest) -> Result<(), RequestError> {
        let bundle_id = required(&req.bundle_id, "bundle_id")?.to_owned();
        let mut verdict = req.verdict.ok_or(RequestError::MissingField("verdict"))?;
        if verdict.at.is_none() {
            verdict.at = Some(timestamp(self.now()));
        }
        let kind = pb::VerdictKind::try_from(verdict.kind)
            .map(|k| k.as_str_name().to_owned())
            .unwrap_or_else(|_| verdict.kind.to_string());
        let bundle = self
            .bundles
            .get_mut(&bundle_id)
            .ok_or_else(|| RequestError::UnknownBundle(bundle_id.clone()))?;
        if req.generation != 0 && req.generation != bundle.generation {
            return Err(RequestError::FailedPrecondition {
                what: format!("verdict for bundle {bundle_id:?} generation {}", req.generation),
                why: format!(
                    "the bundle is at generation {} (an update clears verdicts)",
                    bundle.generation
                ),
            });
        }
        let job_id = job_id_of(&req.job_id).to_owned();
        let subject = if job_id.is_empty() {
            bundle.terminal_verdict = Some(verdict.clone());
            let snapshot = bundle.clone();
            self.emit(Event::BundleUpdated(pb::BundleUpdated { bundle: Some(snapshot) }));
            bundle_id
        } else {
            let stored = self
                .jobs
                .get_mut(&job_id)
                .ok_or_else(|| RequestError::UnknownJob(job_id.clone()))?;
            stored.job.terminal_verdict = Some(verdict.clone());
            self.emit_job_updated(&job_id);
            job_id
        };
        self.audit("verdict.set", &subject, &[("kind", kind), ("reason", verdict.reason)]);
        Ok(())
    }
}

fn validate(bundle: &pb::Bundle) -> Result<(), RequestError> {
    required(&bundle.bundle_id, "bundle_id")?;
    required(&bundle.pool, "pool")?;
    if bundle.jobs.is_empty() {
        return Err(RequestError::InvalidField {
            field: "jobs",
            why: "a bundle needs at least one job".to_owned(),
        });
    }
    let mut names = std::collections::BTreeSet::new();
    for job in &bundle.jobs {
        required(&job.job_name, "jobs[].job_name")?;
        if !names.insert(job.job_name.as_str()) {
            return Err(RequestError::InvalidField {
                field: "jobs[].job_name",
                why: format!("{:?} is used by more than one job", job.job_name),
            });
        }
    }
    Ok(())
}

/// Whether two bundles carry the same spec (state, verdict and generation
/// are Manager's, not the sender's).
fn same_spec(a: &pb::Bundle, b: &pb::Bundle) -> bool {
    let strip = |x: &pb::Bundle| pb::Bundle {
        state: 0,
        terminal_verdict: None,
        generation: 0,
        ..x.clone()
    };
    strip(a) == strip(b)
}

fn ack(bundle: &pb::Bundle) -> pb::BundleAck {
    let ids = (0..replica_count(bundle)).flat_map(|replica_index| {
        bundle.jobs.iter().map(move |spec| {
            let id = runtime_job_id(
                &BundleId::from(bundle.bundle_id.as_str()),
                replica_index,
                &spec.job_name,
            );
            job_ref(id.as_str())
        })
    });
    pb::BundleAck {
        bundle: Some(bundle.clone()),
        job_ids: ids.flatten().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_verdict_and_generation_do_not_make_a_spec_different() {
        let a = pb::Bundle {
            bundle_id: "ns/ch1".into(),
            pool: "production".into(),
            resilience_policy: Some(pb::ResiliencePolicy::default()),
            ..Default::default()
        };
        let b = pb::Bundle {
            generation: 7,
            state: pb::BundleState::Deleting as i32,
            ..a.clone()
        };
        assert!(same_spec(&a, &b));
        let c = pb::Bundle {
            pool: "other".into(),
            ..a.clone()
        };
        assert!(!same_spec(&a, &c));
    }
}
