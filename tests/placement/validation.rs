//! Settings validation (every error listed at once, the spec's codes) and
//! bundle validation: `validateBundle`, `validateBundleAdmission` and
//! `placeDryRun`.

use norsk_auto_manager::model::{HotSpareSpec, PlacementPool};
use norsk_auto_manager::placement::{
    Admission, BundleIssueCode, Outcome, SettingsErrorCode, place_dry_run, validate_bundle, validate_bundle_admission,
    validate_settings,
};

use crate::support::*;

#[test]
fn every_settings_error_is_listed_at_once_with_its_code() {
    let pools: Vec<PlacementPool> = yaml_serde::from_str(
        "
- name: ''
  tiers: [{name: t, kind: aws, scaleOut: fixed}]
- name: production
  tiers:
    - {name: a, kind: local-servers, scaleOut: fixed}
    - {name: a, kind: local-servers, scaleOut: fixed}
    - {name: cloud, kind: oci, scaleOut: elastic, rootVolume: {sizeGib: 50}}
- name: production
  tiers: []
",
    )
    .unwrap();
    let spares: Vec<HotSpareSpec> = yaml_serde::from_str(
        "
- {pool: nowhere, targetCount: 1, spec: {instanceType: m5.xlarge}}
- {pool: production, targetCount: 1, spec: {instanceType: m5.xlarge}}
- {pool: production, targetCount: 2, spec: {instanceType: ''}}
",
    )
    .unwrap();
    let error = validate_settings(pools, &spares).unwrap_err();
    let codes: Vec<SettingsErrorCode> = error.errors.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        vec![
            SettingsErrorCode::EmptyPoolName,
            SettingsErrorCode::DuplicateTier,
            SettingsErrorCode::MultipleFixedTiers,
            SettingsErrorCode::NoCandidateInstanceTypes,
            SettingsErrorCode::RootVolumeNotAws,
            SettingsErrorCode::DuplicatePoolName,
            SettingsErrorCode::NoTiers,
            SettingsErrorCode::UnknownPool,
            SettingsErrorCode::DuplicateHotSparePool,
            SettingsErrorCode::EmptySpareInstanceType,
        ]
    );
    assert_eq!(error.errors[1].path, "placementPools[1].tiers[1].name");
    assert_eq!(
        serde_json::to_value(SettingsErrorCode::DuplicateTier).unwrap(),
        "duplicateTier"
    );
    assert_eq!(
        serde_json::to_value(SettingsErrorCode::EmptyPoolName).unwrap(),
        "emptyPoolName"
    );
}

#[test]
fn valid_settings_are_accepted() {
    let pools: Vec<PlacementPool> = yaml_serde::from_str(ONE_FIXED_TIER).unwrap();
    let spares: Vec<HotSpareSpec> =
        yaml_serde::from_str("[{pool: p, targetCount: 1, spec: {instanceType: m5.xlarge}}]").unwrap();
    assert!(validate_settings(pools, &spares).is_ok());
}

const CLOUD_POOL: &str = "
- name: cloud
  tiers: [{name: t, kind: aws, scaleOut: elastic, candidateInstanceTypes: [{instanceType: m, totalCapacity: 4, totalCores: 4}]}]
- name: cluster
  tiers: [{name: t, kind: local-servers, scaleOut: fixed}]
";

fn codes(issues: &[norsk_auto_manager::placement::BundleIssue]) -> Vec<BundleIssueCode> {
    issues.iter().map(|i| i.code).collect()
}

#[test]
fn bundles_naming_unknown_pools_or_reusing_job_names_are_rejected() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec =
        bundle("pool: nowhere\nresiliencePolicy: {pool: elsewhere}\njobs: [{jobName: a}, {jobName: a}, {jobName: ''}]");
    let found = validate_bundle(&view, &spec);
    assert_eq!(
        codes(&found.errors),
        vec![
            BundleIssueCode::UnknownPool,
            BundleIssueCode::UnknownPool,
            BundleIssueCode::DuplicateJobName,
            BundleIssueCode::EmptyJobName
        ]
    );
    assert_eq!(
        codes(&validate_bundle(&view, &bundle("pool: cloud\njobs: []")).errors),
        vec![BundleIssueCode::NoJobs]
    );
}

