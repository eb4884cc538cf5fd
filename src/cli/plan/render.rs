//! `plan`'s output: the JSON document (`--output json`, exactly the
//! documented shape) and the table for people, with `--explain` printing
//! each placement's trace as a table of nodes and reasons.

use serde::Serialize;

use std::collections::BTreeMap;

use crate::model::{BundleId, FleetSnapshot, NodeId};
use crate::placement::{BundleIssueCode, PlanRow, PlannedOutcome, ResilienceFlag, TierDecision, Trace, Verdict};

#[derive(Serialize)]
struct JsonPlan<'a> {
    placements: Vec<JsonRow<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonRow<'a> {
    bundle: &'a BundleId,
    replica_index: u32,
    job_name: &'a str,
    outcome: PlannedOutcome,
    node_id: Option<&'a NodeId>,
    pool: Option<&'a str>,
    tier: Option<&'a str>,
    instance_type: Option<&'a str>,
    gpu_index: Option<u32>,
    resilience_violations: &'a [ResilienceFlag],
    errors: Vec<JsonError>,
    trace: serde_json::Value,
}

#[derive(Serialize)]
struct JsonError {
    code: BundleIssueCode,
    message: String,
}

/// The plan as the documented JSON document. The trace is `{}` unless it
/// was asked for (`--explain`).
pub fn json(rows: &[PlanRow]) -> Result<String, serde_json::Error> {
    let placements = rows
        .iter()
        .map(|row| {
            Ok(JsonRow {
                bundle: &row.bundle,
                replica_index: row.replica_index,
                job_name: &row.job_name,
                outcome: row.outcome,
                node_id: row.node_id.as_ref(),
                pool: row.pool.as_deref(),
                tier: row.tier.as_deref(),
                instance_type: row.instance_type.as_deref(),
                gpu_index: row.gpu_index,
                resilience_violations: &row.resilience_violations,
                errors: row
                    .errors
                    .iter()
                    .map(|e| JsonError {
                        code: e.code,
                        message: e.to_string(),
                    })
                    .collect(),
                trace: match &row.trace {
                    Some(trace) => serde_json::to_value(trace)?,
                    None => serde_json::Value::Object(Default::default()),
                },
            })
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    serde_json::to_string_pretty(&JsonPlan { placements })
}

/// The plan as the documented document, in YAML.
pub fn yaml(rows: &[PlanRow]) -> Result<String, serde_json::Error> {
    let document: serde_json::Value = serde_json::from_str(&json(rows)?)?;
    serde_yaml::to_string(&document).map_err(serde::ser::Error::custom)
}

/// Where each bundle job runs now, keyed by (bundle, replica, job name), as
/// the fleet's reservations say.
pub type CurrentNodes = BTreeMap<(BundleId, u32, String), NodeId>;

/// The current node of every bundle job the fleet holds.
pub fn current_nodes(fleet: &FleetSnapshot) -> CurrentNodes {
    let mut current = CurrentNodes::new();
    for node in &fleet.nodes {
        for job in &node.jobs {
            if let Some(bundle) = &job.bundle {
                current.insert(
                    (bundle.clone(), job.replica_index, job.job_name.clone()),
                    node.id.clone(),
                );
            }
        }
    }
    current
}

/// The table with two more columns: `CURRENT`, where the job runs now, and
/// `MOVE`, whether the plan puts it elsewhere (`yes`), where it is (`no`),
/// or it runs nowhere yet (`new`).
pub fn wide(rows: &[PlanRow], current: &CurrentNodes) -> String {
    let (header, mut body) = table_cells(rows);
    let mut header = header.to_vec();
    header.extend(["CURRENT", "MOVE"]);
    for (row, cells) in rows.iter().zip(body.iter_mut()) {
        let now = current.get(&(row.bundle.clone(), row.replica_index, row.job_name.clone()));
        let moves = match (now, &row.node_id) {
            (None, _) => "new",
            (Some(now), Some(planned)) if now == planned => "no",
            (Some(_), _) => "yes",
        };
        cells.push(optional(now.map(ToString::to_string)));
        cells.push(moves.to_owned());
    }
    let mut out = columns(&header, &body);
    out.push_str(&messages_and_traces(rows));
    out
}

/// The plan as a table, one row per job, then validation messages and (with
/// traces) each placement's trace.
pub fn table(rows: &[PlanRow]) -> String {
    let (header, body) = table_cells(rows);
    let mut out = columns(&header, &body);
    out.push_str(&messages_and_traces(rows));
    out
}

/// The table's header and one row of cells per plan row.
fn table_cells(rows: &[PlanRow]) -> ([&'static str; 10], Vec<Vec<String>>) {
    let header = [
        "BUNDLE",
        "REPLICA",
        "JOB",
        "OUTCOME",
        "NODE",
        "POOL",
        "TIER",
        "INSTANCE TYPE",
        "GPU",
        "RESILIENCE",
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.bundle.to_string(),
                row.replica_index.to_string(),
                row.job_name.clone(),
                outcome_name(row.outcome).to_owned(),
                optional(row.node_id.as_ref().map(ToString::to_string)),
                optional(row.pool.clone()),
                optional(row.tier.clone()),
                optional(row.instance_type.clone()),
                optional(row.gpu_index.map(|g| g.to_string())),
                resilience(row),
            ]
        })
        .collect();
    (header, body)
}

/// The validation messages, once per bundle, then each placement's trace.
fn messages_and_traces(rows: &[PlanRow]) -> String {
    let mut out = String::new();
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        if !seen.insert((&row.bundle, row.outcome == PlannedOutcome::Invalid)) {
            continue;
        }
        for error in &row.errors {
            out.push_str(&format!("error   {}: {} [{}]\n", row.bundle, error, code(&error.code)));
        }
        for warning in &row.warnings {
            out.push_str(&format!(
                "warning {}: {} [{}]\n",
                row.bundle,
                warning,
                code(&warning.code)
            ));
        }
    }
    for row in rows {
        if let Some(trace) = &row.trace {
            out.push_str(&format!(
                "\n{} replica {} job {}:\n",
                row.bundle, row.replica_index, row.job_name
            ));
            out.push_str(&explain(trace));
        }
    }
    out
}

