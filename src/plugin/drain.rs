//! `drain` and `interrupt`: create a `NodeDrain` and follow it until it ends, with a progress
//! bar of the node's jobs (moved off / all); `evict` and `terminate`: create one that acts at
//! once (`mode: evict` / `terminate`) and follow it until Manager stopped the node (exit 0) or
//! the terminate was refused (exit 1). The drain's end is its phase: `done`, `partial`
//! or `failed` (the seed's `DrainState`) — and `done` is reported (exit 0) only when every job
//! moved off: a job that went down with the node is named, and the exit code is 1, whatever
//! the phase says.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;

use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::{
    DrainAfter, DrainMode, Interruption, InterruptionKind, MigrationStrategy, NodeDrain, NodeDrainSpec, NodeDrainStatus,
};
use crate::decide::drain_status::{every_job_moved, lost_jobs};
use crate::model::{DrainJobStatus as JobStatus, DrainPhase, wire_name};

use super::{PluginError, report_end, watch_named};

/// How a followed drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainEnd {
    /// Every job moved off; the node terminated.
    Done,
    /// Every job moved off; the node kept, cordoned and running (a maintenance drain).
    Kept,
    /// The node was terminated with jobs still on it: they went down with it (the reason
    /// names them).
    JobsLost(String),
    /// Some jobs stuck (the drain's reason says which).
    Partial(String),
    /// The drain failed.
    Failed(String),
}

/// A drain of `node_id` (named `<node>-drain-` plus a suffix the API server chooses: a node
/// may be drained again after a cancelled drain).
pub fn drain_resource(
    node_id: &str,
    timeout_seconds: Option<u32>,
    force: bool,
    strategy: Option<MigrationStrategy>,
    after: Option<DrainAfter>,
) -> NodeDrain {
    named(NodeDrain::new(
        "",
        NodeDrainSpec {
            node_id: node_id.to_owned(),
            mode: None,
            timeout_seconds,
            force,
            strategy,
            after,
            interruption: None,
        },
    ))
}

/// The drain answering a provider's notice: forced, sized to the deadline by the operator.
/// Without `strategy`, each job moves with the one it declares.
pub fn interruption_resource(
    node_id: &str,
    kind: InterruptionKind,
    deadline: Option<String>,
    strategy: Option<MigrationStrategy>,
) -> NodeDrain {
    named(NodeDrain::new(
        "",
        NodeDrainSpec {
            node_id: node_id.to_owned(),
            mode: None,
            timeout_seconds: None,
            force: true,
            strategy,
            // The provider takes the node: the operator terminates it.
            after: None,
            interruption: Some(Interruption { kind, deadline }),
        },
    ))
}

/// An `evict` (cordon, then terminate at once) or `terminate` (at once, without cordoning) of
/// `node_id`: no migration, none of a drain's options.
pub fn at_once_resource(node_id: &str, mode: DrainMode) -> NodeDrain {
    named(NodeDrain::new(
        "",
        NodeDrainSpec {
            node_id: node_id.to_owned(),
            mode: Some(mode),
            timeout_seconds: None,
            force: false,
            strategy: None,
            after: None,
            interruption: None,
        },
    ))
}

fn named(mut drain: NodeDrain) -> NodeDrain {
    let base = kubernetes_name(&drain.spec.node_id);
    drain.metadata.name = None;
    drain.metadata.generate_name = Some(format!("{base}-drain-"));
    drain
}

/// A node id as the start of a resource name: lower case, `[a-z0-9-]`, at most 50 characters
/// (the API server adds five for the suffix; names stop at 63 with room for `-drain-`).
fn kubernetes_name(node_id: &str) -> String {
    let name: String = node_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(50)
        .collect();
    let name = name.trim_matches('-');
    if name.is_empty() {
        "node".to_owned()
    } else {
        name.to_owned()
    }
}

/// Jobs moved off and jobs in all, from the drain's status (a job that went down with the
/// node did not move off).
pub fn progress(status: &NodeDrainStatus) -> (u64, u64) {
    let moved = status.jobs.iter().filter(|j| j.status.left_the_node()).count();
    (moved as u64, status.jobs.len() as u64)
}

