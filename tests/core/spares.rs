//! Scenario tests of the hot-spare reconciler and node services, one per
//! rule of the spec's "Hot spares", "Spares at launch" and settings
//! validation, on a virtual clock.

use std::collections::BTreeMap;

use norsk_auto_manager::automanager::node_services::{NODE_SERVICE_RETRY_BACKOFF_MS, NodeServiceSpec, ServicePhase};
use norsk_auto_manager::automanager::settings::Experimental;
use norsk_auto_manager::automanager::spares::{HotSpareChange, HotSpareField, SPARE_PROVISION_RETRY_BACKOFF_MS};
use norsk_auto_manager::automanager::{
    AutoSettings, CommandError, Notification, RequestId, Rpc, RpcFailureKind, validate_auto_settings,
};
use norsk_auto_manager::model::{
    HotSpareSpec, ImagePrefetchResult, InstanceKey, JobHistoryEntry, JobId, JobState, ManagerEvent, NodeId,
    ProviderKind, RuntimeJob, SpareSpec, tags,
};

use crate::support::*;

/// `production` keeps `target` spares of m5.xlarge warmed and reserved
/// as given.
fn entry(target: u32, warm_for: &[&str], reserved_for: &[&str], exclusive: bool) -> HotSpareSpec {
    HotSpareSpec {
        pool: "production".into(),
        target_count: target,
        spec: yaml_serde::from_str("{instanceType: m5.xlarge}").unwrap(),
        warm_for: warm_for.iter().map(|s| (*s).to_owned()).collect(),
        reserved_for: reserved_for.iter().map(|s| (*s).to_owned()).collect(),
        exclusive,
    }
}

fn spare_settings(spares: Vec<HotSpareSpec>) -> AutoSettings {
    AutoSettings {
        hot_spares: spares,
        template_images: BTreeMap::from([
            (
                "xyz".to_owned(),
                vec!["reg/xyz:1".to_owned(), "reg/xyz-aux:1".to_owned()],
            ),
            ("other".to_owned(), vec!["reg/other:1".to_owned()]),
        ]),
        ..settings()
    }
}

/// A hydrated core (no cluster node) on `spares`.
fn hydrated_with(spares: Vec<HotSpareSpec>) -> Harness {
    let mut h = Harness::with(spare_settings(spares));
    h.event(ManagerEvent::InitialDataComplete);
    h
}

/// Carries a typed method's step into the harness.
/// The `CreateNode` calls taken from the harness: (request, node, tags).
fn creates(h: &mut Harness) -> Vec<(RequestId, NodeId, BTreeMap<String, String>)> {
    h.take_calls()
        .into_iter()
        .filter_map(|(id, rpc)| match rpc {
            Rpc::CreateNode { node_id, tags, .. } => Some((id, node_id, tags)),
            _ => None,
        })
        .collect()
}

/// Provisions `count` spares and brings them up, each holding `images`.
fn running_spares(h: &mut Harness, images: &[&[&str]]) -> Vec<NodeId> {
    let created = creates(h);
    assert_eq!(created.len(), images.len(), "spares provisioned");
    let mut ids = Vec::new();
    for ((id, node, node_tags), held) in created.into_iter().zip(images) {
        h.ok(id);
        let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
        let mut inv = inventory(ProviderKind::Aws, 4.0);
        inv.images = held.iter().map(|s| (*s).to_owned()).collect();
        h.event(ManagerEvent::NodeInventory {
            node_id: node.clone(),
            inventory: inv,
        });
        ids.push(node);
    }
    ids
}

fn terminated(h: &mut Harness) -> Vec<NodeId> {
    h.take_calls()
        .into_iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::TerminateNode { node_id } => Some(node_id),
            _ => None,
        })
        .collect()
}

fn underflows(notifications: &[Notification]) -> Vec<(String, u32, u32)> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::SpareUnderflow {
                pool,
                effective,
                target,
            } => Some((pool.clone(), *effective, *target)),
            _ => None,
        })
        .collect()
}

#[test]
fn after_hydration_underflow_fires_and_the_shortfall_is_provisioned_tagged_spare() {
    let mut h = Harness::with(spare_settings(vec![entry(2, &["xyz"], &["xyz"], true)]));
    assert!(h.take_calls().is_empty(), "nothing before hydration");
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(
        underflows(&h.take_notifications()),
        vec![("production".to_owned(), 0, 2)]
    );
    let created = creates(&mut h);
    assert_eq!(created.len(), 2);
    for (_, node, node_tags) in &created {
        assert!(node.as_str().starts_with("production-aws-"), "{node}");
        assert_eq!(node_tags[tags::SPARE], "true");
        assert_eq!(node_tags[tags::POOL], "production");
        assert_eq!(node_tags[tags::TIER], "aws", "the first elastic tier");
        assert_eq!(node_tags[tags::WARM_FOR], "xyz");
        assert_eq!(node_tags[tags::RESERVED_FOR], "xyz");
        assert_eq!(node_tags[tags::EXCLUSIVE], "true");
        assert!(!node_tags.contains_key(tags::PROVISIONED_FOR));
    }
    // Launching spares count: no second round of provisions.
    h.advance(1_000);
    assert!(creates(&mut h).is_empty());
}

#[test]
fn a_failed_spare_provision_leaves_no_phantom_node_and_backs_off_sixty_seconds() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let (id, node, _) = creates(&mut h).remove(0);
    h.fail(id, RpcFailureKind::InsufficientCapacity);
    assert!(h.core.fleet().get(&node).is_none(), "no phantom node");
    h.advance(SPARE_PROVISION_RETRY_BACKOFF_MS - 1);
    assert!(creates(&mut h).is_empty(), "held back for the backoff");
    h.advance(1);
    assert_eq!(creates(&mut h).len(), 1, "tried again once the backoff ends");
}

