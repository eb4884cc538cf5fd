//! `norsk-auto-manager simctl`: the simulator's admin CLI. Every command
//! prints JSON on stdout; a refused command prints the simulator's reason on
//! stderr and exits 1.

use std::collections::HashMap;
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use serde_json::json;
use tonic::transport::Channel;

use crate::manager::proto::manager as pb;
use crate::manager::proto::sim_admin::{self, sim_admin_client::SimAdminClient};
use crate::manager::wire::inventory_to_pb;
use crate::model::{Gpu, NodeId, NodeInventory, tags};

/// The largest snapshot simctl accepts (a fleet of tens of thousands of
/// nodes fits).
const MAX_SNAPSHOT_BYTES: usize = 1 << 30;

/// Arguments of `simctl`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The simulator's URL.
    #[arg(long, env = "NORSK_SIM_ADDR", default_value = "http://127.0.0.1:6789")]
    pub addr: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The admin commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the whole simulated state (its `fleet` member is a fleet
    /// snapshot `plan --fleet` reads).
    Snapshot,
    /// Register a cluster (local-servers) node with an inventory.
    RegisterNode(Box<RegisterNodeArgs>),
    /// The node dies silently: NodeStopped after the keepalive timeout.
    KillNode {
        /// The node id.
        node: String,
    },
    /// The worker drops: NodeStopping now, NodeStopped after the keepalive
    /// timeout.
    StopNode {
        /// The node id.
        node: String,
    },
    /// The provider announces it is taking the node back.
    InterruptNode {
        /// The node id.
        node: String,
        /// The kind of notice.
        #[arg(long, value_enum)]
        kind: Interruption,
        /// Seconds until the reclaim (default: 120 for a spot interruption,
        /// none for a rebalance).
        #[arg(long)]
        deadline: Option<f64>,
    },
    /// A job's running instance(s) fail.
    FailJob {
        /// The job id.
        job: String,
        /// Only this instance key.
        #[arg(long)]
        role: Option<String>,
    },
    /// The worker refuses the job's next start(s) with a typed rejection.
    RejectJob {
        /// The job id.
        job: String,
        /// The rejection code.
        #[arg(long, value_enum)]
        reason: Rejection,
        /// The worker's words.
        #[arg(long)]
        detail: Option<String>,
        /// How many starts to reject.
        #[arg(long, default_value_t = 1)]
        times: u32,
    },
    /// How many more nodes of a type a region can launch (negative:
    /// unlimited).
    Capacity {
        /// The region.
        #[arg(long)]
        region: String,
        /// The instance type or shape.
        #[arg(long)]
        instance_type: String,
        /// Nodes that may still launch.
        #[arg(long, allow_negative_numbers = true)]
        available: i64,
    },
    /// Slow down or fail a Manager RPC ("*" for all).
    RpcFault {
        /// The RPC name, e.g. StartJob.
        #[arg(long)]
        rpc: String,
        /// Wall-clock delay before each call.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        /// Fraction of calls that fail with UNAVAILABLE.
        #[arg(long, default_value_t = 0.0)]
        failure_rate: f64,
        /// Remove the RPC's fault.
        #[arg(long)]
        clear: bool,
    },
    /// End every open event stream with UNAVAILABLE.
    DropStream,
    /// Change the time scale (simulated seconds per real second).
    SetTimeScale {
        /// The new scale.
        scale: f64,
    },
    /// Make a job cooperate, refuse or hang.
    SetJobBehaviour {
        /// The job id.
        job: String,
        /// The behaviour.
        #[arg(long, value_enum)]
        behaviour: Behaviour,
    },
}

