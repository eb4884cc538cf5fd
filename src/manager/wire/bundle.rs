//! Bundles, job specs and requirements.

use std::collections::BTreeMap;

use super::{Notes, WireError, bounded, id, millis_from_pb, millis_to_pb, text};
use crate::manager::proto::manager as pb;
use crate::model::{
    Bundle, BundleId, BundleSchedule, BundleSpec, BundleState, DateTime, HostPort, IntraReplicaAz,
    IntraReplicaPlacement, JobSpec, MigrationStrategy, OnLaunch, OnRuntimeFailure, Requirements, ResiliencePolicy,
    ResilienceRule, StartMode, TerminalVerdict, VerdictKind,
};

/// A resilience flag from the wire; an unknown value is read as `allow`
/// (flags are best-effort, so the lenient reading can only cost resilience,
/// never a placement).
fn rule_from_pb(value: i32) -> ResilienceRule {
    match pb::ResilienceRule::try_from(value) {
        Ok(pb::ResilienceRule::Forbid) => ResilienceRule::Forbid,
        _ => ResilienceRule::Allow,
    }
}

fn rule_to_pb(rule: ResilienceRule) -> i32 {
    match rule {
        ResilienceRule::Allow => pb::ResilienceRule::Allow as i32,
        ResilienceRule::Forbid => pb::ResilienceRule::Forbid as i32,
    }
}

/// A resilience policy from the wire.
pub fn resilience_from_pb(policy: &pb::ResiliencePolicy) -> ResiliencePolicy {
    ResiliencePolicy {
        pool: (!policy.pool.is_empty()).then(|| policy.pool.clone()),
        same_node: rule_from_pb(policy.same_node),
        same_az: rule_from_pb(policy.same_az),
        same_cloud: rule_from_pb(policy.same_cloud),
    }
}

/// A resilience policy as its wire message.
pub fn resilience_to_pb(policy: &ResiliencePolicy) -> pb::ResiliencePolicy {
    pb::ResiliencePolicy {
        pool: policy.pool.clone().unwrap_or_default(),
        same_node: rule_to_pb(policy.same_node),
        same_az: rule_to_pb(policy.same_az),
        same_cloud: rule_to_pb(policy.same_cloud),
    }
}

/// Intra-replica placement from the wire; an unknown AZ mode is read as the
/// default, soft.
pub fn intra_replica_from_pb(p: Option<&pb::IntraReplicaPlacement>) -> IntraReplicaPlacement {
    let Some(p) = p else {
        return IntraReplicaPlacement::default();
    };
    IntraReplicaPlacement {
        same_node_default: p.same_node_default,
        same_az: match pb::IntraReplicaAz::try_from(p.same_az) {
            Ok(pb::IntraReplicaAz::Hard) => IntraReplicaAz::Hard,
            Ok(pb::IntraReplicaAz::Off) => IntraReplicaAz::Off,
            _ => IntraReplicaAz::Soft,
        },
    }
}

/// Intra-replica placement as its wire message.
pub fn intra_replica_to_pb(p: &IntraReplicaPlacement) -> pb::IntraReplicaPlacement {
    pb::IntraReplicaPlacement {
        same_node_default: p.same_node_default,
        same_az: match p.same_az {
            IntraReplicaAz::Soft => pb::IntraReplicaAz::Soft,
            IntraReplicaAz::Hard => pb::IntraReplicaAz::Hard,
            IntraReplicaAz::Off => pb::IntraReplicaAz::Off,
        } as i32,
    }
}

/// `onLaunch` from the wire's spare-use value. `prefer` has no launch
/// meaning in the spec and reads as `allowSpare`; unknown values read as the
/// default `avoidSpare`.
pub fn on_launch_from_pb(value: i32) -> OnLaunch {
    match pb::SpareUse::try_from(value) {
        Ok(pb::SpareUse::Allow | pb::SpareUse::Prefer) => OnLaunch::AllowSpare,
        _ => OnLaunch::AvoidSpare,
    }
}

