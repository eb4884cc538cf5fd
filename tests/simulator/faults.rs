//! Bad input gets a clear status and the simulator keeps serving; injected
//! RPC faults and time scale changes.

use norsk_auto_manager::manager::proto::common;
use norsk_auto_manager::manager::proto::manager::{self as pb, id_filter, job_filter};
use norsk_auto_manager::manager::proto::sim_admin;
use tonic::{Code, Status};

use crate::sim_support::{Sim, aws_node, start_request};

#[track_caller]
fn assert_status(result: Result<impl std::fmt::Debug, Status>, code: Code, mentions: &str) {
    let status = result.expect_err("the request is refused");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(mentions),
        "{:?} does not mention {mentions:?}",
        status.message()
    );
}

#[tokio::test]
async fn bad_requests_are_refused_with_what_and_why_and_the_simulator_keeps_serving() {
    let sim = Sim::start().await;
    let (mut m, mut a) = (sim.manager.clone(), sim.admin.clone());
    sim.register("rack-1", 4.0).await;
    sim.create_job("j1").await;

    assert_status(
        sim.start_job("ghost", "primary", "rack-1").await,
        Code::NotFound,
        "ghost",
    );
    assert_status(
        sim.start_job("j1", "primary", "nowhere").await,
        Code::NotFound,
        "nowhere",
    );
    assert_status(sim.start_job("j1", "", "rack-1").await, Code::InvalidArgument, "role");
    let gpu = pb::StartJobRequest {
        gpu_index: Some(3),
        ..start_request("j1", "primary", "rack-1")
    };
    assert_status(m.start_job(gpu).await, Code::InvalidArgument, "GPU");
    m.create_aws_node(aws_node("booting", "eu-west-1", "m5.xlarge"))
        .await
        .unwrap();
    assert_status(
        sim.start_job("j1", "primary", "booting").await,
        Code::FailedPrecondition,
        "starting",
    );

    assert_status(
        m.create_aws_node(aws_node("n", "mars-1", "m5.xlarge")).await,
        Code::InvalidArgument,
        "mars-1",
    );
    assert_status(
        m.create_aws_node(aws_node("n", "eu-west-1", "m5.huge")).await,
        Code::InvalidArgument,
        "m5.huge",
    );
    assert_status(
        m.create_aws_node(aws_node("", "eu-west-1", "m5.xlarge")).await,
        Code::InvalidArgument,
        "node_id",
    );
    assert_status(
        m.create_aws_node(aws_node("booting", "us-east-1", "m5.xlarge")).await,
        Code::AlreadyExists,
        "booting",
    );
    let oci = pb::CreateOciNodeRequest {
        node_id: Some(common::NodeId { node_id: "o1".into() }),
        availability_domain: "EU-FRANKFURT-1-AD-1".into(),
        region: "uk-london-1".into(),
        shape: "VM.Standard2.4".into(),
        ..Default::default()
    };
    assert_status(
        m.create_oci_node(oci).await,
        Code::InvalidArgument,
        "EU-FRANKFURT-1-AD-1",
    );
    assert_status(
        m.terminate_node(common::NodeId {
            node_id: "ghost".into(),
        })
        .await,
        Code::NotFound,
        "ghost",
    );
    assert_status(
        m.delete_bundle(pb::BundleId {
            bundle_id: "ghost".into(),
        })
        .await,
        Code::NotFound,
        "ghost",
    );
    assert_status(
        m.create_bundle(pb::Bundle {
            bundle_id: "b".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "pool",
    );

    assert_status(
        a.kill_node(sim_admin::NodeRef {
            node_id: "ghost".into(),
        })
        .await,
        Code::NotFound,
        "ghost",
    );
    assert_status(
        a.fail_job(sim_admin::JobRef {
            job_id: "j1".into(),
            ..Default::default()
        })
        .await,
        Code::FailedPrecondition,
        "no running instance",
    );
    let interrupt = sim_admin::InterruptNodeRequest {
        node_id: "rack-1".into(),
        kind: 0,
        deadline_s: 0.0,
    };
    assert_status(a.interrupt_node(interrupt).await, Code::InvalidArgument, "kind");
    let capacity = sim_admin::SetCapacityRequest {
        region: "eu-west-1".into(),
        instance_type: "x".into(),
        available: 1,
    };
    assert_status(a.set_capacity(capacity).await, Code::InvalidArgument, "\"x\"");
    let scale = sim_admin::SetTimeScaleRequest { time_scale: 0.0 };
    assert_status(a.set_time_scale(scale).await, Code::InvalidArgument, "time_scale");
    let fault = sim_admin::RpcFaultRequest {
        rpc: "StartJobs".into(),
        ..Default::default()
    };
    assert_status(a.rpc_fault(fault).await, Code::InvalidArgument, "StartJobs");
    let regex = pb::JobSearchRequest {
        job_filter: vec![pb::JobFilter {
            job_filter: Some(job_filter::JobFilter::IdFilter(pb::IdFilter {
                comparison: Some(id_filter::Comparison::Re("j.*".into())),
            })),
        }],
    };
    assert_status(m.job_search(regex).await, Code::Unimplemented, "regular-expression");

    // Still serving, with nothing half-done.
    let snapshot = sim.snapshot().await;
    assert_eq!(snapshot.nodes.len(), 2);
    assert!(snapshot.nodes.iter().all(|n| n.instances.is_empty()));
    sim.shutdown().await;
}

#[tokio::test]
async fn an_rpc_fault_fails_or_delays_calls_until_cleared() {
    let sim = Sim::start().await;
    let mut admin = sim.admin.clone();
    sim.register("rack-1", 4.0).await;
    sim.create_job("j1").await;
    let fault = sim_admin::RpcFaultRequest {
        rpc: "StartJob".into(),
        failure_rate: 1.0,
        ..Default::default()
    };
    admin.rpc_fault(fault.clone()).await.unwrap();
    assert_status(
        sim.start_job("j1", "primary", "rack-1").await,
        Code::Unavailable,
        "StartJob",
    );
    // Other RPCs are unaffected.
    sim.create_job("j2").await;
    admin
        .rpc_fault(sim_admin::RpcFaultRequest { clear: true, ..fault })
        .await
        .unwrap();
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    // A delay (wall-clock, far beyond the client's deadline) makes the
    // client give up.
    let slow = sim_admin::RpcFaultRequest {
        rpc: "*".into(),
        delay_ms: 60_000,
        ..Default::default()
    };
    admin.rpc_fault(slow).await.unwrap();
    let mut request = tonic::Request::new(start_request("j2", "primary", "rack-1"));
    request.set_timeout(std::time::Duration::from_millis(50));
    let status = sim.manager.clone().start_job(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn job_search_finds_jobs_by_id_with_their_instances() {
    let sim = Sim::start().await;
    sim.register("rack-1", 4.0).await;
    sim.create_job("j1").await;
    sim.create_job("j2").await;
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    let search = pb::JobSearchRequest {
        job_filter: vec![pb::JobFilter {
            job_filter: Some(job_filter::JobFilter::IdFilter(pb::IdFilter {
                comparison: Some(id_filter::Comparison::Eq("j1".into())),
            })),
        }],
    };
    let mut found = sim.manager.clone().job_search(search).await.unwrap().into_inner();
    let mut jobs = Vec::new();
    while let Some(job) = found.message().await.unwrap() {
        jobs.push(job);
    }
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].instances[0].node_id.as_ref().unwrap().node_id, "rack-1");
    sim.shutdown().await;
}

#[tokio::test]
async fn extreme_but_valid_values_leave_the_simulator_serving() {
    let sim = Sim::start().await;
    let mut admin = sim.admin.clone();
    sim.register("rack-1", 4.0).await;
    let capacity = sim_admin::SetCapacityRequest {
        region: "eu-west-1".into(),
        instance_type: "m5.xlarge".into(),
        available: i64::MAX,
    };
    admin.set_capacity(capacity).await.unwrap();
    sim.manager
        .clone()
        .create_aws_node(aws_node("n1", "eu-west-1", "m5.xlarge"))
        .await
        .unwrap();
    let interrupt = sim_admin::InterruptNodeRequest {
        node_id: "rack-1".into(),
        kind: pb::InterruptionKind::SpotInterruption as i32,
        deadline_s: 1e300,
    };
    admin.interrupt_node(interrupt).await.unwrap();
    admin
        .set_time_scale(sim_admin::SetTimeScaleRequest { time_scale: 1e-300 })
        .await
        .unwrap();
    admin
        .set_time_scale(sim_admin::SetTimeScaleRequest { time_scale: 1000.0 })
        .await
        .unwrap();
    let snapshot = sim.snapshot().await;
    assert_eq!(snapshot.nodes.len(), 2);
    assert_eq!(snapshot.capacity[0].available, Some(i64::MAX - 1));
    sim.shutdown().await;
}