#[test]
fn a_pool_without_an_elastic_tier_only_gets_the_underflow_callback() {
    let mut settings = spare_settings(vec![HotSpareSpec {
        pool: "racks".into(),
        ..entry(2, &[], &[], false)
    }]);
    settings.placement_pools.push(
        yaml_serde::from_str("{name: racks, tiers: [{name: rack, kind: local-servers, scaleOut: fixed}]}").unwrap(),
    );
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(underflows(&h.take_notifications()), vec![("racks".to_owned(), 0, 2)]);
    assert!(creates(&mut h).is_empty(), "the operator provides the hardware");
    // An operator-tagged cluster spare counts.
    h.event(ManagerEvent::NodeStarted(node_info(
        "rack-1",
        &[(tags::POOL, "racks"), (tags::SPARE, "true")],
    )));
    assert_eq!(underflows(&h.take_notifications()), vec![("racks".to_owned(), 1, 2)]);
    assert!(creates(&mut h).is_empty());
}

#[test]
fn the_reconciler_runs_on_its_periodic_tick() {
    let mut settings = spare_settings(vec![HotSpareSpec {
        pool: "racks".into(),
        ..entry(1, &[], &[], false)
    }]);
    settings.placement_pools.push(
        yaml_serde::from_str("{name: racks, tiers: [{name: rack, kind: local-servers, scaleOut: fixed}]}").unwrap(),
    );
    settings.hot_spare_reconcile_interval_ms = 10_000;
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(underflows(&h.take_notifications()).len(), 1);
    h.advance(9_999);
    assert!(
        underflows(&h.take_notifications()).is_empty(),
        "nothing changed, no tick yet"
    );
    h.advance(1);
    assert_eq!(
        underflows(&h.take_notifications()),
        vec![("racks".to_owned(), 0, 1)],
        "the tick reconciles again"
    );
}

#[test]
fn hot_spare_reconcile_interval_defaults_to_sixty_seconds() {
    let h = hydrated_with(vec![entry(0, &[], &[], false)]);
    assert_eq!(h.core.settings().hot_spare_reconcile_interval_ms, 60_000);
    assert_eq!(h.next_deadline, Some(h.now + 60_000));
}

#[test]
fn a_spare_that_stops_is_replaced_on_the_node_lifecycle_event() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    h.take_notifications();
    h.node_stopping(
        spare.as_str(),
        norsk_auto_manager::model::NodeStopReason::HealthPingTimeExceeded,
    );
    assert_eq!(
        underflows(&h.take_notifications()),
        vec![("production".to_owned(), 0, 1)]
    );
    assert_eq!(creates(&mut h).len(), 1);
}

#[test]
fn over_target_terminates_the_coldest_spares_first() {
    let mut h = hydrated_with(vec![entry(3, &["xyz"], &[], false)]);
    let spares = running_spares(&mut h, &[&["reg/xyz:1", "reg/xyz-aux:1"], &[], &["reg/xyz:1"]]);
    h.take_calls();
    let result = h.update_hot_spare_specs(vec![entry(1, &["xyz"], &[], false)]);
    assert!(result.is_ok());
    let mut gone = terminated(&mut h);
    gone.sort();
    let mut coldest = vec![spares[1].clone(), spares[2].clone()];
    coldest.sort();
    assert_eq!(gone, coldest, "the warmest spare is kept");
    assert!(kinds(&h.take_notifications()).contains(&"nodeTerminated".to_owned()));
}

#[test]
fn last_activity_breaks_a_warmth_tie_least_recently_active_first() {
    let mut h = hydrated_with(vec![entry(2, &["xyz"], &[], false)]);
    let spares = running_spares(&mut h, &[&[], &[]]);
    // The first spare advertises again later: it was active more recently.
    h.advance(5_000);
    h.event(ManagerEvent::NodeInventory {
        node_id: spares[0].clone(),
        inventory: inventory(ProviderKind::Aws, 4.0),
    });
    h.take_calls();
    h.update_hot_spare_specs(vec![entry(1, &["xyz"], &[], false)])
        .expect("a valid list");
    assert_eq!(terminated(&mut h), vec![spares[1].clone()]);
}

#[test]
fn a_spare_that_takes_a_job_becomes_an_ordinary_node_and_is_replaced() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    h.take_calls();
    h.take_notifications();
    let b = h.bundle(
        "ch",
        "pool: production\nonLaunch: allowSpare\njobs: [{jobName: encode, requirements: {requiredCapacity: 2}}]",
    );
    assert_eq!(
        h.bound_node(&job_id(b.bundle_id.as_str(), 0, "encode")),
        Some(spare.clone())
    );
    // It takes the job once Manager accepts the start.
    let (start, _, _) = starts_of(&mut h).remove(0);
    h.ok(start);
    let calls = h.take_calls();
    let untag = calls.iter().find_map(|(_, rpc)| match rpc {
        Rpc::UpdateNodeTags { node_id, remove, .. } if node_id == &spare => Some(remove.clone()),
        _ => None,
    });
    let removed = untag.expect("the spare loses its spare tags");
    assert!(removed.contains(&tags::SPARE.to_owned()));
    assert!(
        calls.iter().any(
            |(_, rpc)| matches!(rpc, Rpc::CreateNode { tags, .. } if tags.get(tags::SPARE).is_some_and(|v| v == "true"))
        ),
        "a replacement spare is provisioned"
    );
    assert_eq!(
        underflows(&h.take_notifications()),
        vec![("production".to_owned(), 0, 1)]
    );
    assert_eq!(h.core.spare_spec(&spare), None, "an ordinary node now");
    assert_eq!(h.core.hot_spare_status()[0].consumed, 1);
}

#[test]
fn launch_avoids_an_unconsumed_spare_by_default() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    h.cluster_node("a", 4.0);
    let b = h.bundle(
        "ch",
        "pool: production\njobs: [{jobName: encode, requirements: {requiredCapacity: 2}}]",
    );
    assert_eq!(
        h.bound_node(&job_id(b.bundle_id.as_str(), 0, "encode")),
        Some(NodeId::from("a"))
    );
    assert!(h.core.spare_spec(&spare).is_some(), "still a spare");
}