/// `onLaunch` as the wire's spare-use value.
pub fn on_launch_to_pb(value: OnLaunch) -> i32 {
    match value {
        OnLaunch::AvoidSpare => pb::SpareUse::Avoid as i32,
        OnLaunch::AllowSpare => pb::SpareUse::Allow as i32,
    }
}

/// Requirements from the wire. A malformed host port token refuses the
/// message: a job whose port claims cannot be read cannot be placed safely.
pub fn requirements_from_pb(r: &pb::JobRequirements) -> Result<Requirements, WireError> {
    const MSG: &str = "JobRequirements";
    let number = |field: &'static str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(WireError::Invalid {
                message: MSG,
                field,
                reason: format!("{v} is not a capacity"),
            })
        }
    };
    bounded(MSG, "required_capabilities", r.required_capabilities.len())?;
    bounded(MSG, "required_host_ports", r.required_host_ports.len())?;
    let ports = r
        .required_host_ports
        .iter()
        .map(|t| t.parse::<HostPort>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| WireError::Invalid {
            message: MSG,
            field: "required_host_ports",
            reason: e.to_string(),
        })?;
    Ok(Requirements {
        required_capacity: number("required_capacity", r.required_capacity)?,
        required_cores: r.required_cores,
        required_capabilities: r.required_capabilities.clone(),
        required_host_ports: ports,
        required_gpu_capacity: number("required_gpu_capacity", r.required_gpu_capacity)?,
        required_gpu_model: (!r.required_gpu_model.is_empty()).then(|| r.required_gpu_model.clone()),
        on_runtime_failure: match pb::OnRuntimeFailure::try_from(r.on_runtime_failure) {
            Ok(pb::OnRuntimeFailure::AvoidSpare) => OnRuntimeFailure::AvoidSpare,
            Ok(pb::OnRuntimeFailure::Drop) => OnRuntimeFailure::Drop,
            // Unspecified is the documented default; an unknown policy is
            // read the same way rather than refusing the job.
            _ => OnRuntimeFailure::PreferSpare,
        },
        max_restarts_per_hour: r.max_restarts_per_hour,
        essential: r.essential,
        // An unknown strategy is read as none declared: the drain then
        // uses the spec's default rather than refusing the job.
        migration_strategy: r
            .migration_strategy
            .and_then(|m| pb::MigrationStrategy::try_from(m).ok())
            .map(|m| match m {
                pb::MigrationStrategy::StopThenStart => MigrationStrategy::StopThenStart,
                pb::MigrationStrategy::Overlap => MigrationStrategy::Overlap,
                pb::MigrationStrategy::Handover => MigrationStrategy::Handover,
            }),
    })
}

/// Requirements as their wire message.
pub fn requirements_to_pb(r: &Requirements) -> pb::JobRequirements {
    pb::JobRequirements {
        required_capacity: r.required_capacity,
        required_cores: r.required_cores,
        required_capabilities: r.required_capabilities.clone(),
        required_host_ports: r.required_host_ports.iter().map(ToString::to_string).collect(),
        required_gpu_capacity: r.required_gpu_capacity,
        required_gpu_model: r.required_gpu_model.clone().unwrap_or_default(),
        on_runtime_failure: match r.on_runtime_failure {
            OnRuntimeFailure::PreferSpare => pb::OnRuntimeFailure::PreferSpare,
            OnRuntimeFailure::AvoidSpare => pb::OnRuntimeFailure::AvoidSpare,
            OnRuntimeFailure::Drop => pb::OnRuntimeFailure::Drop,
        } as i32,
        max_restarts_per_hour: r.max_restarts_per_hour,
        essential: r.essential,
        migration_strategy: r.migration_strategy.map(|m| strategy_to_pb(m) as i32),
    }
}