/// `register-node` arguments.
#[derive(Debug, clap::Args)]
pub struct RegisterNodeArgs {
    /// The node id.
    #[arg(long)]
    pub id: String,
    /// The pool it belongs to (tag `pool`).
    #[arg(long)]
    pub pool: String,
    /// The tier (tag `tier`; without one it belongs to the pool's fixed
    /// tier).
    #[arg(long)]
    pub tier: Option<String>,
    /// More tags, KEY=VALUE.
    #[arg(long = "tag", value_parser = parse_tag)]
    pub tags: Vec<(String, String)>,
    /// The whole inventory as JSON (the fleet snapshot's inventory format);
    /// replaces the inventory flags.
    #[arg(long, conflicts_with_all = ["capacity", "cores", "az", "region", "capability", "gpu", "image"])]
    pub inventory_json: Option<String>,
    /// vCPUs.
    #[arg(long, required_unless_present = "inventory_json")]
    pub capacity: Option<f64>,
    /// Cores available for pinning.
    #[arg(long, default_value_t = 0)]
    pub cores: u32,
    /// Availability zone.
    #[arg(long, default_value = "")]
    pub az: String,
    /// Region (site).
    #[arg(long, default_value = "")]
    pub region: String,
    /// A capability the node offers (repeatable).
    #[arg(long)]
    pub capability: Vec<String>,
    /// A GPU device as MODEL:CAPACITY (repeatable), e.g. t4:1.
    #[arg(long, value_parser = parse_gpu)]
    pub gpu: Vec<Gpu>,
    /// An image the node holds (repeatable).
    #[arg(long)]
    pub image: Vec<String>,
}

/// `--kind` of `interrupt-node`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Interruption {
    /// A spot interruption (reclaimed at the deadline).
    SpotInterruption,
    /// A rebalance recommendation.
    Rebalance,
}

/// `--reason` of `reject-job`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Rejection {
    /// JOB_REJECTED_INVALID_SPEC
    InvalidSpec,
    /// JOB_REJECTED_INSUFFICIENT_CAPACITY
    InsufficientCapacity,
    /// JOB_REJECTED_PORT_IN_USE
    PortInUse,
    /// JOB_REJECTED_GPU_UNAVAILABLE
    GpuUnavailable,
    /// JOB_REJECTED_IMAGE_UNAVAILABLE
    ImageUnavailable,
    /// JOB_REJECTED_NODE_SHUTTING_DOWN
    NodeShuttingDown,
}

/// `--behaviour` of `set-job-behaviour`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Behaviour {
    /// Answers every handover step.
    Cooperative,
    /// Answers handover steps with `refused`.
    RefuseHandover,
    /// Never answers handover steps.
    HangHandover,
    /// Never reaches running after a start.
    HangStart,
}