#[test]
fn warm_for_starts_image_pulls_and_a_failed_image_leaves_the_spare_cold_for_it() {
    let mut h = hydrated_with(vec![entry(1, &["xyz"], &[], false)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    let pulls: Vec<(RequestId, Vec<String>)> = h
        .take_calls()
        .into_iter()
        .filter_map(|(id, rpc)| match rpc {
            Rpc::PrefetchImages { node_id, images } if node_id == spare => Some((id, images)),
            _ => None,
        })
        .collect();
    assert_eq!(pulls.len(), 1, "one pull for the spare");
    assert_eq!(pulls[0].1, vec!["reg/xyz-aux:1".to_owned(), "reg/xyz:1".to_owned()]);
    h.ok(pulls[0].0);
    h.event(ManagerEvent::ImagesPrefetched {
        node_id: spare.clone(),
        results: vec![
            ImagePrefetchResult {
                image: "reg/xyz:1".into(),
                ok: true,
                error: None,
            },
            ImagePrefetchResult {
                image: "reg/xyz-aux:1".into(),
                ok: false,
                error: Some("manifest unknown".into()),
            },
        ],
    });
    assert!(kinds(&h.take_notifications()).contains(&"imagesPrefetched".to_owned()));
    let mut inv = inventory(ProviderKind::Aws, 4.0);
    inv.images = vec!["reg/xyz:1".into()];
    h.event(ManagerEvent::NodeInventory {
        node_id: spare.clone(),
        inventory: inv,
    });
    h.advance(120_000);
    assert!(
        !h.take_calls()
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::PrefetchImages { .. })),
        "the failed image is not asked for again; the held one is warm"
    );
}

/// An AWS-only pool: spares are the only capacity besides provisioning.
fn aws_only(spares: Vec<HotSpareSpec>) -> Harness {
    let mut settings = spare_settings(spares);
    settings.placement_pools = yaml_serde::from_str(
        "- name: production\n  tiers:\n    - name: aws\n      kind: aws\n      region: eu-west-1\n      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]\n",
    )
    .unwrap();
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    h
}

#[test]
fn an_exclusive_reservation_keeps_other_templates_off_the_spare() {
    let mut h = aws_only(vec![entry(1, &[], &["xyz"], true)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    let b = h.bundle(
        "ch",
        "pool: production\nonLaunch: allowSpare\njobs: [{jobName: encode, template: other, requirements: {requiredCapacity: 2}}]",
    );
    let bound = h.bound_node(&job_id(b.bundle_id.as_str(), 0, "encode"));
    assert!(bound.is_some_and(|n| n != spare), "a node is provisioned instead");
}

#[test]
fn override_reservation_takes_an_exclusively_reserved_spare() {
    let mut h = aws_only(vec![entry(1, &[], &["xyz"], true)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    let b = h.bundle(
        "ch",
        "pool: production\nonLaunch: allowSpare\noverrideReservation: true\njobs: [{jobName: encode, template: other, requirements: {requiredCapacity: 2}}]",
    );
    assert_eq!(h.bound_node(&job_id(b.bundle_id.as_str(), 0, "encode")), Some(spare));
}

#[test]
fn reserved_for_without_exclusive_is_a_preference() {
    let mut h = aws_only(vec![entry(2, &[], &[], false)]);
    let spares = running_spares(&mut h, &[&[], &[]]);
    h.take_calls();
    // The spare later in id order is reserved for xyz: it wins the tie.
    let result = h.update_hot_spare_node(
        &spares[1],
        SpareSpec {
            reserved_for: vec!["xyz".into()],
            ..Default::default()
        },
    );
    assert_eq!(result, Ok(()));
    let xyz = h.bundle(
        "ch",
        "pool: production\nonLaunch: allowSpare\njobs: [{jobName: encode, template: xyz, requirements: {requiredCapacity: 2}}]",
    );
    assert_eq!(
        h.bound_node(&job_id(xyz.bundle_id.as_str(), 0, "encode")),
        Some(spares[1].clone())
    );
    let other = h.bundle(
        "ch2",
        "pool: production\nonLaunch: allowSpare\njobs: [{jobName: encode, template: other, requirements: {requiredCapacity: 4}}]",
    );
    assert_eq!(
        h.bound_node(&job_id(other.bundle_id.as_str(), 0, "encode")),
        Some(spares[0].clone()),
        "another template may still take a non-exclusive spare"
    );
}

#[test]
fn update_hot_spare_specs_is_validated_as_at_boot_and_rejected_whole() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    h.take_calls();
    let unknown = HotSpareSpec {
        pool: "nowhere".into(),
        ..entry(1, &[], &[], false)
    };
    let list = vec![entry(3, &[], &[], false), entry(2, &[], &[], false), unknown];
    let result = h.update_hot_spare_specs(list);
    let Err(CommandError::InvalidSettings { errors }) = result else {
        panic!("expected a validation error, got {result:?}");
    };
    let codes: Vec<String> = errors
        .iter()
        .map(|e| serde_json::to_value(e.code).unwrap().as_str().unwrap().to_owned())
        .collect();
    assert_eq!(codes, ["duplicateHotSparePool", "unknownPool"]);
    assert_eq!(
        h.core.settings().hot_spares,
        vec![entry(1, &[], &[], false)],
        "nothing changed"
    );
    assert!(creates(&mut h).is_empty());
}

#[test]
fn update_hot_spare_specs_converges_at_once_and_returns_the_diff_by_pool() {
    let mut settings = spare_settings(vec![entry(1, &["xyz"], &["xyz"], false)]);
    settings.placement_pools.push(
        yaml_serde::from_str(
            "{name: edge, tiers: [{name: oci, kind: oci, region: eu-frankfurt-1, candidateInstanceTypes: [{instanceType: VM.Standard3.Flex, totalCapacity: 4}]}]}",
        )
        .unwrap(),
    );
    settings.hot_spares.push(HotSpareSpec {
        pool: "edge".into(),
        spec: yaml_serde::from_str("{instanceType: VM.Standard3.Flex}").unwrap(),
        ..entry(1, &[], &[], false)
    });
    let mut h = Harness::with(settings);
    h.event(ManagerEvent::InitialDataComplete);
    let spares = running_spares(&mut h, &[&[], &[]]);
    let (production, edge) = (spares[0].clone(), spares[1].clone());
    assert!(edge.as_str().starts_with("edge-"), "{edge}");
    h.take_calls();
    // edge removed; production's target, warmFor and exclusive changed
    // (reservedFor kept).
    let mut changed = entry(1, &["other"], &["xyz"], true);
    changed.target_count = 2;
    let result = h.update_hot_spare_specs(vec![changed.clone()]);
    let diff = result.expect("valid");
    assert!(matches!(diff["edge"], HotSpareChange::Removed { .. }));
    let HotSpareChange::Changed { fields, after, .. } = &diff["production"] else {
        panic!("production changed: {diff:?}");
    };
    assert_eq!(
        fields,
        &[
            HotSpareField::TargetCount,
            HotSpareField::WarmFor,
            HotSpareField::Exclusive
        ]
    );
    assert_eq!(after, &changed);
    let calls = h.take_calls();
    let tag_update = calls.iter().find_map(|(_, rpc)| match rpc {
        Rpc::UpdateNodeTags { node_id, set, remove } if node_id == &production => Some((set.clone(), remove.clone())),
        _ => None,
    });
    let (set, remove) = tag_update.expect("the live spare's tags are written");
    assert_eq!(
        set,
        BTreeMap::from([
            (tags::WARM_FOR.to_owned(), "other".to_owned()),
            (tags::EXCLUSIVE.to_owned(), "true".to_owned())
        ]),
        "only the fields that changed"
    );
    assert!(remove.is_empty());
    assert!(
        calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::TerminateNode { node_id } if node_id == &edge)),
        "the removed entry's spare is reaped as an orphan"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. }))
            .count(),
        1,
        "the raised target is provisioned at once"
    );
    assert_eq!(
        h.core.spare_spec(&production),
        Some(SpareSpec {
            warm_for: vec!["other".into()],
            reserved_for: vec!["xyz".into()],
            exclusive: true
        })
    );
    // Re-sending the same list changes nothing.
    let again = h.update_hot_spare_specs(vec![changed]);
    assert_eq!(again.map(|d| d.len()), Ok(0));
}

