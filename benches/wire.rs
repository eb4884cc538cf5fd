//! Decoding and converting an initial snapshot of 10,000 nodes and 100,000
//! jobs (the wire-contract target: under 1 s, model form under 200 MiB).
//! The model's heap size is measured with a counting allocator and printed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use norsk_auto_manager::manager::mirror::ManagerMirror;
use norsk_auto_manager::manager::proto::{common as pbc, manager as pb};
use norsk_auto_manager::manager::wire;
use prost::Message;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: ptr was allocated by System with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const NODES: usize = 10_000;
const JOBS: usize = 100_000;

fn node_meta(i: usize) -> pbc::NodeMetadata {
    pbc::NodeMetadata {
        node_id: Some(pbc::NodeId {
            node_id: format!("node-{i:05}"),
        }),
        tags: [
            ("pool".to_owned(), "production".to_owned()),
            ("tier".to_owned(), format!("tier-{}", i % 3)),
        ]
        .into(),
        created_at: Some(wire::millis_to_pb(1_700_000_000_000)),
        provider_metadata: Some(pbc::ProviderMetadata {
            metadata: Some(pbc::provider_metadata::Metadata::Aws(pbc::AwsMetadata {
                instance_type: "m5.2xlarge".into(),
                region: "eu-west-1".into(),
                architecture: 0,
            })),
        }),
    }
}

fn event(e: pb::event_stream_event::Event) -> Vec<u8> {
    pb::EventStreamEvent { event: Some(e) }.encode_to_vec()
}

/// The encoded snapshot, one buffer per event, as it arrives on the stream.
fn snapshot() -> Vec<Vec<u8>> {
    use pb::event_stream_event::Event as E;
    let mut out = Vec::with_capacity(NODES * 2 + JOBS + 1);
    for i in 0..NODES {
        out.push(event(E::NodeStarted(pb::NodeStarted {
            node_metadata: Some(node_meta(i)),
            running_node_metadata: None,
        })));
        out.push(event(E::NodeInventory(pb::NodeInventoryUpdated {
            inventory: Some(pb::NodeInventory {
                node_id: Some(pbc::NodeId {
                    node_id: format!("node-{i:05}"),
                }),
                provider: pb::ProviderKind::Aws as i32,
                region: "eu-west-1".into(),
                availability_zone: format!("eu-west-1{}", ["a", "b", "c"][i % 3]),
                instance_type: "m5.2xlarge".into(),
                total_capacity: 8.0,
                total_cores: 8,
                utilization_cap: 0.9,
                gpus: if i % 10 == 0 {
                    vec![pb::GpuDevice {
                        model: "t4".into(),
                        total_capacity: 1.0,
                    }]
                } else {
                    vec![]
                },
                capabilities: vec!["norsk.io/srt".into()],
                images: vec!["registry.example/encoder:1".into()],
                ..Default::default()
            }),
        })));
    }
    for j in 0..JOBS {
        let job_id = format!("default/ch{:05}/{}/encode", j / 2, j % 2);
        let role = if j % 2 == 0 { "primary" } else { "backup" };
        let job = pb::Job {
            job_id: Some(pbc::JobId { job_id: job_id.clone() }),
            state: pb::job::JobState::Active as i32,
            bundle_ref: Some(pb::BundleJobRef {
                bundle_id: format!("default/ch{:05}", j / 2),
                replica_index: (j % 2) as u32,
                job_name: "encode".into(),
            }),
            requirements: Some(pb::JobRequirements {
                required_capacity: 0.5,
                required_host_ports: vec![format!("{}/udp", 5000 + j % 16)],
                ..Default::default()
            }),
            template: "encoder".into(),
            ..Default::default()
        };
        let node = Some(pbc::NodeMetadata {
            node_id: Some(pbc::NodeId {
                node_id: format!("node-{:05}", j % NODES),
            }),
            ..Default::default()
        });
        let history = vec![
            pb::JobHistoryEntry {
                history_entry: Some(pb::job_history_entry::HistoryEntry::JobCreated(
                    pb::JobHistoryJobCreated { timestamp: None },
                )),
            },
            pb::JobHistoryEntry {
                history_entry: Some(pb::job_history_entry::HistoryEntry::JobRunning(
                    pb::JobHistoryJobRunning {
                        role: role.into(),
                        node_metadata: node,
                        ..Default::default()
                    },
                )),
            },
        ];
        out.push(event(E::JobActive(pb::JobActive {
            job_with_history: Some(pb::JobWithHistory {
                job: Some(job),
                history_entry: history,
            }),
        })));
    }
    out.push(event(E::InitialDataComplete(pb::InitialDataComplete {
        health: vec![],
    })));
    out
}

fn decode_and_convert(buffers: &[Vec<u8>]) -> ManagerMirror {
    let mut mirror = ManagerMirror::default();
    let mut notes = wire::Notes::new();
    for buf in buffers {
        let pb = pb::EventStreamEvent::decode(buf.as_slice()).expect("benchmark input decodes");
        let event = wire::event_from_pb(&pb, &mut notes).expect("benchmark input converts");
        mirror.apply(&event);
    }
    mirror
}

fn bench(c: &mut Criterion) {
    let buffers = snapshot();
    let bytes: usize = buffers.iter().map(Vec::len).sum();
    let before = LIVE.load(Ordering::Relaxed);
    let mirror = decode_and_convert(&buffers);
    let model_bytes = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    println!(
        "snapshot: {NODES} nodes, {JOBS} jobs, {:.1} MiB on the wire; model form {:.1} MiB ({} nodes, {} jobs)",
        bytes as f64 / 1048576.0,
        model_bytes as f64 / 1048576.0,
        mirror.nodes.len(),
        mirror.jobs.len()
    );
    drop(mirror);
    let mut group = c.benchmark_group("wire");
    group.sample_size(10);
    group.bench_function("decode_and_convert_snapshot_10k_nodes_100k_jobs", |b| {
        b.iter(|| decode_and_convert(&buffers))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
