//! A Kubernetes API server outage under two operator processes, as a
//! black-box check ran it (issue 47): the API server killed for 20 s, etcd
//! kept. Meanwhile neither process floods its log or spins a core, and the
//! leader stops acting once it cannot renew its Lease, so a node lost during
//! the outage is left alone. When the API server returns everything
//! converges: a Bundle applied then is Ready within seconds, and the job
//! that lost its node runs elsewhere within a minute.
//!
//! This file has a control plane of its own ([`control_plane::shared`] is
//! per file): killing its API server must not fail another file's tests.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::Api;
use kube::runtime::wait::await_condition;
use norsk_auto_manager::crd::Bundle;
use norsk_auto_manager::manager::proto::sim_admin;

use crate::control_plane;
use crate::operator_process::{Process, bundle, setup, until_ready};

/// How long the API server is gone: long enough for a retry loop without
/// backoff to show (the check saw 170,000 lines in this time) and for the
/// Lease (3 s in these processes) to run out several times over.
const OUTAGE: Duration = Duration::from_secs(20);
/// The most lines a process may log per second of outage, on average: the
/// outage is said once, the leader's step down once (the check saw 8,600 to
/// 14,000 a second).
const MAX_LINES_PER_SECOND: f64 = 0.5;
/// The most CPU a process may use during the outage, as a share of one core.
const MAX_CPU_SHARE: f64 = 0.05;
/// How soon after it is applied a Bundle is Ready once the API server is back.
const READY_AFTER_RETURN: Duration = Duration::from_secs(10);
/// How soon after the API server returns everything has converged.
const CONVERGED_AFTER_RETURN: Duration = Duration::from_secs(60);
/// What each process says when the outage starts and when it ends.
const UNREACHABLE: &str =
    "Kubernetes API server unreachable: every watch, read, write and the Lease retry with backoff";
const REACHABLE: &str = "Kubernetes API server reachable again";

fn said(process: &Process, message: &str) -> Vec<serde_json::Value> {
    process
        .log_lines()
        .into_iter()
        .filter(|l| l["fields"]["message"] == message)
        .collect()
}

async fn leaders(processes: &[Process]) -> Vec<bool> {
    let mut leading = Vec::new();
    for process in processes {
        leading.push(process.says_it_leads().await == Some(true));
    }
    leading
}

#[tokio::test]
async fn an_api_server_outage_is_ridden_out_quietly_and_everything_converges_when_it_returns() {
    let cp = control_plane::shared().await;
    let (ns, sim) = setup(cp, "outage").await;
    let mut processes = [
        Process::spawn(cp, &ns, &sim, "outage-0"),
        Process::spawn(cp, &ns, &sim, "outage-1"),
    ];
    for process in &mut processes {
        process.ready().await;
    }
    cp.kubectl_apply(&ns, &bundle("before")).expect("bundle applies");
    let placed = until_ready(cp, &ns, "before").await;
    let lost_node = format!("{ns}-a");
    assert_eq!(placed.status.and_then(|s| s.primary_node), Some(lost_node.clone()));
    assert_eq!(
        leaders(&processes).await.iter().filter(|l| **l).count(),
        1,
        "one process leads before the outage"
    );

    let before: Vec<(usize, Duration)> = processes.iter().map(|p| (p.log_line_count(), p.cpu_time())).collect();
    let killed = Instant::now();
    cp.kill_api_server();
    // No one can renew the Lease now: whoever led stops acting within it.
    let stepped_down = tokio::time::timeout(Duration::from_secs(5), async {
        while leaders(&processes).await.contains(&true) {
            // The processes run on their own clocks; poll their telemetry.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(stepped_down.is_ok(), "a process still leads 5 s into the outage");
    // A node lost while nobody may lead: nobody acts on it meanwhile.
    sim.admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: lost_node.clone(),
        })
        .await
        .expect("node killed");
    let nodes = |snapshot: norsk_auto_manager::sim::SimSnapshot| -> BTreeSet<String> {
        snapshot.nodes.into_iter().map(|n| n.id.0).collect()
    };
    let fleet_at_loss = nodes(sim.snapshot().await);
    tokio::time::sleep_until((killed + OUTAGE).into()).await;
    let fleet_before_return = nodes(sim.snapshot().await);
    let during: Vec<(usize, Duration)> = processes.iter().map(|p| (p.log_line_count(), p.cpu_time())).collect();
    let outage = killed.elapsed();
    cp.restart_api_server().await;
    let returned = Instant::now();

    let mut figures = Vec::new();
    for (i, process) in processes.iter().enumerate() {
        let lines = (during[i].0 - before[i].0) as f64 / outage.as_secs_f64();
        let cpu = (during[i].1 - before[i].1).as_secs_f64() / outage.as_secs_f64();
        figures.push(format!(
            "process {i}: {lines:.2} lines/s, {:.1} % of a core",
            cpu * 100.0
        ));
        assert!(
            lines <= MAX_LINES_PER_SECOND,
            "process {i} logged {lines:.1} lines a second during the outage:\n{:#?}",
            &process.log_lines()[before[i].0..during[i].0]
        );
        assert!(
            cpu <= MAX_CPU_SHARE,
            "process {i} used {:.1} % of a core during the outage",
            cpu * 100.0
        );
    }
    let made: Vec<_> = fleet_before_return.difference(&fleet_at_loss).collect();
    assert!(
        made.is_empty(),
        "a process acted on Manager without the Lease: it made {made:?} for the lost job"
    );

    // A Bundle applied now is Ready within seconds.
    cp.kubectl_apply(&ns, &bundle("after")).expect("bundle applies");
    let applied = Instant::now();
    until_ready(cp, &ns, "after").await;
    let ready_in = applied.elapsed();
    assert!(
        ready_in <= READY_AFTER_RETURN,
        "a Bundle applied after the API server returned took {ready_in:?} to be Ready"
    );
    // The job whose node was lost during the outage runs elsewhere.
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let moved = tokio::time::timeout(
        CONVERGED_AFTER_RETURN.saturating_sub(returned.elapsed()),
        await_condition(bundles, "before", |b: Option<&Bundle>| {
            b.and_then(|b| b.status.as_ref()).is_some_and(|s| {
                s.primary_node.as_ref().is_some_and(|n| *n != lost_node)
                    && s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
            })
        }),
    )
    .await;
    assert!(
        moved.is_ok(),
        "the job that lost its node during the outage was not placed again within a minute of the return"
    );
    let converged_in = returned.elapsed();
    assert_eq!(
        leaders(&processes).await.iter().filter(|l| **l).count(),
        1,
        "one process leads after the outage"
    );
    // Each process said the outage once, and how long it lasted.
    for (i, process) in processes.iter().enumerate() {
        assert_eq!(said(process, UNREACHABLE).len(), 1, "process {i}");
        let back = said(process, REACHABLE);
        assert_eq!(back.len(), 1, "process {i}: {back:#?}");
        let lasted = back[0]["fields"]["outage_s"].as_f64().unwrap_or_default();
        assert!(
            lasted >= OUTAGE.as_secs_f64() - 1.0 && lasted <= outage.as_secs_f64() + 10.0,
            "process {i} said the outage lasted {lasted} s; it lasted {outage:?}"
        );
    }
    eprintln!(
        "API server outage of {:.1} s: {}; a Bundle applied after the return Ready in {:.1} s; converged {:.1} s after the return",
        outage.as_secs_f64(),
        figures.join(", "),
        ready_in.as_secs_f64(),
        converged_in.as_secs_f64()
    );
    sim.shutdown().await;
}