#[test]
fn an_added_entry_is_provisioned_at_once() {
    let mut h = hydrated_with(vec![]);
    assert!(creates(&mut h).is_empty());
    let result = h.update_hot_spare_specs(vec![entry(2, &[], &[], false)]);
    assert!(matches!(result.unwrap()["production"], HotSpareChange::Added { .. }));
    assert_eq!(creates(&mut h).len(), 2);
}

#[test]
fn update_hot_spare_node_edits_one_spare_and_spare_spec_reads_it_back() {
    let mut h = hydrated_with(vec![entry(1, &["xyz"], &[], false)]);
    h.cluster_node("a", 4.0);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    h.take_calls();
    let spec = SpareSpec {
        warm_for: vec!["xyz".into()],
        reserved_for: vec!["other".into()],
        exclusive: true,
    };
    let result = h.update_hot_spare_node(&spare, spec.clone());
    assert_eq!(result, Ok(()));
    assert_eq!(h.core.spare_spec(&spare), Some(spec));
    let sets: Vec<BTreeMap<String, String>> = h
        .take_calls()
        .into_iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::UpdateNodeTags { set, .. } => Some(set),
            _ => None,
        })
        .collect();
    assert_eq!(
        sets,
        vec![BTreeMap::from([
            (tags::RESERVED_FOR.to_owned(), "other".to_owned()),
            (tags::EXCLUSIVE.to_owned(), "true".to_owned())
        ])]
    );
    let refused = h.update_hot_spare_node(&NodeId::from("a"), SpareSpec::default());
    assert_eq!(refused, Err(CommandError::NotASpare(NodeId::from("a"))));
    let unknown = h.update_hot_spare_node(&NodeId::from("zz"), SpareSpec::default());
    assert_eq!(unknown, Err(CommandError::UnknownNode(NodeId::from("zz"))));
}

#[test]
fn pool_gauges_count_live_spares_and_follow_the_target() {
    let mut h = hydrated_with(vec![entry(2, &[], &[], false)]);
    let gauge = |h: &Harness| {
        let m = h.core.metrics(h.now);
        let p = m.pools.iter().find(|p| p.pool_name == "production").unwrap();
        (p.live_spares, p.spare_target)
    };
    assert_eq!(gauge(&h), (0, 2), "launching spares are not live yet");
    running_spares(&mut h, &[&[], &[]]);
    assert_eq!(gauge(&h), (2, 2));
    h.update_hot_spare_specs(vec![entry(1, &[], &[], false)])
        .expect("a valid list");
    assert_eq!(gauge(&h), (1, 1), "the excess is terminated, the target follows");
}

#[test]
fn an_updated_list_survives_a_reconnect() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    h.update_hot_spare_specs(vec![entry(3, &[], &[], false)])
        .expect("a valid list");
    let valid = validate_auto_settings(spare_settings(vec![entry(1, &[], &[], false)])).unwrap();
    let fresh = norsk_auto_manager::automanager::AutoManagerCore::succeeding(valid, &h.core);
    assert_eq!(fresh.settings().hot_spares, vec![entry(3, &[], &[], false)]);
}

fn service(name: &str, lifecycle: &str) -> NodeServiceSpec {
    NodeServiceSpec {
        name: name.into(),
        lifecycle: lifecycle.into(),
        template: "agent".into(),
        pools: vec![],
        provides: vec!["metrics".into()],
    }
}

