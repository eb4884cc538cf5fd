//! `plan`'s output: the JSON document (`--output json`, exactly the
//! documented shape) and the table for people, with `--explain` printing
//! each placement's trace as a table of nodes and reasons.

use serde::Serialize;

use crate::model::{BundleId, NodeId};
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

/// The plan as a table, one row per job, then validation messages and (with
/// traces) each placement's trace.
pub fn table(rows: &[PlanRow]) -> String {
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
    let mut out = columns(&header, &body);
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
