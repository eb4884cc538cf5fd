//! The Manager client against the real simulator over loopback: the event
//! session (snapshot, live events, reconnect with a fresh snapshot), typed
//! RPC errors, what each injected fault looks like to the client, and
//! hostile messages that are normalised or reported while the stream goes
//! on.

use std::time::Duration;

use norsk_auto_manager::manager::client::{ClientSettings, CreateNode, ManagerClient, RpcErrorKind, StartJob};
use norsk_auto_manager::manager::mirror::{ManagerMirror, live_instances};
use norsk_auto_manager::manager::proto::{common as pbc, manager as pb, sim_admin};
use norsk_auto_manager::manager::stream::{ConnectionState, StreamItem, StreamSession, StreamSettings};
use norsk_auto_manager::manager::wire;
use norsk_auto_manager::model::{
    Bundle, BundleId, BundleSpec, InstanceKey, InterruptionKind, JobHistoryEntry, JobId, JobStopReason, ManagerEvent,
    NodeId, NodeInventory, NodePhase, ProviderKind, RejectionCode,
};
use norsk_auto_manager::sim::{SimConfig, SimHandle, Simulator};
use sim_admin::sim_admin_client::SimAdminClient;
use tonic::transport::Channel;

/// Long enough for anything the simulator does at this time scale; a test
/// only waits this long when it is about to fail.
const PATIENCE: Duration = Duration::from_secs(20);
const TIME_SCALE: f64 = 1000.0;

struct Harness {
    sim: SimHandle,
    client: ManagerClient,
    admin: SimAdminClient<Channel>,
}