#[test]
fn placement_rules_must_be_consistent() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = bundle(
        "
pool: cloud
jobs:
  - {jobName: a, coLocateWith: [b, ghost]}
  - {jobName: b, coLocateWith: [c], requirements: {requiredHostPorts: [1935/tcp]}}
  - {jobName: c, separateFrom: [a, c], requirements: {requiredHostPorts: [1935/tcp, 1935/tcp]}}
  - {jobName: d, singleUse: true}
",
    );
    let found = validate_bundle(&view, &spec);
    assert_eq!(
        codes(&found.errors),
        vec![
            BundleIssueCode::UnknownPeer,
            BundleIssueCode::SelfReference,
            BundleIssueCode::DuplicateHostPort,
            BundleIssueCode::SingleUseRequiresExclusive,
            BundleIssueCode::ContradictoryPlacementRules,
            BundleIssueCode::HostPortConflictInGroup,
        ]
    );
}

#[test]
fn a_single_use_job_may_not_share_its_node_with_co_located_peers() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec =
        bundle("pool: cloud\njobs: [{jobName: a, exclusive: true, singleUse: true}, {jobName: b, coLocateWith: [a]}]");
    assert_eq!(
        codes(&validate_bundle(&view, &spec).errors),
        vec![BundleIssueCode::SingleUseInGroup]
    );
}

#[test]
fn requirements_out_of_range_are_rejected() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec =
        bundle("pool: cloud\njobs: [{jobName: a, requirements: {requiredCapacity: -1, requiredGpuCapacity: 1.5}}]");
    assert_eq!(
        codes(&validate_bundle(&view, &spec).errors),
        vec![BundleIssueCode::InvalidRequirement, BundleIssueCode::InvalidRequirement]
    );
}

#[test]
fn backup_overrides_must_name_jobs_and_need_a_backup() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = bundle("pool: cloud\njobs: [{jobName: a}]\nbackupParameterOverrides: {ghost: {x: '1'}}");
    let found = validate_bundle(&view, &spec);
    assert_eq!(codes(&found.errors), vec![BundleIssueCode::UnknownBackupOverrideJob]);
    assert_eq!(
        codes(&found.warnings),
        vec![BundleIssueCode::BackupOverridesWithoutBackup]
    );
}

#[test]
fn a_schedule_must_end_after_it_starts() {
    let view = view(CLOUD_POOL, "nodes: []");
    let schedule = |end: &str| {
        bundle(&format!(
            "pool: cloud\nschedule: {{start: '2026-12-05T19:00:00Z', end: '{end}'}}\njobs: [{{jobName: a}}]"
        ))
    };
    let found = validate_bundle(&view, &schedule("2026-12-05T20:00:00+01:00"));
    assert_eq!(codes(&found.errors), vec![BundleIssueCode::ScheduleEndsBeforeStart]);
    assert_eq!(found.errors[0].path, "schedule.end");
    assert!(
        found.errors[0]
            .message
            .contains("schedule.end must be after schedule.start"),
        "{}",
        found.errors[0].message
    );
    assert!(
        validate_bundle(&view, &schedule("2026-12-05T21:00:00Z"))
            .errors
            .is_empty()
    );
}

#[test]
fn started_replicas_must_name_manual_jobs_and_replicas_the_bundle_has() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = bundle(
        "
pool: cloud
jobs:
  - {jobName: a, startedReplicas: [0]}
  - {jobName: b, startMode: manual, startedReplicas: [0, 1]}
",
    );
    let found = validate_bundle(&view, &spec);
    assert_eq!(
        codes(&found.errors),
        vec![BundleIssueCode::StartedAutoJob, BundleIssueCode::UnknownStartedReplica]
    );
    assert_eq!(found.errors[1].path, "jobs[1].startedReplicas");
    assert!(
        found.errors[1].message.contains("no backup"),
        "{}",
        found.errors[1].message
    );
    let backup =
        bundle("pool: cloud\nresiliencePolicy: {}\njobs: [{jobName: b, startMode: manual, startedReplicas: [0, 1]}]");
    assert!(validate_bundle(&view, &backup).errors.is_empty());
}

#[test]
fn capacity_misses_against_a_cluster_pool_are_warnings_and_against_a_cloud_pool_errors() {
    let view = view(
        CLOUD_POOL,
        "
nodes:
  - {id: s1, pool: cluster, phase: running, inventory: {kind: local-servers, totalCapacity: 4}}
",
    );
    let too_big = "jobs: [{jobName: a, requirements: {requiredCapacity: 6}}]";
    let cluster = validate_bundle(&view, &bundle(&format!("pool: cluster\n{too_big}")));
    assert!(cluster.errors.is_empty());
    assert_eq!(codes(&cluster.warnings), vec![BundleIssueCode::NoClusterNodeFits]);
    let cloud = validate_bundle(&view, &bundle(&format!("pool: cloud\n{too_big}")));
    assert_eq!(codes(&cloud.errors), vec![BundleIssueCode::Unsatisfiable]);
    let capability = "pool: cloud\njobs: [{jobName: a, requirements: {requiredCapabilities: [sdi]}}]";
    assert_eq!(
        codes(&validate_bundle(&view, &bundle(capability)).errors),
        vec![BundleIssueCode::Unsatisfiable]
    );
    let fits = validate_bundle(
        &view,
        &bundle("pool: cluster\njobs: [{jobName: a, requirements: {requiredCapacity: 4}}]"),
    );
    assert_eq!(fits, Default::default());
}