fn settings_codes(settings: AutoSettings) -> Vec<String> {
    validate_auto_settings(settings)
        .err()
        .map(|e| {
            e.errors
                .iter()
                .map(|i| serde_json::to_value(i.code).unwrap().as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn node_services_without_the_experimental_flag_are_refused() {
    let settings = AutoSettings {
        node_services: vec![service("agent", "eager")],
        ..settings()
    };
    assert_eq!(settings_codes(settings), ["experimentalNotEnabled"]);
}

#[test]
fn a_node_service_lifecycle_other_than_eager_is_refused() {
    let settings = AutoSettings {
        node_services: vec![service("agent", "lazy")],
        experimental: Experimental {
            node_services: true,
            ..Experimental::default()
        },
        ..settings()
    };
    assert_eq!(settings_codes(settings), ["unsupportedNodeServiceLifecycle"]);
    let yaml = "url: m:1\nexperimental: {nodeServices: true}\nnodeServices: [{name: a, template: t}]\n";
    let parsed: AutoSettings = yaml_serde::from_str(yaml).unwrap();
    assert_eq!(parsed.node_services[0].lifecycle, "eager", "eager by default");
}

#[test]
fn a_node_service_is_placed_eagerly_on_every_running_node_it_applies_to() {
    let mut h = Harness::with(AutoSettings {
        node_services: vec![service("agent", "eager")],
        experimental: Experimental {
            node_services: true,
            ..Experimental::default()
        },
        ..settings()
    });
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    let placed_on = |h: &mut Harness| -> Vec<NodeId> {
        let mut nodes = Vec::new();
        for _ in 0..2 {
            for (id, rpc) in h.take_calls() {
                match rpc {
                    Rpc::CreateJob { job_id, template, tags } => {
                        assert_eq!(template, "agent");
                        assert_eq!(tags["nodeService"], "agent");
                        assert!(job_id.0.starts_with("nodeService/agent/"));
                        h.ok(id);
                    }
                    Rpc::StartJob { node_id, .. } => {
                        nodes.push(node_id);
                        h.ok(id);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        nodes
    };
    assert_eq!(placed_on(&mut h), vec![NodeId::from("a")]);
    h.cluster_node("b", 4.0);
    assert_eq!(
        placed_on(&mut h),
        vec![NodeId::from("b")],
        "a node that joins gets it too"
    );
    let phases: Vec<ServicePhase> = h.core.node_service_placements().map(|(_, _, p)| p).collect();
    assert_eq!(phases, [ServicePhase::Placed, ServicePhase::Placed]);
    h.advance(120_000);
    assert!(h.take_calls().is_empty(), "placed once per node");
}

#[test]
fn a_node_service_that_stops_is_placed_again_after_its_backoff() {
    let mut h = Harness::with(AutoSettings {
        node_services: vec![service("agent", "eager")],
        experimental: Experimental {
            node_services: true,
            ..Experimental::default()
        },
        ..settings()
    });
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    let starts = |h: &mut Harness| -> usize {
        let mut started = 0;
        for _ in 0..2 {
            for (id, rpc) in h.take_calls() {
                started += usize::from(matches!(rpc, Rpc::StartJob { .. }));
                h.ok(id);
            }
        }
        started
    };
    assert_eq!(starts(&mut h), 1);
    let job_id = JobId::from("nodeService/agent/a");
    let mut job = RuntimeJob {
        job_id: job_id.clone(),
        state: JobState::Active,
        tags: BTreeMap::new(),
        start_date_time: None,
        bundle_ref: None,
        spec: yaml_serde::from_str("{jobName: agent, template: agent}").unwrap(),
        context: None,
        dormant: false,
        terminal_verdict: None,
        history: vec![JobHistoryEntry::Running {
            at: None,
            role: InstanceKey("primary".into()),
            node_id: Some(NodeId::from("a")),
        }],
    };
    h.event(ManagerEvent::JobUpdated(job.clone()));
    h.advance(120_000);
    assert_eq!(starts(&mut h), 0, "a running service is left alone");
    job.history.push(JobHistoryEntry::Stopped {
        at: None,
        role: InstanceKey("primary".into()),
        node_id: Some(NodeId::from("a")),
    });
    h.event(ManagerEvent::JobUpdated(job));
    h.advance(59_999);
    assert_eq!(starts(&mut h), 0, "placed again before NODE_SERVICE_RETRY_BACKOFF_MS");
    h.advance(1);
    assert_eq!(starts(&mut h), 1, "the stopped service was not placed again");
    h.event(ManagerEvent::JobDeleted(job_id));
    h.advance(60_000);
    assert_eq!(starts(&mut h), 1, "a deleted service job is placed again");
}

#[test]
fn hot_spare_status_tells_live_from_provisioning_and_reports_the_backoff() {
    let mut h = hydrated_with(vec![entry(2, &[], &[], false)]);
    let mut created = creates(&mut h);
    let (failed, _, _) = created.remove(0);
    h.fail(failed, RpcFailureKind::InsufficientCapacity);
    let status = h.core.hot_spare_status();
    assert_eq!(status.len(), 1);
    assert_eq!((status[0].live, status[0].provisioning, status[0].target), (0, 1, 2));
    assert_eq!(status[0].underflow, Some(1), "short by the failed one");
    assert_eq!(status[0].backoff_until, Some(h.now + SPARE_PROVISION_RETRY_BACKOFF_MS));
    assert_eq!(status[0].last_underflow_at, Some(h.now));
}

#[test]
fn a_spare_that_never_starts_is_terminated_at_its_provision_timeout_and_replaced() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let (id, node, _) = creates(&mut h).remove(0);
    h.ok(id);
    // The aws tier's provisionTimeoutMs is 10 minutes.
    h.advance(600_000);
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::TerminateNode { node_id } if node_id == &node))
    );
    assert_eq!(
        calls
            .iter()
            .filter(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. }))
            .count(),
        1,
        "a replacement is provisioned"
    );
}

#[test]
fn spares_of_a_pool_without_an_entry_are_reaped_as_orphans_after_hydration() {
    let mut h = Harness::with(spare_settings(vec![]));
    h.provisioned_node_starts(
        "old-spare",
        ProviderKind::Aws,
        &[(tags::POOL, "production"), (tags::TIER, "aws"), (tags::SPARE, "true")],
    );
    h.provisioned_node_starts(
        "rack-spare",
        ProviderKind::LocalServers,
        &[(tags::POOL, "production"), (tags::SPARE, "true")],
    );
    assert!(h.take_calls().is_empty());
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(
        terminated(&mut h),
        vec![NodeId::from("old-spare")],
        "a cluster node is never terminated"
    );
}

#[test]
fn a_refused_node_service_is_tried_again_after_its_backoff() {
    let mut agent = service("agent", "eager");
    agent.pools = vec!["production".into()];
    let mut h = Harness::with(AutoSettings {
        node_services: vec![agent],
        experimental: Experimental {
            node_services: true,
            ..Experimental::default()
        },
        ..settings()
    });
    h.cluster_node("a", 4.0);
    // A node of no configured pool does not get the service.
    h.event(ManagerEvent::NodeStarted(node_info("stray", &[])));
    h.event(ManagerEvent::InitialDataComplete);
    let calls = h.take_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    h.fail(calls[0].0, RpcFailureKind::Transient);
    assert!(kinds(&h.take_notifications()).contains(&"error".to_owned()));
    h.advance(NODE_SERVICE_RETRY_BACKOFF_MS - 1);
    assert!(h.take_calls().is_empty());
    h.advance(1);
    let again = h.take_calls();
    assert!(
        matches!(&again[..], [(_, Rpc::CreateJob { job_id, .. })] if job_id.0 == "nodeService/agent/a"),
        "{again:?}"
    );
}

#[test]
fn a_changed_warm_for_starts_pulls_on_the_live_spares_at_once() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    assert!(
        !h.take_calls()
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::PrefetchImages { .. })),
        "nothing to warm yet"
    );
    h.update_hot_spare_specs(vec![entry(1, &["other"], &[], false)])
        .expect("a valid list");
    let pulls: Vec<(NodeId, Vec<String>)> = h
        .take_calls()
        .into_iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::PrefetchImages { node_id, images } => Some((node_id, images)),
            _ => None,
        })
        .collect();
    assert_eq!(pulls, vec![(spare, vec!["reg/other:1".to_owned()])]);
}