async fn harness() -> Harness {
    let sim = Simulator::start(SimConfig {
        time_scale: TIME_SCALE,
        seed: 7,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let client = ManagerClient::connect_lazy(&ClientSettings::plaintext(sim.url())).unwrap();
    let admin = SimAdminClient::connect(sim.url()).await.unwrap();
    Harness { sim, client, admin }
}

fn session(client: &ManagerClient) -> StreamSession {
    StreamSession::start(
        client.clone(),
        StreamSettings {
            backoff_base: Duration::from_millis(20),
            backoff_cap: Duration::from_millis(200),
            ..Default::default()
        },
    )
}

fn inventory(capacity: f64) -> NodeInventory {
    NodeInventory::local_server("studio", "studio-a", "rack", capacity)
}

async fn register(admin: &mut SimAdminClient<Channel>, id: &str) {
    admin
        .register_node(sim_admin::RegisterNodeRequest {
            node_id: id.into(),
            tags: [("pool".to_owned(), "studio".to_owned())].into(),
            inventory: Some(wire::inventory_to_pb(&NodeId(id.into()), &inventory(8.0))),
        })
        .await
        .unwrap();
}

fn bundle(name: &str) -> Bundle {
    let spec: BundleSpec = yaml_serde::from_str(
        "pool: studio\njobs:\n  - jobName: encode\n    template: encoder\n    requirements: {requiredCapacity: 1}\n",
    )
    .unwrap();
    Bundle {
        bundle_id: BundleId(format!("default/{name}")),
        spec,
        ..Default::default()
    }
}

/// The next item, or a failure naming what was awaited.
async fn next(session: &mut StreamSession, what: &str) -> StreamItem {
    match tokio::time::timeout(PATIENCE, session.items.recv()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("stream session ended while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

async fn snapshot(session: &mut StreamSession) -> Vec<ManagerEvent> {
    loop {
        if let StreamItem::Snapshot(events) = next(session, "a snapshot").await {
            return events;
        }
    }
}

/// Live events until one matches, returning it and everything seen before.
async fn until(session: &mut StreamSession, what: &str, pred: impl Fn(&ManagerEvent) -> bool) -> Vec<ManagerEvent> {
    let mut seen = Vec::new();
    loop {
        match next(session, what).await {
            StreamItem::Event(e) => {
                let done = pred(&e);
                seen.push(*e);
                if done {
                    return seen;
                }
            }
            StreamItem::Snapshot(_) => panic!("unexpected reconnect while waiting for {what}"),
            StreamItem::Rejected(e) => panic!("unexpected rejected message {e} while waiting for {what}"),
        }
    }
}

/// What must agree between two observers: live nodes with their
/// inventories, jobs with their histories, bundles. (Stopped nodes may or
/// may not still be listed, depending on when a snapshot was taken.)
fn view(m: &ManagerMirror) -> String {
    let nodes: Vec<_> = m.running_nodes().collect();
    serde_json::to_string(&(nodes, &m.jobs, &m.bundles)).unwrap()
}

/// One fresh stream's snapshot, as an independent observer sees it.
async fn observed(client: &ManagerClient) -> ManagerMirror {
    let mut s = session(client);
    let events = snapshot(&mut s).await;
    s.close().await;
    ManagerMirror::from_snapshot(&events)
}

async fn running_on(session: &mut StreamSession, job: &JobId, key: &str) -> Vec<ManagerEvent> {
    until(session, "the instance running", |e| match e {
        ManagerEvent::JobUpdated(j) if &j.job_id == job => {
            live_instances(j).iter().any(|i| i.running && i.role.as_str() == key)
        }
        _ => false,
    })
    .await
}

#[tokio::test]
async fn snapshot_comes_first_then_live_events() {
    let mut h = harness().await;
    register(&mut h.admin, "rack-1").await;
    let jobs = h.client.create_bundle(&bundle("ch1")).await.unwrap();
    assert_eq!(jobs, vec![JobId("default/ch1/0/encode".into())]);

    let mut s = session(&h.client);
    let events = snapshot(&mut s).await;
    let mirror = ManagerMirror::from_snapshot(&events);
    assert_eq!(mirror.nodes[&NodeId("rack-1".into())].phase, NodePhase::Running);
    assert!(mirror.nodes[&NodeId("rack-1".into())].inventory.is_some());
    assert!(mirror.bundles.contains_key(&BundleId("default/ch1".into())));
    assert!(mirror.jobs.contains_key(&jobs[0]));
    assert_eq!(*s.state.borrow(), ConnectionState::Ready);

    h.client.create_bundle(&bundle("ch2")).await.unwrap();
    let live = until(&mut s, "ch2's job", |e| matches!(e, ManagerEvent::JobActive(j) | ManagerEvent::JobUpdated(j) if j.job_id.as_str() == "default/ch2/0/encode")).await;
    assert!(
        live.iter()
            .any(|e| matches!(e, ManagerEvent::BundleUpdated(b) if b.bundle_id.as_str() == "default/ch2"))
    );
    s.close().await;
    h.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_dropped_stream_resumes_with_a_fresh_snapshot_losing_and_duplicating_nothing() {
    let mut h = harness().await;
    register(&mut h.admin, "rack-1").await;
    register(&mut h.admin, "rack-2").await;
    h.client.create_bundle(&bundle("ch1")).await.unwrap();

    let mut s = session(&h.client);
    let mut mirror = ManagerMirror::from_snapshot(&snapshot(&mut s).await);

    h.admin.drop_stream(()).await.unwrap();
    // Changes while the stream is down or reconnecting.
    h.client.create_bundle(&bundle("ch2")).await.unwrap();
    h.client.delete_bundle(&BundleId("default/ch1".into())).await.unwrap();
    h.admin
        .kill_node(sim_admin::NodeRef {
            node_id: "rack-2".into(),
        })
        .await
        .unwrap();

    // The session reconnects by itself and delivers a whole new snapshot.
    loop {
        match next(&mut s, "the reconnect snapshot").await {
            StreamItem::Snapshot(events) => {
                mirror = ManagerMirror::from_snapshot(&events);
                break;
            }
            StreamItem::Event(e) => mirror.apply(&e),
            StreamItem::Rejected(e) => panic!("rejected {e}"),
        }
    }
    assert_eq!(*s.state.borrow(), ConnectionState::Ready);

    // Follow live events until Manager settles (the delete saga and the
    // killed node's keepalive run on the simulator's clock): the session's
    // view must then equal what an independent observer reads.
    let settled = tokio::time::Instant::now() + PATIENCE;
    loop {
        let truth = observed(&h.client).await;
        // Drain whatever the session has delivered meanwhile.
        while let Ok(item) = s.items.try_recv() {
            match item {
                StreamItem::Event(e) => mirror.apply(&e),
                StreamItem::Snapshot(events) => mirror = ManagerMirror::from_snapshot(&events),
                StreamItem::Rejected(e) => panic!("rejected {e}"),
            }
        }
        let gone = !truth.bundles.contains_key(&BundleId("default/ch1".into()))
            && truth
                .nodes
                .get(&NodeId("rack-2".into()))
                .is_none_or(|n| n.phase == NodePhase::Stopped);
        if gone && view(&mirror) == view(&truth) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < settled,
            "the session's view never converged on Manager's state"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(mirror.bundles.contains_key(&BundleId("default/ch2".into())));
    assert!(!mirror.jobs.contains_key(&JobId("default/ch1/0/encode".into())));
    s.close().await;
    h.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn faults_change_what_the_client_observes() {
    let mut h = harness().await;
    register(&mut h.admin, "rack-1").await;
    register(&mut h.admin, "rack-2").await;
    register(&mut h.admin, "rack-3").await;
    let job = h.client.create_bundle(&bundle("ch1")).await.unwrap().remove(0);
    let mut s = session(&h.client);
    snapshot(&mut s).await;

    // A start reaches running; a failed job stops with JOB_STOPPED_JOB_FAILED.
    let start = StartJob {
        job_id: job.clone(),
        instance_key: InstanceKey("primary".into()),
        node_id: NodeId("rack-1".into()),
        gpu_index: None,
        defer_start: false,
        runtime_role: "primary".into(),
        migration_id: None,
    };
    h.client.start_job(&start).await.unwrap();
    running_on(&mut s, &job, "primary").await;
    h.admin
        .fail_job(sim_admin::JobRef {
            job_id: job.0.clone(),
            role: String::new(),
            reason: "crash".into(),
        })
        .await
        .unwrap();
    let seen = until(&mut s, "the failed instance stopped", |e| match e {
        ManagerEvent::JobUpdated(j) => live_instances(j).is_empty(),
        _ => false,
    })
    .await;
    let failed = |e: &ManagerEvent| match e {
        ManagerEvent::JobUpdated(j) => j.history.iter().any(|h| {
            matches!(
                h,
                JobHistoryEntry::Stopping {
                    reason: JobStopReason::JobFailed,
                    ..
                }
            )
        }),
        _ => false,
    };
    assert!(
        seen.iter().any(failed),
        "the instance stopped without a JOB_STOPPED_JOB_FAILED entry"
    );

    // A rejection armed on the job answers the next start.
    h.admin
        .reject_job(sim_admin::RejectJobRequest {
            job_id: job.0.clone(),
            code: pb::JobRejectionCode::JobRejectedInvalidSpec as i32,
            detail: "unknown codec h.267".into(),
            times: 1,
        })
        .await
        .unwrap();
    h.client
        .start_job(&StartJob {
            node_id: NodeId("rack-2".into()),
            ..start.clone()
        })
        .await
        .unwrap();
    let seen = until(&mut s, "the rejection", |e| {
        matches!(e, ManagerEvent::JobRejected { .. })
    })
    .await;
    match seen.last() {
        Some(ManagerEvent::JobRejected {
            code, detail, node_id, ..
        }) => {
            assert_eq!(*code, RejectionCode::InvalidSpec);
            assert_eq!(detail, "unknown codec h.267");
            assert_eq!(node_id.as_str(), "rack-2");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }

    // stop-node: NodeStopping now, NodeStopped later; kill-node: only NodeStopped.
    h.admin
        .stop_node(sim_admin::NodeRef {
            node_id: "rack-2".into(),
        })
        .await
        .unwrap();
    let seen = until(
        &mut s,
        "rack-2 stopped",
        |e| matches!(e, ManagerEvent::NodeStopped(n) if n.as_str() == "rack-2"),
    )
    .await;
    assert!(
        seen.iter()
            .any(|e| matches!(e, ManagerEvent::NodeStopping { node_id, .. } if node_id.as_str() == "rack-2"))
    );
    h.admin
        .kill_node(sim_admin::NodeRef {
            node_id: "rack-3".into(),
        })
        .await
        .unwrap();
    let seen = until(
        &mut s,
        "rack-3 stopped",
        |e| matches!(e, ManagerEvent::NodeStopped(n) if n.as_str() == "rack-3"),
    )
    .await;
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, ManagerEvent::NodeStopping { node_id, .. } if node_id.as_str() == "rack-3"))
    );

    // An interruption notice carries its kind and deadline.
    h.admin
        .interrupt_node(sim_admin::InterruptNodeRequest {
            node_id: "rack-1".into(),
            kind: pb::InterruptionKind::SpotInterruption as i32,
            deadline_s: 120.0,
        })
        .await
        .unwrap();
    let seen = until(&mut s, "the notice", |e| {
        matches!(e, ManagerEvent::NodeInterruptionNotice { .. })
    })
    .await;
    match seen.last() {
        Some(ManagerEvent::NodeInterruptionNotice {
            node_id,
            kind,
            deadline,
            noticed_at,
        }) => {
            assert_eq!(node_id.as_str(), "rack-1");
            assert_eq!(*kind, InterruptionKind::SpotInterruption);
            let (deadline, noticed) = (deadline.unwrap(), noticed_at.unwrap());
            assert_eq!(deadline - noticed, 120_000);
        }
        other => panic!("expected a notice, got {other:?}"),
    }

    // A region out of capacity is a typed error the cascade can react to.
    h.admin
        .set_capacity(sim_admin::SetCapacityRequest {
            region: "eu-west-1".into(),
            instance_type: "m5.xlarge".into(),
            available: 0,
        })
        .await
        .unwrap();
    let node = CreateNode {
        node_id: NodeId("aws-1".into()),
        tags: Default::default(),
        region: "eu-west-1".into(),
        availability_domain: String::new(),
        instance_type: "m5.xlarge".into(),
        launch_mode: String::new(),
        root_volume: None,
    };
    let err = h.client.create_aws_node(&node).await.unwrap_err();
    assert_eq!(err.kind(), RpcErrorKind::InsufficientCapacity, "{err}");

    // A failing RPC is transient; an unknown node is not found.
    h.admin
        .rpc_fault(sim_admin::RpcFaultRequest {
            rpc: "StartJob".into(),
            delay_ms: 0,
            failure_rate: 1.0,
            clear: false,
        })
        .await
        .unwrap();
    assert_eq!(
        h.client.start_job(&start).await.unwrap_err().kind(),
        RpcErrorKind::Transient
    );
    assert_eq!(
        h.client
            .terminate_node(&NodeId("no-such-node".into()))
            .await
            .unwrap_err()
            .kind(),
        RpcErrorKind::NotFound
    );
    s.close().await;
    h.sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn hostile_messages_are_normalised_or_reported_and_the_stream_goes_on() {
    use pb::event_stream_event::Event as E;
    let mut h = harness().await;
    let mut s = session(&h.client);
    snapshot(&mut s).await;
    let inject = |event: E| sim_admin::InjectEventRequest {
        event: Some(pb::EventStreamEvent { event: Some(event) }),
    };
    let node = |id: &str| Some(pbc::NodeId { node_id: id.into() });
    let bad_inventory = |id: &str, cap: f64, total: f64| {
        E::NodeInventory(pb::NodeInventoryUpdated {
            inventory: Some(pb::NodeInventory {
                node_id: node(id),
                provider: 42,
                total_capacity: total,
                utilization_cap: cap,
                reserved_capacity: f64::NAN,
                ..Default::default()
            }),
        })
    };

    // A NaN utilisation cap and reserve are normalised.
    h.admin
        .inject_event(inject(bad_inventory("hostile-1", f64::NAN, 4.0)))
        .await
        .unwrap();
    match next(&mut s, "the normalised inventory").await {
        StreamItem::Event(e) => match *e {
            ManagerEvent::NodeInventory { inventory, .. } => {
                assert_eq!(inventory.utilization_cap, 1.0);
                assert_eq!(inventory.reserved_capacity, 0.0);
                assert_eq!(inventory.kind, ProviderKind::LocalServers);
            }
            other => panic!("expected an inventory, got {other:?}"),
        },
        other => panic!("expected an event, got {other:?}"),
    }
    // A negative capacity, an empty id and a huge id are reported.
    h.admin
        .inject_event(inject(bad_inventory("hostile-2", 1.0, -8.0)))
        .await
        .unwrap();
    h.admin
        .inject_event(inject(E::NodeStopped(pb::NodeStopped { node_id: node("") })))
        .await
        .unwrap();
    h.admin
        .inject_event(inject(E::NodeStopped(pb::NodeStopped {
            node_id: node(&"x".repeat(1 << 20)),
        })))
        .await
        .unwrap();
    for what in ["negative capacity", "empty id", "huge id"] {
        assert!(
            matches!(next(&mut s, what).await, StreamItem::Rejected(_)),
            "{what} was not reported"
        );
    }
    // A huge free-text field is truncated, and the stream is still going.
    h.admin
        .inject_event(inject(E::JobRejected(pb::JobRejected {
            job_key: Some(pbc::ActiveJobKey {
                job_id: Some(pbc::JobId { job_id: "j".into() }),
                role: "primary".into(),
            }),
            node_id: node("n"),
            code: 1,
            detail: "y".repeat(1 << 20),
            inventory: None,
        })))
        .await
        .unwrap();
    match next(&mut s, "the truncated rejection").await {
        StreamItem::Event(e) => match *e {
            ManagerEvent::JobRejected { detail, .. } => assert!(detail.len() <= wire::MAX_TEXT_BYTES),
            other => panic!("expected a rejection, got {other:?}"),
        },
        other => panic!("expected an event, got {other:?}"),
    }
    assert_eq!(*s.state.borrow(), ConnectionState::Ready);
    s.close().await;
    h.sim.shutdown().await.unwrap();
}

/// A CA, a serving certificate for 127.0.0.1 and a client certificate.
struct TestPki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> TestPki {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |names: Vec<String>, usage| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        (params.signed_by(&key, &ca).unwrap().pem(), key.serialize_pem())
    };
    TestPki {
        server: leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        client: leaf(vec!["automanager".into()], ExtendedKeyUsagePurpose::ClientAuth),
        ca: ca.pem(),
    }
}

#[tokio::test]
async fn tls_with_client_certificate_and_bearer_token() {
    use norsk_auto_manager::manager::client::TlsSettings;
    use norsk_auto_manager::sim::SimTls;
    let pki = pki();
    let sim = Simulator::start(SimConfig {
        time_scale: TIME_SCALE,
        tls: Some(SimTls {
            cert_pem: pki.server.0.clone(),
            key_pem: pki.server.1.clone(),
            client_ca_pem: Some(pki.ca.clone()),
        }),
        bearer_token: Some("s3cret".into()),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    assert!(sim.url().starts_with("https://"));
    let settings = |token: &str, identity: bool| ClientSettings {
        tls: Some(TlsSettings {
            ca_pem: Some(pki.ca.clone()),
            client_identity_pem: identity.then(|| pki.client.clone()),
            domain: None,
        }),
        bearer_token: Some(token.into()),
        ..ClientSettings::plaintext(sim.url())
    };

    // The right CA, certificate and token: the stream delivers its snapshot.
    let client = ManagerClient::connect_lazy(&settings("s3cret", true)).unwrap();
    let mut s = session(&client);
    snapshot(&mut s).await;
    assert_eq!(*s.state.borrow(), ConnectionState::Ready);
    s.close().await;

    // A wrong token is refused by the server, not retried as transient.
    let wrong = ManagerClient::connect_lazy(&settings("guess", true)).unwrap();
    let err = wrong.terminate_node(&NodeId("n".into())).await.unwrap_err();
    assert_eq!(err.code, tonic::Code::Unauthenticated, "{err}");
    assert_eq!(err.kind(), RpcErrorKind::Rejected);

    // Without a client certificate the handshake fails.
    let anonymous = ManagerClient::connect_lazy(&settings("s3cret", false)).unwrap();
    assert_eq!(
        anonymous.terminate_node(&NodeId("n".into())).await.unwrap_err().kind(),
        RpcErrorKind::Transient
    );

    // Plaintext to a TLS server does not get through either.
    let plain = ManagerClient::connect_lazy(&ClientSettings::plaintext(sim.url().replace("https", "http"))).unwrap();
    assert!(plain.terminate_node(&NodeId("n".into())).await.is_err());
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_aws_node_is_launched_with_the_root_volume_the_client_asks_for() {
    let h = harness().await;
    let node = |id: &str, root_volume: Option<norsk_auto_manager::model::RootVolume>| CreateNode {
        node_id: NodeId(id.into()),
        tags: Default::default(),
        region: "eu-west-1".into(),
        availability_domain: String::new(),
        instance_type: "m5.xlarge".into(),
        launch_mode: String::new(),
        root_volume,
    };
    let asked = norsk_auto_manager::model::RootVolume {
        size_gib: 200,
        volume_type: Some("gp3".into()),
    };
    h.client
        .create_aws_node(&node("with-volume", Some(asked.clone())))
        .await
        .unwrap();
    h.client.create_aws_node(&node("plain", None)).await.unwrap();
    let json = h.admin.clone().snapshot(()).await.unwrap().into_inner().json;
    let snapshot: norsk_auto_manager::sim::SimSnapshot = serde_json::from_str(&json).unwrap();
    let volume = |id: &str| {
        snapshot
            .nodes
            .iter()
            .find(|n| n.id.as_str() == id)
            .map(|n| n.root_volume.clone())
            .expect("the node was created")
    };
    assert_eq!(volume("with-volume"), Some(asked));
    assert_eq!(volume("plain"), None, "no volume asked for: the launch template's");
    h.sim.shutdown().await.unwrap();
}
