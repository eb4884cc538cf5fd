//! Manager's bundle expansion: a bundle becomes one runtime job per
//! (replica, job name), id `<bundle id>/<replica index>/<job name>`. The
//! simulator expands a bundle this way when it serves the bundle store, and
//! the port (`super::port`) does the same on a Manager that has none, so a
//! job is the same job whichever of the two made it.

use crate::manager::proto::manager::{self as pb, job::JobState};
use crate::manager::wire::{job_id_to_pb, millis_from_pb};
use crate::model::{BundleId, runtime_job_id};

/// How many replicas a bundle expands into: the primary, and the backup
/// only with a resilience policy.
pub fn replica_count(bundle: &pb::Bundle) -> u32 {
    if bundle.resilience_policy.is_some() { 2 } else { 1 }
}

/// One runtime job per (replica, job name): replica 0 always, replica 1
/// only with a resilience policy, `backupParameterOverrides` applied on
/// replica 1, `startMode: manual` jobs dormant, dated with the schedule's
/// start (`PRE` while it is after `now`).
pub fn expand(bundle: &pb::Bundle, now: i64) -> Vec<pb::Job> {
    let replicas = replica_count(bundle);
    let start = bundle.schedule.as_ref().and_then(|s| s.start);
    let state = match millis_from_pb(start.as_ref()) {
        Some(start) if start > now => JobState::Pre,
        _ => JobState::Active,
    };
    let mut jobs = Vec::new();
    for replica_index in 0..replicas {
        let pool = match &bundle.resilience_policy {
            Some(policy) if replica_index > 0 && !policy.pool.is_empty() => policy.pool.clone(),
            _ => bundle.pool.clone(),
        };
        for spec in &bundle.jobs {
            let mut parameters = spec.parameters.clone();
            if replica_index > 0
                && let Some(overrides) = bundle.backup_parameter_overrides.get(&spec.job_name)
            {
                parameters.extend(overrides.values.clone());
            }
            let job_id = runtime_job_id(
                &BundleId::from(bundle.bundle_id.as_str()),
                replica_index,
                &spec.job_name,
            );
            jobs.push(pb::Job {
                job_id: Some(job_id_to_pb(&job_id)),
                description: format!(
                    "{} of bundle {} (replica {replica_index})",
                    spec.job_name, bundle.bundle_id
                ),
                state: state as i32,
                start_date_time: start,
                bundle_ref: Some(pb::BundleJobRef {
                    bundle_id: bundle.bundle_id.clone(),
                    replica_index,
                    job_name: spec.job_name.clone(),
                }),
                requirements: spec.requirements.clone(),
                template: spec.template.clone(),
                dormant: spec.start_mode == pb::StartMode::Manual as i32,
                terminal_verdict: None,
                intra_replica: Some(pb::IntraReplicaRules {
                    co_locate_with: spec.co_locate_with.clone(),
                    separate_from: spec.separate_from.clone(),
                    exclusive: spec.exclusive,
                    single_use: spec.single_use,
                    placement: bundle.intra_replica_placement,
                    on_launch: bundle.on_launch,
                    override_reservation: bundle.override_reservation,
                    pool: pool.clone(),
                    resilience_policy: bundle.resilience_policy.clone(),
                }),
                parameters,
                ..Default::default()
            });
        }
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::wire::millis_to_pb;

    fn bundle(resilient: bool) -> pb::Bundle {
        pb::Bundle {
            bundle_id: "ns/ch1".into(),
            pool: "production".into(),
            resilience_policy: resilient.then(|| pb::ResiliencePolicy {
                pool: "oci-fra".into(),
                ..Default::default()
            }),
            jobs: vec![
                pb::BundleJobSpec {
                    job_name: "encode".into(),
                    parameters: [("bitrate".to_owned(), "5000".to_owned())].into(),
                    ..Default::default()
                },
                pb::BundleJobSpec {
                    job_name: "package".into(),
                    start_mode: pb::StartMode::Manual as i32,
                    ..Default::default()
                },
            ],
            backup_parameter_overrides: [(
                "encode".to_owned(),
                pb::ParameterOverrides {
                    values: [("bitrate".to_owned(), "3000".to_owned())].into(),
                },
            )]
            .into(),
            ..Default::default()
        }
    }

    fn ids(jobs: &[pb::Job]) -> Vec<&str> {
        jobs.iter()
            .map(|j| j.job_id.as_ref().map_or("", |id| id.job_id.as_str()))
            .collect()
    }

    #[test]
    fn a_bundle_without_resilience_policy_expands_to_the_primary_only() {
        assert_eq!(ids(&expand(&bundle(false), 0)), ["ns/ch1/0/encode", "ns/ch1/0/package"]);
    }

    #[test]
    fn a_resilient_bundle_expands_a_backup_placed_from_the_resilience_pool() {
        let jobs = expand(&bundle(true), 0);
        assert_eq!(
            ids(&jobs),
            [
                "ns/ch1/0/encode",
                "ns/ch1/0/package",
                "ns/ch1/1/encode",
                "ns/ch1/1/package"
            ]
        );
        let pool = |j: &pb::Job| j.intra_replica.as_ref().unwrap().pool.clone();
        assert_eq!(pool(&jobs[0]), "production");
        assert_eq!(pool(&jobs[2]), "oci-fra");
    }

    #[test]
    fn backup_parameter_overrides_apply_on_replica_one_only() {
        let jobs = expand(&bundle(true), 0);
        assert_eq!(jobs[0].parameters["bitrate"], "5000");
        assert_eq!(jobs[2].parameters["bitrate"], "3000");
    }

    #[test]
    fn manual_start_mode_jobs_are_dormant() {
        let jobs = expand(&bundle(false), 0);
        assert!(!jobs[0].dormant);
        assert!(jobs[1].dormant);
        assert_eq!(jobs[1].bundle_ref.as_ref().unwrap().job_name, "package");
    }

    #[test]
    fn a_scheduled_bundles_jobs_are_dated_and_pre_until_the_start() {
        let scheduled = pb::Bundle {
            schedule: Some(pb::BundleSchedule {
                start: Some(millis_to_pb(60_000)),
                end: None,
            }),
            ..bundle(true)
        };
        let before = expand(&scheduled, 59_999);
        assert!(before.iter().all(|j| j.state == JobState::Pre as i32));
        assert!(before.iter().all(|j| j.start_date_time == Some(millis_to_pb(60_000))));
        let after = expand(&scheduled, 60_000);
        assert!(after.iter().all(|j| j.state == JobState::Active as i32));
        assert!(expand(&bundle(false), 0).iter().all(|j| j.start_date_time.is_none()));
    }
}