/// The end the status reports, if the drain has ended: `done` only when every job moved off.
pub fn end(status: &NodeDrainStatus) -> Option<DrainEnd> {
    let reason = || status.reason.clone().unwrap_or_default();
    let phase = status.phase?;
    if !phase.is_final() {
        return None;
    }
    let lost = lost_jobs(status);
    if !lost.is_empty() {
        let detail = status
            .jobs
            .iter()
            .filter(|j| j.status == JobStatus::Terminated)
            .map(|j| match &j.reason {
                Some(why) => format!("{} ({why})", j.job_id),
                None => j.job_id.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let why = match status.reason.as_deref() {
            Some(reason) if !reason.is_empty() => format!("{reason}; went down with the node: {detail}"),
            _ => format!("went down with the node: {detail}"),
        };
        return Some(DrainEnd::JobsLost(why));
    }
    match phase {
        DrainPhase::Done if every_job_moved(status) && status.after == Some(DrainAfter::Keep) => Some(DrainEnd::Kept),
        DrainPhase::Done if every_job_moved(status) => Some(DrainEnd::Done),
        DrainPhase::Done => Some(DrainEnd::Partial(format!(
            "the node was terminated but not every job moved off: {}",
            status
                .jobs
                .iter()
                .filter(|j| !j.status.left_the_node())
                .map(|j| format!("{} is {}", j.job_id, wire_name(&j.status)))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        DrainPhase::Partial => Some(DrainEnd::Partial(reason())),
        _ => Some(DrainEnd::Failed(reason())),
    }
}

/// Creates `drain` (an evict or terminate); unless `no_wait`, follows it until Manager
/// stopped the node (exit 0) or the terminate was refused (exit 1), a line per phase.
pub async fn create_and_follow_at_once(
    client: Client,
    drain: NodeDrain,
    no_wait: bool,
) -> Result<ExitCode, PluginError> {
    let api: Api<NodeDrain> = Api::all(client.clone());
    let name = create(&api, &drain).await?;
    if no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    let mut phase = None;
    let mut reason = String::new();
    let ended = follow_drain(&api, &name, |status| {
        if status.phase != phase {
            phase = status.phase;
            println!("nodedrain/{name} {}", phase_word(status));
        }
        reason = status.reason.clone().unwrap_or_default();
    })
    .await?;
    let end = match ended {
        DrainEnd::Done => Ok(format!("done: {reason}")),
        // An evict or terminate migrates nothing and keeps nothing: any other end is
        // not one the operator gives it.
        DrainEnd::Kept | DrainEnd::JobsLost(_) | DrainEnd::Partial(_) => Err(format!("ended unexpectedly: {reason}")),
        DrainEnd::Failed(reason) => Err(format!("failed: {reason}")),
    };
    Ok(report_end(&format!("nodedrain/{name}"), end))
}

/// Creates `drain`; its name.
async fn create(api: &Api<NodeDrain>, drain: &NodeDrain) -> Result<String, PluginError> {
    let created = api
        .create(&PostParams::default(), drain)
        .await
        .map_err(PluginError::request(format!(
            "create a nodedrain of {}",
            drain.spec.node_id
        )))?;
    let name = created.name_any();
    println!("nodedrain/{name} created");
    Ok(name)
}

/// Creates `drain`; unless `no_wait`, follows it to its end.
pub async fn create_and_follow(client: Client, drain: NodeDrain, no_wait: bool) -> Result<ExitCode, PluginError> {
    let api: Api<NodeDrain> = Api::all(client.clone());
    let name = create(&api, &drain).await?;
    if no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    let ended = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        follow_with_bar(&api, &name).await
    } else {
        follow_with_lines(&api, &name).await
    };
    let end = match ended? {
        DrainEnd::Done => Ok("done: every job moved off, node terminated".to_owned()),
        DrainEnd::Kept => {
            Ok("done: every job moved off, node kept cordoned and running (uncordon returns it to service)".to_owned())
        }
        DrainEnd::JobsLost(reason) => Err(format!("lost jobs: {reason}")),
        DrainEnd::Partial(reason) => Err(format!("ended partial: {reason}")),
        DrainEnd::Failed(reason) => Err(format!("failed: {reason}")),
    };
    Ok(report_end(&format!("nodedrain/{name}"), end))
}

/// On a terminal: a spinner until the drain knows its jobs, then a bar of the jobs moved
/// off, and a line above it whenever a job's fate changes; at the end, where each job went.
async fn follow_with_bar(api: &Api<NodeDrain>, name: &str) -> Result<DrainEnd, PluginError> {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:<12} waiting for the drain's jobs ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut seen = JobLines::default();
    let ended = follow_drain(api, name, |status| {
        let (finished, total) = progress(status);
        if total > 0 && bar.length().unwrap_or(0) == 0 {
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg:<12} [{bar:30}] {pos}/{len} jobs moved off ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
        }
        bar.set_length(total);
        bar.set_position(finished);
        bar.set_message(phase_word(status));
        for line in seen.changed(status) {
            bar.println(line);
        }
    })
    .await;
    bar.finish_and_clear();
    for line in seen.destinations() {
        println!("{line}");
    }
    ended
}

/// Not on a terminal (a pipe, a log): one plain line per phase and per change of a job's
/// fate; at the end, where each job went.
async fn follow_with_lines(api: &Api<NodeDrain>, name: &str) -> Result<DrainEnd, PluginError> {
    let mut seen = JobLines::default();
    let mut phase = None;
    let ended = follow_drain(api, name, |status| {
        if status.phase != phase {
            phase = status.phase;
            let (finished, total) = progress(status);
            println!(
                "nodedrain/{name} {}: {finished}/{total} jobs moved off",
                phase_word(status)
            );
        }
        for line in seen.changed(status) {
            println!("{line}");
        }
    })
    .await;
    for line in seen.destinations() {
        println!("{line}");
    }
    ended
}

/// The drain's phase as the follower prints it: `pending` before the
/// operator recorded one.
fn phase_word(status: &NodeDrainStatus) -> String {
    status.phase.as_ref().map_or_else(|| "pending".to_owned(), wire_name)
}

/// What the follower printed of each job: its last status and the node its
/// migration moves it to.
#[derive(Debug, Default)]
struct JobLines {
    last: BTreeMap<String, (JobStatus, Option<String>)>,
}

impl JobLines {
    /// A line for every job whose status changed since the last call.
    fn changed(&mut self, status: &NodeDrainStatus) -> Vec<String> {
        let mut lines = Vec::new();
        for job in &status.jobs {
            let now = (job.status, job.target_node_id.clone());
            if self.last.get(&job.job_id) == Some(&now) {
                continue;
            }
            self.last.insert(job.job_id.clone(), now);
            let mut line = format!("  {} {}", job.job_id, wire_name(&job.status));
            if let Some(target) = &job.target_node_id {
                line.push_str(&format!(" -> {target}"));
            }
            if let Some(reason) = &job.reason {
                line.push_str(&format!(" ({reason})"));
            }
            lines.push(line);
        }
        lines
    }

    /// Where each job that migrated went.
    fn destinations(&self) -> Vec<String> {
        self.last
            .iter()
            .filter(|(_, (status, _))| *status == JobStatus::Migrated)
            .map(|(job, (_, target))| format!("  {job} -> {}", target.as_deref().unwrap_or("(target not recorded)")))
            .collect()
    }
}

/// Watches NodeDrain `name`, calling `on_status` with each status seen, until it ends.
pub async fn follow_drain(
    api: &Api<NodeDrain>,
    name: &str,
    mut on_status: impl FnMut(&NodeDrainStatus),
) -> Result<DrainEnd, PluginError> {
    let mut drains = watch_named(api, name, "drain");
    while let Some(drain) = drains.next().await {
        let Some(status) = drain.status.as_ref() else {
            continue;
        };
        on_status(status);
        if let Some(end) = end(status) {
            return Ok(end);
        }
    }
    Err(PluginError::LostDrain(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DrainJobStatus;

    fn job(status: JobStatus) -> DrainJobStatus {
        DrainJobStatus {
            job_id: format!("b/{}", wire_name(&status)),
            status,
            migration_id: None,
            target_node_id: None,
            reason: None,
        }
    }

    #[test]
    fn each_change_of_a_job_is_one_line_naming_its_target_and_the_summary_says_where_each_moved_job_went() {
        let mut lines = JobLines::default();
        let mut moving = job(JobStatus::Migrating);
        moving.migration_id = Some("3f9c1e2a".to_owned());
        let status = |jobs: Vec<DrainJobStatus>| NodeDrainStatus {
            jobs,
            ..NodeDrainStatus::default()
        };
        assert_eq!(
            lines.changed(&status(vec![moving.clone(), job(JobStatus::Stuck)])),
            vec!["  b/migrating migrating", "  b/stuck stuck"]
        );
        assert!(
            lines
                .changed(&status(vec![moving.clone(), job(JobStatus::Stuck)]))
                .is_empty(),
            "nothing changed"
        );
        moving.target_node_id = Some("node-b".to_owned());
        assert_eq!(
            lines.changed(&status(vec![moving.clone(), job(JobStatus::Stuck)])),
            vec!["  b/migrating migrating -> node-b"],
            "the target, once placed, is a change of its own"
        );
        let mut moved = moving;
        moved.status = JobStatus::Migrated;
        assert_eq!(
            lines.changed(&status(vec![moved, job(JobStatus::Stuck), job(JobStatus::Migrated)])),
            vec!["  b/migrating migrated -> node-b", "  b/migrated migrated"]
        );
        assert_eq!(
            lines.destinations(),
            vec!["  b/migrated -> (target not recorded)", "  b/migrating -> node-b"]
        );
    }

    #[test]
    fn progress_counts_jobs_moved_off_of_all() {
        let status = NodeDrainStatus {
            jobs: vec![
                job(JobStatus::Migrated),
                job(JobStatus::Migrating),
                job(JobStatus::Moved),
                job(JobStatus::Stuck),
                job(JobStatus::Terminated),
            ],
            ..NodeDrainStatus::default()
        };
        assert_eq!(progress(&status), (2, 5), "a terminated job did not move off");
    }

    #[test]
    fn a_drain_whose_node_took_a_job_down_is_never_reported_done() {
        let mut terminated = job(JobStatus::Terminated);
        terminated.job_id = "default/ch1/0/encode".to_owned();
        terminated.reason = Some("still on the node when it was terminated".to_owned());
        let status = NodeDrainStatus {
            phase: Some(DrainPhase::Done),
            jobs: vec![job(JobStatus::Migrated), terminated],
            ..NodeDrainStatus::default()
        };
        let Some(DrainEnd::JobsLost(why)) = end(&status) else {
            panic!("reported {:?}", end(&status));
        };
        assert!(
            why.contains("default/ch1/0/encode (still on the node when it was terminated)"),
            "{why}"
        );
        let partial = NodeDrainStatus {
            phase: Some(DrainPhase::Partial),
            ..status
        };
        assert!(matches!(end(&partial), Some(DrainEnd::JobsLost(_))));
    }

    #[test]
    fn drain_ends_only_in_done_partial_or_failed() {
        let at = |phase: DrainPhase| NodeDrainStatus {
            phase: Some(phase),
            reason: Some("job x stuck".to_owned()),
            ..NodeDrainStatus::default()
        };
        assert_eq!(end(&at(DrainPhase::Migrating)), None);
        assert_eq!(end(&at(DrainPhase::Terminating)), None);
        assert_eq!(end(&at(DrainPhase::Done)), Some(DrainEnd::Done));
        assert_eq!(
            end(&at(DrainPhase::Partial)),
            Some(DrainEnd::Partial("job x stuck".to_owned()))
        );
        assert_eq!(
            end(&at(DrainPhase::Failed)),
            Some(DrainEnd::Failed("job x stuck".to_owned()))
        );
    }

    #[test]
    fn a_kept_drain_is_done_with_its_node_kept() {
        let kept = NodeDrainStatus {
            phase: Some(DrainPhase::Done),
            after: Some(DrainAfter::Keep),
            jobs: vec![job(JobStatus::Migrated)],
            ..NodeDrainStatus::default()
        };
        assert_eq!(end(&kept), Some(DrainEnd::Kept));
        let terminated = NodeDrainStatus {
            after: Some(DrainAfter::Terminate),
            ..kept
        };
        assert_eq!(end(&terminated), Some(DrainEnd::Done));
    }

    #[test]
    fn drain_names_are_valid_resource_names_from_any_node_id() {
        let drain = drain_resource("EC2/i-0ABC_1", None, false, Some(MigrationStrategy::Overlap), None);
        assert_eq!(drain.metadata.generate_name.as_deref(), Some("ec2-i-0abc-1-drain-"));
        assert_eq!(drain.spec.node_id, "EC2/i-0ABC_1");
        let long = "n".repeat(300);
        let name = interruption_resource(&long, InterruptionKind::Rebalance, None, None)
            .metadata
            .generate_name
            .unwrap_or_default();
        assert!(name.len() + 5 <= 63, "{name}");
    }
}