/// A declared migration strategy as its wire enum.
pub fn strategy_to_pb(strategy: MigrationStrategy) -> pb::MigrationStrategy {
    match strategy {
        MigrationStrategy::StopThenStart => pb::MigrationStrategy::StopThenStart,
        MigrationStrategy::Overlap => pb::MigrationStrategy::Overlap,
        MigrationStrategy::Handover => pb::MigrationStrategy::Handover,
    }
}

/// A bundle job spec from the wire.
pub fn job_spec_from_pb(j: &pb::BundleJobSpec) -> Result<JobSpec, WireError> {
    const MSG: &str = "BundleJobSpec";
    bounded(MSG, "parameters", j.parameters.len())?;
    Ok(JobSpec {
        job_name: id(MSG, "job_name", &j.job_name)?,
        template: j.template.clone(),
        requirements: j
            .requirements
            .as_ref()
            .map(requirements_from_pb)
            .transpose()?
            .unwrap_or_default(),
        co_locate_with: j.co_locate_with.clone(),
        separate_from: j.separate_from.clone(),
        exclusive: j.exclusive,
        single_use: j.single_use,
        // START_MODE_AUTO is zero, so a bundle that predates the field
        // reads as "auto"; unknown values too.
        start_mode: match pb::StartMode::try_from(j.start_mode) {
            Ok(pb::StartMode::Manual) => StartMode::Manual,
            _ => StartMode::Auto,
        },
        // Which manual jobs run is Manager's dormant flag (StartBundleJob /
        // StopBundleJob), not part of the stored spec.
        started_replicas: Vec::new(),
        parameters: j.parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    })
}

/// A schedule from the wire: a start is required, an end (when present)
/// must come after it, and both must be instants the wire can carry.
pub fn schedule_from_pb(s: &pb::BundleSchedule) -> Result<BundleSchedule, WireError> {
    const MSG: &str = "BundleSchedule";
    let instant = |field: &'static str, ts: Option<&prost_types::Timestamp>| {
        millis_from_pb(ts).map(DateTime::from_millis).ok_or(WireError::Invalid {
            message: MSG,
            field,
            reason: "missing, or not an instant between 1970 and 9999".to_owned(),
        })
    };
    let start = instant("start", s.start.as_ref())?;
    let end = s.end.as_ref().map(|e| instant("end", Some(e))).transpose()?;
    if let Some(end) = end
        && end <= start
    {
        return Err(WireError::Invalid {
            message: MSG,
            field: "end",
            reason: format!("{end} is not after the start {start}"),
        });
    }
    Ok(BundleSchedule { start, end })
}

/// A schedule as its wire message.
pub fn schedule_to_pb(s: &BundleSchedule) -> pb::BundleSchedule {
    pb::BundleSchedule {
        start: Some(millis_to_pb(s.start.millis())),
        end: s.end.map(|e| millis_to_pb(e.millis())),
    }
}