// "A spare that picks up a job is no longer a spare": it picks the job up
// when Manager accepts the job's start there, not when placement chooses it.

/// `StartJob` calls taken from the harness: (request, job, node).
fn starts_of(h: &mut Harness) -> Vec<(RequestId, JobId, NodeId)> {
    h.take_calls()
        .into_iter()
        .filter_map(|(id, rpc)| match rpc {
            Rpc::StartJob { job_id, node_id, .. } => Some((id, job_id, node_id)),
            _ => None,
        })
        .collect()
}

/// Nodes whose spare tags an `UpdateNodeTags` in `calls` removes.
fn untagged(calls: &[(RequestId, Rpc)]) -> Vec<NodeId> {
    calls
        .iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::UpdateNodeTags { node_id, remove, .. } if remove.iter().any(|t| t == tags::SPARE) => {
                Some(node_id.clone())
            }
            _ => None,
        })
        .collect()
}

/// (live, provisioning, consumed) as the `HotSparePolicy` status shows
/// them, checked against the pool gauge.
fn spare_counts(h: &Harness) -> (u32, u32, u64) {
    let status = &h.core.hot_spare_status()[0];
    let metrics = h.core.metrics(h.now);
    let gauge = metrics.pools.iter().find(|p| p.pool_name == "production").unwrap();
    assert_eq!(gauge.live_spares, status.live, "the pool gauge and the status agree");
    (status.live, status.provisioning, status.consumed)
}

fn refuse(h: &mut Harness, id: RequestId, kind: RpcFailureKind, message: &str) {
    h.input(norsk_auto_manager::automanager::Input::RpcResult {
        id,
        result: Err(norsk_auto_manager::automanager::RpcFailure {
            kind,
            message: message.to_owned(),
        }),
    });
}

#[test]
fn a_spare_is_consumed_only_once_manager_accepts_the_start_on_it() {
    let mut h = hydrated_with(vec![entry(1, &[], &[], false)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    h.take_calls();
    h.take_notifications();
    let b = h.bundle(
        "ch",
        "pool: production\nonLaunch: allowSpare\njobs: [{jobName: encode, requirements: {requiredCapacity: 2}}]",
    );
    let job = job_id(b.bundle_id.as_str(), 0, "encode");
    let calls = h.take_calls();
    let start = calls
        .iter()
        .find_map(|(id, rpc)| matches!(rpc, Rpc::StartJob { node_id, .. } if node_id == &spare).then_some(*id))
        .expect("the job is started on the spare");
    assert!(untagged(&calls).is_empty(), "placed, not yet accepted: still a spare");
    assert!(
        !calls.iter().any(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. })),
        "no replacement for a spare that still counts"
    );
    assert!(underflows(&h.take_notifications()).is_empty());
    assert!(h.core.spare_spec(&spare).is_some());
    assert_eq!(spare_counts(&h), (1, 0, 0));

    h.ok(start);
    let calls = h.take_calls();
    assert_eq!(untagged(&calls), vec![spare.clone()], "accepted: the spare tags go");
    assert!(
        calls.iter().any(
            |(_, rpc)| matches!(rpc, Rpc::CreateNode { tags, .. } if tags.get(tags::SPARE).is_some_and(|v| v == "true"))
        ),
        "a replacement spare is provisioned"
    );
    assert_eq!(
        underflows(&h.take_notifications()),
        vec![("production".to_owned(), 0, 1)]
    );
    assert_eq!(h.core.spare_spec(&spare), None, "an ordinary node now");
    assert_eq!(h.bound_node(&job), Some(spare));
    assert_eq!(spare_counts(&h), (0, 1, 1));
}

#[test]
fn a_start_refused_on_a_spare_leaves_it_a_spare_with_its_tags_and_count() {
    let mut h = hydrated_with(vec![entry(1, &["xyz"], &["xyz"], false)]);
    let spare = running_spares(&mut h, &[&["reg/xyz:1", "reg/xyz-aux:1"]]).remove(0);
    h.take_calls();
    h.take_notifications();
    h.bundle(
        "ch",
        "pool: production\nonLaunch: allowSpare\njobs: [{jobName: encode, template: xyz, requirements: {requiredCapacity: 2}}]",
    );
    let (start, _, node) = starts_of(&mut h).remove(0);
    assert_eq!(node, spare);
    h.fail(start, RpcFailureKind::Rejected);
    let calls = h.take_calls();
    assert!(untagged(&calls).is_empty(), "no untagging for a refused start");
    assert!(!calls.iter().any(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. })));
    assert!(underflows(&h.take_notifications()).is_empty());
    assert_eq!(
        h.core.spare_spec(&spare),
        Some(SpareSpec {
            warm_for: vec!["xyz".into()],
            reserved_for: vec!["xyz".into()],
            exclusive: false,
        }),
        "it keeps its spare tags"
    );
    assert_eq!(spare_counts(&h), (1, 0, 0));
    assert!(!h.core.fleet().get(&spare).unwrap().health.is_unhealthy());
}