fn parse_tag(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn parse_gpu(s: &str) -> Result<Gpu, String> {
    let (model, capacity) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not MODEL:CAPACITY"))?;
    let total_capacity: f64 = capacity.parse().map_err(|_| format!("{capacity:?} is not a number"))?;
    if !(total_capacity.is_finite() && total_capacity > 0.0) {
        return Err(format!("GPU capacity {capacity} must be positive"));
    }
    Ok(Gpu {
        model: model.to_owned(),
        total_capacity,
    })
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
enum SimctlError {
    #[error("invalid --addr {addr:?}: {source}")]
    Addr {
        addr: String,
        source: tonic::codegen::http::uri::InvalidUri,
    },
    #[error("cannot reach the simulator at {addr}: {source}")]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("{}", .0.message())]
    Refused(#[from] tonic::Status),
    #[error("invalid --inventory-json: {0}")]
    InventoryJson(#[from] serde_json::Error),
}

/// Runs one admin command.
pub async fn run(args: Args) -> ExitCode {
    match execute(args).await {
        Ok(output) => {
            use std::io::Write;
            // A reader that stops early (`simctl snapshot | head`) is not an
            // error of ours: the command already did its work.
            match writeln!(std::io::stdout().lock(), "{output}") {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the result: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A client of the simulator's admin API.
type Client = SimAdminClient<Channel>;

/// Connects to the simulator and runs the command; returns what to print.
async fn execute(args: Args) -> Result<String, SimctlError> {
    let mut client = connect(&args.addr).await?;
    Ok(match args.command {
        Command::Snapshot => client.snapshot(()).await?.into_inner().json,
        Command::RegisterNode(a) => {
            let request = register_request(*a)?;
            let node_id = request.node_id.clone();
            client.register_node(request).await?;
            done("register-node", json!({ "nodeId": node_id }))
        }
        Command::KillNode { node } => {
            client.kill_node(sim_admin::NodeRef { node_id: node.clone() }).await?;
            done("kill-node", json!({ "nodeId": node }))
        }
        Command::StopNode { node } => {
            client.stop_node(sim_admin::NodeRef { node_id: node.clone() }).await?;
            done("stop-node", json!({ "nodeId": node }))
        }
        Command::InterruptNode { node, kind, deadline } => interrupt_node(&mut client, node, kind, deadline).await?,
        Command::FailJob { job, role } => fail_job(&mut client, job, role).await?,
        Command::RejectJob {
            job,
            reason,
            detail,
            times,
        } => reject_job(&mut client, job, reason, detail, times).await?,
        Command::Capacity {
            region,
            instance_type,
            available,
        } => set_capacity(&mut client, region, instance_type, available).await?,
        Command::RpcFault {
            rpc,
            delay_ms,
            failure_rate,
            clear,
        } => rpc_fault(&mut client, rpc, delay_ms, failure_rate, clear).await?,
        Command::DropStream => {
            client.drop_stream(()).await?;
            done("drop-stream", json!({}))
        }
        Command::SetTimeScale { scale } => {
            client
                .set_time_scale(sim_admin::SetTimeScaleRequest { time_scale: scale })
                .await?;
            done("set-time-scale", json!({ "timeScale": scale }))
        }
        Command::SetJobBehaviour { job, behaviour } => set_job_behaviour(&mut client, job, behaviour).await?,
    })
}

/// A client of the simulator at `addr`, connected.
async fn connect(addr: &str) -> Result<Client, SimctlError> {
    let channel = Channel::from_shared(addr.to_owned())
        .map_err(|source| SimctlError::Addr {
            addr: addr.to_owned(),
            source,
        })?
        .connect()
        .await
        .map_err(|source| SimctlError::Connect {
            addr: addr.to_owned(),
            source,
        })?;
    Ok(SimAdminClient::new(channel).max_decoding_message_size(MAX_SNAPSHOT_BYTES))
}

/// What a command that did its work prints: `ok`, the command, and the
/// members of `details`.
fn done(command: &str, details: serde_json::Value) -> String {
    let mut out = json!({ "ok": true, "command": command });
    if let (Some(out), Some(details)) = (out.as_object_mut(), details.as_object()) {
        out.extend(details.clone());
    }
    out.to_string()
}

/// Runs `interrupt-node`: the provider announces it is taking the node
/// back.
async fn interrupt_node(
    client: &mut Client,
    node: String,
    kind: Interruption,
    deadline: Option<f64>,
) -> Result<String, SimctlError> {
    let kind = match kind {
        Interruption::SpotInterruption => pb::InterruptionKind::SpotInterruption,
        Interruption::Rebalance => pb::InterruptionKind::Rebalance,
    };
    client
        .interrupt_node(sim_admin::InterruptNodeRequest {
            node_id: node.clone(),
            kind: kind as i32,
            deadline_s: deadline.unwrap_or(0.0),
        })
        .await?;
    Ok(done(
        "interrupt-node",
        json!({ "nodeId": node, "kind": kind.as_str_name(), "deadlineS": deadline }),
    ))
}

/// Runs `fail-job`: the job's running instance(s) fail.
async fn fail_job(client: &mut Client, job: String, role: Option<String>) -> Result<String, SimctlError> {
    client
        .fail_job(sim_admin::JobRef {
            job_id: job.clone(),
            role: role.clone().unwrap_or_default(),
            reason: String::new(),
        })
        .await?;
    Ok(done("fail-job", json!({ "jobId": job, "role": role })))
}

/// Runs `reject-job`: the worker refuses the job's next start(s).
async fn reject_job(
    client: &mut Client,
    job: String,
    reason: Rejection,
    detail: Option<String>,
    times: u32,
) -> Result<String, SimctlError> {
    let code = match reason {
        Rejection::InvalidSpec => pb::JobRejectionCode::JobRejectedInvalidSpec,
        Rejection::InsufficientCapacity => pb::JobRejectionCode::JobRejectedInsufficientCapacity,
        Rejection::PortInUse => pb::JobRejectionCode::JobRejectedPortInUse,
        Rejection::GpuUnavailable => pb::JobRejectionCode::JobRejectedGpuUnavailable,
        Rejection::ImageUnavailable => pb::JobRejectionCode::JobRejectedImageUnavailable,
        Rejection::NodeShuttingDown => pb::JobRejectionCode::JobRejectedNodeShuttingDown,
    };
    client
        .reject_job(sim_admin::RejectJobRequest {
            job_id: job.clone(),
            code: code as i32,
            detail: detail.unwrap_or_default(),
            times,
        })
        .await?;
    Ok(done(
        "reject-job",
        json!({ "jobId": job, "code": code.as_str_name(), "times": times }),
    ))
}

/// Runs `capacity`: how many more nodes of a type the region can launch.
async fn set_capacity(
    client: &mut Client,
    region: String,
    instance_type: String,
    available: i64,
) -> Result<String, SimctlError> {
    client
        .set_capacity(sim_admin::SetCapacityRequest {
            region: region.clone(),
            instance_type: instance_type.clone(),
            available,
        })
        .await?;
    Ok(done(
        "capacity",
        json!({ "region": region, "instanceType": instance_type, "available": (available >= 0).then_some(available) }),
    ))
}

/// Runs `rpc-fault`: a Manager RPC slowed down or failing, or no longer.
async fn rpc_fault(
    client: &mut Client,
    rpc: String,
    delay_ms: u64,
    failure_rate: f64,
    clear: bool,
) -> Result<String, SimctlError> {
    client
        .rpc_fault(sim_admin::RpcFaultRequest {
            rpc: rpc.clone(),
            delay_ms,
            failure_rate,
            clear,
        })
        .await?;
    Ok(done(
        "rpc-fault",
        json!({ "rpc": rpc, "delayMs": delay_ms, "failureRate": failure_rate, "clear": clear }),
    ))
}

/// Runs `set-job-behaviour`: the job cooperates, refuses or hangs.
async fn set_job_behaviour(client: &mut Client, job: String, behaviour: Behaviour) -> Result<String, SimctlError> {
    let behaviour = match behaviour {
        Behaviour::Cooperative => sim_admin::JobBehaviour::Cooperative,
        Behaviour::RefuseHandover => sim_admin::JobBehaviour::RefuseHandover,
        Behaviour::HangHandover => sim_admin::JobBehaviour::HangHandover,
        Behaviour::HangStart => sim_admin::JobBehaviour::HangStart,
    };
    client
        .set_job_behaviour(sim_admin::SetJobBehaviourRequest {
            job_id: job.clone(),
            behaviour: behaviour as i32,
        })
        .await?;
    Ok(done(
        "set-job-behaviour",
        json!({ "jobId": job, "behaviour": behaviour.as_str_name() }),
    ))
}

/// The admin request for `register-node`.
fn register_request(a: RegisterNodeArgs) -> Result<sim_admin::RegisterNodeRequest, SimctlError> {
    let inventory = match &a.inventory_json {
        Some(json) => serde_json::from_str::<NodeInventory>(json)?,
        None => NodeInventory {
            total_cores: a.cores,
            capabilities: a.capability,
            gpus: a.gpu,
            images: a.image,
            ..NodeInventory::local_server(a.region, a.az, String::new(), a.capacity.unwrap_or_default())
        },
    };
    let mut node_tags: HashMap<String, String> = a.tags.into_iter().collect();
    node_tags.insert(tags::POOL.to_owned(), a.pool);
    if let Some(tier) = a.tier {
        node_tags.insert(tags::TIER.to_owned(), tier);
    }
    Ok(sim_admin::RegisterNodeRequest {
        inventory: Some(inventory_to_pb(&NodeId(a.id.clone()), &inventory)),
        node_id: a.id,
        tags: node_tags,
    })
}