#[test]
fn satisfiability_is_judged_for_a_co_located_group_as_a_whole() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = "pool: cloud\njobs: [{jobName: a, requirements: {requiredCapacity: 3}}, {jobName: b, coLocateWith: [a], requirements: {requiredCapacity: 3}}]";
    assert_eq!(
        codes(&validate_bundle(&view, &bundle(spec)).errors),
        vec![BundleIssueCode::Unsatisfiable]
    );
}

#[test]
fn admission_says_ok_when_every_replica_would_place() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = bundle("pool: cloud\nresiliencePolicy: {}\njobs: [{jobName: a, requirements: {requiredCapacity: 2}}]");
    assert_eq!(validate_bundle_admission(&view, &bundle_id(), &spec), Admission::Ok);
}

#[test]
fn admission_reports_validation_errors_first() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = bundle("pool: nowhere\njobs: [{jobName: a}]");
    assert!(matches!(
        validate_bundle_admission(&view, &bundle_id(), &spec),
        Admission::ValidationErrors { errors } if errors[0].code == BundleIssueCode::UnknownPool
    ));
}

#[test]
fn admission_lists_the_jobs_that_would_find_no_capacity() {
    let view = view(
        CLOUD_POOL,
        "
nodes:
  - {id: s1, pool: cluster, phase: running, inventory: {kind: local-servers, totalCapacity: 4}}
",
    );
    // The primary fills s1; the backup finds it full and the cluster tier
    // cannot provision.
    let spec = bundle(
        "pool: cluster\nresiliencePolicy: {}\njobs: [{jobName: a, requirements: {requiredCapacity: 3}}, {jobName: b, requirements: {requiredCapacity: 1}}]",
    );
    let Admission::NoCapacity { unplaceable } = validate_bundle_admission(&view, &bundle_id(), &spec) else {
        panic!("expected noCapacity");
    };
    let listed: Vec<(u32, &str, &str)> = unplaceable
        .iter()
        .map(|u| (u.replica_index, u.job_name.as_str(), u.reason.as_str()))
        .collect();
    assert_eq!(
        listed,
        vec![(1, "a", "noCapacityInAnyPool"), (1, "b", "noCapacityInAnyPool")]
    );
}

#[test]
fn a_dry_run_traces_one_job_without_acting() {
    let view = view(CLOUD_POOL, "nodes: []");
    let spec = bundle("pool: cloud\njobs: [{jobName: a, requirements: {requiredCapacity: 2}}]");
    let first = place_dry_run(&view, &bundle_id(), &spec, 0, "a").unwrap();
    let again = place_dry_run(&view, &bundle_id(), &spec, 0, "a").unwrap();
    assert!(matches!(&first.outcome, Outcome::Provision { instance_type, .. } if instance_type == "m"));
    assert!(first.trace.is_some());
    assert_eq!(first, again, "nothing was reserved");
    assert!(
        place_dry_run(&view, &bundle_id(), &spec, 1, "a").is_err(),
        "no backup without a resilience policy"
    );
}

#[test]
fn a_replacement_hot_spare_list_is_validated_as_at_start_and_rejected_whole() {
    let pools = pools(ONE_FIXED_TIER);
    let good: Vec<HotSpareSpec> = yaml_serde::from_str("[{pool: p, targetCount: 2, spec: {instanceType: m}}]").unwrap();
    assert!(pools.validate_hot_spares(&good).is_ok());
    let bad: Vec<HotSpareSpec> = yaml_serde::from_str(
        "[{pool: p, targetCount: 2, spec: {instanceType: m}}, {pool: p, targetCount: 1, spec: {instanceType: m}}, {pool: q, targetCount: 1, spec: {instanceType: m}}]",
    )
    .unwrap();
    let codes: Vec<SettingsErrorCode> = pools
        .validate_hot_spares(&bad)
        .unwrap_err()
        .errors
        .iter()
        .map(|e| e.code)
        .collect();
    assert_eq!(
        codes,
        vec![SettingsErrorCode::DuplicateHotSparePool, SettingsErrorCode::UnknownPool]
    );
}