/// A spare pool of `target` running spares beside cluster node `node-s1`,
/// carrying the preferSpare job `ch/0/encode`, running.
fn job_on_a_node_beside_spares(target: u32) -> (Harness, JobId, Vec<NodeId>) {
    let mut h = hydrated_with(vec![entry(target, &[], &[], false)]);
    let images: Vec<&[&str]> = (0..target).map(|_| &[][..]).collect();
    let spares = running_spares(&mut h, &images);
    h.cluster_node("node-s1", 4.0);
    h.take_calls();
    let b = h.bundle(
        "ch",
        "pool: production\njobs: [{jobName: encode, requirements: {requiredCapacity: 2, onRuntimeFailure: preferSpare}}]",
    );
    let job = job_id(b.bundle_id.as_str(), 0, "encode");
    assert_eq!(h.start_all(), vec![(job.clone(), NodeId::from("node-s1"))]);
    h.take_notifications();
    (h, job, spares)
}

const STILL_ON_S1: &str = "instance \"primary\" of job \"ch/0/encode\" already exists: it runs on node \"node-s1\"";

/// The worker of `node-s1` dropped: the job is re-placed on a spare and
/// Manager refuses the start, the old instance still being there.
fn refused_while_the_old_instance_runs(h: &mut Harness, spares: &[NodeId]) {
    h.node_stopping(
        "node-s1",
        norsk_auto_manager::model::NodeStopReason::HealthPingTimeExceeded,
    );
    let (start, _, node) = starts_of(h).remove(0);
    assert_eq!(node, spares[0], "preferSpare: the recovery goes to a spare");
    refuse(h, start, RpcFailureKind::AlreadyExists, STILL_ON_S1);
}

#[test]
fn a_start_refused_because_the_instance_still_runs_on_the_stopping_node_keeps_the_spare_and_waits() {
    let (mut h, job, spares) = job_on_a_node_beside_spares(2);
    refused_while_the_old_instance_runs(&mut h, &spares);
    let calls = h.take_calls();
    assert!(untagged(&calls).is_empty(), "the spare keeps its tags");
    assert!(
        !calls.iter().any(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. })),
        "no capacity is provisioned for it"
    );
    assert!(h.core.spare_spec(&spares[0]).is_some());
    assert_eq!(spare_counts(&h), (2, 0, 0));
    let notes = h.take_notifications();
    assert!(underflows(&notes).is_empty());
    assert!(!kinds(&notes).contains(&"nodeUnhealthy".to_owned()));
    assert!(
        notes.iter().any(|n| matches!(n, Notification::Error { message }
            if message.contains("still holds instance primary on stopping node node-s1"))),
        "the refusal says what it waits for: {notes:?}"
    );
    assert_eq!(h.bound_node(&job), None);

    // While node-s1 is stopping the job is neither started again nor placed
    // elsewhere, past the recovery spacing.
    h.advance(20_000);
    let calls = h.take_calls();
    assert!(
        !calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::StartJob { .. } | Rpc::CreateNode { .. })),
        "{calls:?}"
    );
    assert!(!kinds(&h.take_notifications()).contains(&"placementDecision".to_owned()));

    // The old instance is gone with its node: recovered, on the spare.
    h.event(ManagerEvent::NodeStopped(NodeId::from("node-s1")));
    let (start, started, node) = starts_of(&mut h).remove(0);
    assert_eq!((started, node.clone()), (job.clone(), spares[0].clone()));
    assert_eq!(spare_counts(&h), (2, 0, 0), "not consumed before it is accepted");
    h.ok(start);
    assert_eq!(untagged(&h.take_calls()), vec![spares[0].clone()]);
    assert_eq!(spare_counts(&h).2, 1, "one spare consumed, the one carrying the job");
    assert!(h.core.spare_spec(&spares[1]).is_some(), "the other spare untouched");
    assert!(!h.core.fleet().get(&spares[0]).unwrap().health.is_unhealthy());
}

#[test]
fn a_job_held_by_a_stopping_node_is_recovered_when_its_old_instance_stops() {
    let (mut h, job, spares) = job_on_a_node_beside_spares(1);
    refused_while_the_old_instance_runs(&mut h, &spares);
    h.take_calls();
    h.advance(6_000);
    assert!(starts_of(&mut h).is_empty(), "waiting for the old instance");
    // Manager stops the old instance before the node's keepalive runs out.
    h.stopped(&job, &NodeId::from("node-s1"), InstanceKey("primary".into()));
    let starts = starts_of(&mut h);
    assert_eq!(
        starts
            .iter()
            .map(|(_, j, n)| (j.clone(), n.clone()))
            .collect::<Vec<_>>(),
        vec![(job, spares[0].clone())]
    );
}

#[test]
fn no_spare_underflow_repeats_while_the_spares_are_intact() {
    let (mut h, job, spares) = job_on_a_node_beside_spares(2);
    refused_while_the_old_instance_runs(&mut h, &spares);
    // node-s1 stays stopping for three reconcile ticks; every retry after
    // the grace is refused the same way.
    let mut refusals = 1;
    for _ in 0..18 {
        h.advance(10_000);
        for (id, rpc) in h.take_calls() {
            match rpc {
                Rpc::StartJob { job_id, node_id, .. } => {
                    assert_eq!((job_id, node_id), (job.clone(), spares[0].clone()));
                    refuse(&mut h, id, RpcFailureKind::AlreadyExists, STILL_ON_S1);
                    refusals += 1;
                }
                Rpc::CreateNode { .. } => panic!("capacity provisioned while the spares are intact"),
                Rpc::UpdateNodeTags { node_id, .. } => panic!("{node_id} untagged without a job accepted on it"),
                _ => h.ok(id),
            }
        }
        assert_eq!(spare_counts(&h), (2, 0, 0));
        let notes = h.take_notifications();
        assert!(underflows(&notes).is_empty(), "{:?}", underflows(&notes));
        assert!(!kinds(&notes).contains(&"nodeUnhealthy".to_owned()));
    }
    // Retried once per `FAILED_INSTANCE_STOP_GRACE_MS` (30 s), not every
    // `MIN_RECOVERY_INTERVAL_MS`.
    assert!((6..=8).contains(&refusals), "{refusals} refusals in three minutes");
    assert!(spares.iter().all(|s| h.core.spare_spec(s).is_some()));
}