/// A bundle job spec as its wire message.
pub fn job_spec_to_pb(j: &JobSpec) -> pb::BundleJobSpec {
    pb::BundleJobSpec {
        job_name: j.job_name.clone(),
        template: j.template.clone(),
        requirements: Some(requirements_to_pb(&j.requirements)),
        co_locate_with: j.co_locate_with.clone(),
        separate_from: j.separate_from.clone(),
        exclusive: j.exclusive,
        single_use: j.single_use,
        start_mode: match j.start_mode {
            StartMode::Auto => pb::StartMode::Auto,
            StartMode::Manual => pb::StartMode::Manual,
        } as i32,
        parameters: j.parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// A terminal verdict from the wire.
pub fn verdict_from_pb(v: &pb::TerminalVerdict, notes: &mut Notes) -> TerminalVerdict {
    TerminalVerdict {
        kind: match pb::VerdictKind::try_from(v.kind) {
            Ok(pb::VerdictKind::Dropped) => VerdictKind::Dropped,
            // Broken is zero; an unknown verdict is still terminal, and
            // broken is the reading that never places the job again.
            _ => VerdictKind::Broken,
        },
        reason: text(notes, "TerminalVerdict", "reason", &v.reason),
        at: millis_from_pb(v.at.as_ref()),
    }
}

/// A terminal verdict as its wire message.
pub fn verdict_to_pb(v: &TerminalVerdict) -> pb::TerminalVerdict {
    pb::TerminalVerdict {
        kind: match v.kind {
            VerdictKind::Broken => pb::VerdictKind::Broken,
            VerdictKind::Dropped => pb::VerdictKind::Dropped,
        } as i32,
        reason: v.reason.clone(),
        at: v.at.map(millis_to_pb),
    }
}

/// A bundle from the wire.
pub fn bundle_from_pb(b: &pb::Bundle, notes: &mut Notes) -> Result<Bundle, WireError> {
    const MSG: &str = "Bundle";
    bounded(MSG, "jobs", b.jobs.len())?;
    bounded(MSG, "backup_parameter_overrides", b.backup_parameter_overrides.len())?;
    Ok(Bundle {
        bundle_id: BundleId(id(MSG, "bundle_id", &b.bundle_id)?),
        spec: BundleSpec {
            pool: b.pool.clone(),
            resilience_policy: b.resilience_policy.as_ref().map(resilience_from_pb),
            jobs: b.jobs.iter().map(job_spec_from_pb).collect::<Result<_, _>>()?,
            intra_replica_placement: intra_replica_from_pb(b.intra_replica_placement.as_ref()),
            on_launch: on_launch_from_pb(b.on_launch),
            override_reservation: b.override_reservation,
            backup_parameter_overrides: b
                .backup_parameter_overrides
                .iter()
                .map(|(job, o)| {
                    (
                        job.clone(),
                        o.values
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect::<BTreeMap<_, _>>(),
                    )
                })
                .collect(),
            schedule: b.schedule.as_ref().map(schedule_from_pb).transpose()?,
        },
        state: match pb::BundleState::try_from(b.state) {
            Ok(pb::BundleState::Deleting) => BundleState::Deleting,
            _ => BundleState::Live,
        },
        terminal_verdict: b.terminal_verdict.as_ref().map(|v| verdict_from_pb(v, notes)),
        generation: b.generation,
    })
}

/// A bundle as its wire message.
pub fn bundle_to_pb(b: &Bundle) -> pb::Bundle {
    let s = &b.spec;
    pb::Bundle {
        bundle_id: b.bundle_id.0.clone(),
        pool: s.pool.clone(),
        resilience_policy: s.resilience_policy.as_ref().map(resilience_to_pb),
        jobs: s.jobs.iter().map(job_spec_to_pb).collect(),
        intra_replica_placement: Some(intra_replica_to_pb(&s.intra_replica_placement)),
        on_launch: on_launch_to_pb(s.on_launch),
        override_reservation: s.override_reservation,
        backup_parameter_overrides: s
            .backup_parameter_overrides
            .iter()
            .map(|(job, o)| {
                (
                    job.clone(),
                    pb::ParameterOverrides {
                        values: o.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    },
                )
            })
            .collect(),
        state: match b.state {
            BundleState::Live => pb::BundleState::Live,
            BundleState::Deleting => pb::BundleState::Deleting,
        } as i32,
        terminal_verdict: b.terminal_verdict.as_ref().map(verdict_to_pb),
        generation: b.generation,
        schedule: s.schedule.as_ref().map(schedule_to_pb),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle() -> Bundle {
        let spec: BundleSpec = serde_yaml::from_str(
            r#"
pool: production
resiliencePolicy: {pool: oci-fra, sameNode: forbid, sameAz: forbid}
intraReplicaPlacement: {sameNodeDefault: true, sameAz: hard}
onLaunch: allowSpare
jobs:
  - jobName: encode
    template: xyz
    requirements: {requiredCapacity: 2, requiredCores: 2, requiredHostPorts: ["1935/tcp"], onRuntimeFailure: avoidSpare, essential: false, maxRestartsPerHour: 3, migrationStrategy: handover}
    startMode: manual
    parameters: {bitrate: "5000"}
backupParameterOverrides: {encode: {bitrate: "3000"}}
schedule: {start: "2026-12-05T19:00:00Z", end: "2026-12-05T21:00:00.5Z"}
"#,
        )
        .unwrap();
        Bundle {
            bundle_id: BundleId("default/ch1".into()),
            spec,
            ..Default::default()
        }
    }

    #[test]
    fn bundle_round_trips_through_the_wire() {
        let b = bundle();
        let back = bundle_from_pb(&bundle_to_pb(&b), &mut Notes::new()).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn a_schedule_without_a_start_or_ending_before_it_refuses_the_bundle() {
        let mut pb = bundle_to_pb(&bundle());
        pb.schedule.as_mut().unwrap().start = None;
        let e = bundle_from_pb(&pb, &mut Notes::new()).unwrap_err();
        assert!(e.to_string().contains("start"), "{e}");
        let mut pb = bundle_to_pb(&bundle());
        let schedule = pb.schedule.as_mut().unwrap();
        schedule.end = schedule.start;
        let e = bundle_from_pb(&pb, &mut Notes::new()).unwrap_err();
        assert!(e.to_string().contains("not after the start"), "{e}");
        let mut pb = bundle_to_pb(&bundle());
        pb.schedule.as_mut().unwrap().end = None;
        let back = bundle_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(back.spec.schedule.unwrap().end, None);
    }

    #[test]
    fn a_bundle_that_predates_start_mode_reads_as_auto() {
        let mut pb = bundle_to_pb(&bundle());
        pb.jobs[0].start_mode = 0;
        let back = bundle_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(back.spec.jobs[0].start_mode, StartMode::Auto);
    }

    #[test]
    fn a_job_that_declares_no_migration_strategy_reads_as_none() {
        let mut pb = bundle_to_pb(&bundle());
        assert_eq!(
            pb.jobs[0].requirements.as_ref().unwrap().migration_strategy,
            Some(pb::MigrationStrategy::Handover as i32)
        );
        pb.jobs[0].requirements.as_mut().unwrap().migration_strategy = None;
        let back = bundle_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(back.spec.jobs[0].requirements.migration_strategy, None);
        // An unknown strategy is none declared, not a refused bundle.
        pb.jobs[0].requirements.as_mut().unwrap().migration_strategy = Some(9);
        let back = bundle_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(back.spec.jobs[0].requirements.migration_strategy, None);
    }

    #[test]
    fn unknown_enum_values_take_the_safe_default() {
        let mut pb = bundle_to_pb(&bundle());
        pb.on_launch = 99;
        pb.jobs[0].requirements.as_mut().unwrap().on_runtime_failure = 42;
        pb.resilience_policy.as_mut().unwrap().same_node = 7;
        let back = bundle_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(back.spec.on_launch, OnLaunch::AvoidSpare);
        assert_eq!(
            back.spec.jobs[0].requirements.on_runtime_failure,
            OnRuntimeFailure::PreferSpare
        );
        assert_eq!(back.spec.resilience_policy.unwrap().same_node, ResilienceRule::Allow);
    }

    #[test]
    fn malformed_host_port_or_capacity_refuses_the_bundle() {
        let mut pb = bundle_to_pb(&bundle());
        pb.jobs[0].requirements.as_mut().unwrap().required_host_ports = vec!["http".into()];
        assert!(bundle_from_pb(&pb, &mut Notes::new()).is_err());
        let mut pb = bundle_to_pb(&bundle());
        pb.jobs[0].requirements.as_mut().unwrap().required_capacity = f64::NAN;
        assert!(bundle_from_pb(&pb, &mut Notes::new()).is_err());
        let mut pb = bundle_to_pb(&bundle());
        pb.bundle_id.clear();
        assert!(bundle_from_pb(&pb, &mut Notes::new()).is_err());
    }
}