/// One placement's trace: per tier, every node's verdict, then the tier's
/// decision.
fn explain(trace: &Trace) -> String {
    let mut out = String::new();
    for tier in &trace.tiers {
        out.push_str(&format!("  tier {}/{}\n", tier.pool, tier.tier));
        let body: Vec<Vec<String>> = tier
            .nodes
            .iter()
            .map(|n| match &n.verdict {
                Verdict::Rejected { filter, rejection } => {
                    vec![
                        n.node_id.to_string(),
                        format!("rejected: {}", code(filter)),
                        rejection.to_string(),
                    ]
                }
                Verdict::Survived { key } => vec![n.node_id.to_string(), "survived".to_owned(), key.to_string()],
            })
            .collect();
        for line in columns(&["NODE", "VERDICT", "DETAIL"], &body).lines() {
            out.push_str(&format!("    {line}\n"));
        }
        let decision = match &tier.decision {
            TierDecision::Placed { node_id } => format!("placed on {node_id}"),
            TierDecision::Provision { instance_type } => format!("provision {instance_type}"),
            TierDecision::NotProvisioned { why } => {
                format!("no placement, not provisioning: {why}")
            }
        };
        out.push_str(&format!("    => {decision}\n"));
    }
    out
}

fn outcome_name(outcome: PlannedOutcome) -> &'static str {
    match outcome {
        PlannedOutcome::Placed => "placed",
        PlannedOutcome::Provision => "provision",
        PlannedOutcome::NoCapacityInAnyPool => "noCapacityInAnyPool",
        PlannedOutcome::Invalid => "invalid",
    }
}

fn resilience(row: &PlanRow) -> String {
    let mut parts: Vec<String> = row
        .resilience_violations
        .iter()
        .map(|f| format!("violates {}", code(f)))
        .collect();
    if row.interruptible_primary_without_durable_backup {
        parts.push("interruptible primary without durable backup".to_owned());
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// A unit-like value's wire name (its camelCase code).
fn code(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn optional(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

pub(crate) fn columns(header: &[&str], body: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in body {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells.zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in body {
        line(&mut row.iter().map(String::as_str));
    }
    out
}