#[test]
fn a_migration_pinned_to_an_exclusively_reserved_spare_takes_it_only_with_override_reservation() {
    let mut h = aws_only(vec![entry(1, &[], &["xyz"], true)]);
    let spare = running_spares(&mut h, &[&[]]).remove(0);
    // A job of another template runs on a node provisioned for it.
    let b = h.bundle(
        "ch",
        "pool: production\njobs: [{jobName: encode, template: other, requirements: {requiredCapacity: 2}}]",
    );
    let job = job_id(b.bundle_id.as_str(), 0, "encode");
    let (id, node, node_tags) = creates(&mut h).remove(0);
    h.ok(id);
    let t: Vec<(&str, &str)> = node_tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    h.provisioned_node_starts(node.as_str(), ProviderKind::Aws, &t);
    h.event(ManagerEvent::NodeInventory {
        node_id: node.clone(),
        inventory: inventory(ProviderKind::Aws, 4.0),
    });
    assert_eq!(h.start_all(), vec![(job.clone(), node.clone())]);

    let migrate = |h: &mut Harness, override_reservation: bool| {
        crate::support::migration::try_migrate(
            h,
            &job,
            norsk_auto_manager::automanager::MigrationOptions {
                strategy: Some(norsk_auto_manager::automanager::MigrationStrategy::Overlap),
                target_node_id: Some(spare.clone()),
                override_reservation,
            },
        )
    };
    // The reservation is a guarantee: a pin alone does not break it.
    let refused = migrate(&mut h, false);
    assert!(
        refused.is_err(),
        "a pin without overrideReservation took the reserved spare: {refused:?}"
    );
    assert_eq!(h.bound_node(&job), Some(node.clone()), "the job stays where it runs");
    // The operator's explicit yes: the target starts on the spare.
    let accepted = migrate(&mut h, true).expect("overrideReservation takes the spare");
    let state = crate::support::migration::state(&h, &accepted);
    assert_eq!(
        state.target_node_id, spare,
        "the migration's target is the reserved spare"
    );
}

/// A `stopThenStart` migration of the job on `node-s1` pinned to the spare,
/// on a published Manager: the port keeps the deferred start and tells it
/// prepared, the source stops, and the first `StartPreparedJob` goes
/// unheard (the port gave its kept start up with it; Manager may have made
/// nothing). The try sent again is still unanswered when the
/// `startingTarget` deadline completes the migration onto the target.
/// Returns the core, the job, the spare and the unanswered try.
fn moved_onto_a_spare_before_its_start_is_answered() -> (Harness, JobId, NodeId, RequestId) {
    let (mut h, job, spares) = job_on_a_node_beside_spares(1);
    let spare = spares[0].clone();
    h.input(norsk_auto_manager::automanager::Input::ManagerCapabilities(
        norsk_auto_manager::model::manager::Capabilities::default(),
    ));
    h.take_calls();
    let id = crate::support::migration::try_migrate(
        &mut h,
        &job,
        norsk_auto_manager::automanager::MigrationOptions {
            strategy: Some(norsk_auto_manager::automanager::MigrationStrategy::StopThenStart),
            target_node_id: Some(spare.clone()),
            ..Default::default()
        },
    )
    .expect("the migration starts");
    let target = h
        .take_calls()
        .into_iter()
        .find_map(|(call, rpc)| matches!(rpc, Rpc::StartMigrationTarget { .. }).then_some(call))
        .expect("the target is started deferred");
    h.ok(target);
    crate::support::migration::prepared(&mut h, &id);
    for (call, _) in h.take_calls() {
        h.ok(call);
    }
    crate::support::migration::source_stops(&mut h, &id);
    let start_prepared = |h: &mut Harness| {
        h.take_calls()
            .into_iter()
            .find_map(|(call, rpc)| matches!(rpc, Rpc::StartPreparedJob { .. }).then_some(call))
            .expect("the prepared target is started")
    };
    let first = start_prepared(&mut h);
    h.fail(first, RpcFailureKind::Transient);
    let again = start_prepared(&mut h);
    h.take_notifications();
    h.advance(norsk_auto_manager::automanager::migration::DEFAULT_MIGRATION_START_TIMEOUT_MS as i64);
    assert_eq!(
        crate::support::migration::state(&h, &id).phase,
        norsk_auto_manager::automanager::MigrationPhase::Done,
        "failed forward onto the target"
    );
    assert_eq!(h.bound_node(&job), Some(spare.clone()));
    (h, job, spare, again)
}

#[test]
fn a_spare_a_migration_completes_onto_before_its_prepared_start_is_answered_stays_a_spare() {
    let (mut h, job, spare, again) = moved_onto_a_spare_before_its_start_is_answered();
    let calls = h.take_calls();
    assert!(untagged(&calls).is_empty(), "no job accepted on it yet: {calls:?}");
    assert!(!calls.iter().any(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. })));
    assert!(h.core.spare_spec(&spare).is_some(), "it keeps its spare tags");
    assert_eq!(spare_counts(&h), (1, 0, 0));

    // Nothing was prepared any more: the job is placed again, the spare
    // still a spare.
    h.fail(again, RpcFailureKind::NotFound);
    assert_ne!(h.bound_node(&job), Some(spare.clone()));
    let calls = h.take_calls();
    assert!(untagged(&calls).is_empty(), "{calls:?}");
    assert!(h.core.spare_spec(&spare).is_some());
    assert_eq!(spare_counts(&h).2, 0, "no spare consumed");
}

#[test]
fn a_spare_a_migration_completed_onto_is_consumed_once_its_prepared_start_is_accepted() {
    let (mut h, job, spare, again) = moved_onto_a_spare_before_its_start_is_answered();
    h.take_calls();
    h.ok(again);
    assert_eq!(
        untagged(&h.take_calls()),
        vec![spare.clone()],
        "accepted: the spare tags go"
    );
    assert_eq!(h.core.spare_spec(&spare), None);
    assert_eq!(h.bound_node(&job), Some(spare));
    assert_eq!(spare_counts(&h).2, 1);
}
