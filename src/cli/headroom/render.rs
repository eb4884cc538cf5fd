//! `headroom`'s output, shared with `kubectl norsk headroom` and
//! standalone: one row per domain (`table`), each lost job's fate beneath
//! it (`wide`), the [`HeadroomReport`] as JSON or YAML, and with
//! `--explain` the trace of every placement that found nowhere. Both
//! tables end with the summary: per kind, for the fleet and for each pool,
//! whether the loss of any single domain is absorbed, and the worst one.

use crate::placement::headroom::{DarkReason, DomainVerdict, Fate, HeadroomReport, KindSummary};

use super::super::plan::Output;
use super::super::plan::render::{columns, explain};

/// The report as `output` asks; `explain` adds the traces to the tables.
pub fn render(report: &HeadroomReport, output: Output, explain: bool) -> Result<String, serde_json::Error> {
    Ok(match output {
        Output::Table => tables(report, false, explain),
        Output::Wide => tables(report, true, explain),
        Output::Json => {
            let mut text = serde_json::to_string_pretty(report)?;
            text.push('\n');
            text
        }
        Output::Yaml => {
            let value = serde_json::to_value(report)?;
            yaml_serde::to_string(&value).map_err(serde::ser::Error::custom)?
        }
    })
}

fn tables(report: &HeadroomReport, wide: bool, traces: bool) -> String {
    let body: Vec<Vec<String>> = report.domains.iter().map(domain_row).collect();
    let mut out = columns(
        &[
            "KIND",
            "DOMAIN",
            "NODES",
            "JOBS",
            "REPLACED",
            "PROVISIONS",
            "DARK",
            "ABSORBED",
            "WHY",
        ],
        &body,
    );
    if wide || traces {
        for verdict in report.domains.iter().filter(|d| d.jobs_lost > 0) {
            out.push_str(&format!("\n{}:\n", verdict.domain));
            let rows: Vec<Vec<String>> = verdict
                .bundles
                .iter()
                .flat_map(|b| b.jobs.iter().map(move |j| (b, j)))
                .map(|(bundle, job)| {
                    vec![
                        bundle.bundle.to_string(),
                        job.replica_index.to_string(),
                        job.job_name.clone(),
                        job.lost_from.to_string(),
                        fate_name(&job.fate).to_owned(),
                        fate_detail(&job.fate),
                        if bundle.on_air { "yes" } else { "no" }.to_owned(),
                    ]
                })
                .collect();
            for line in columns(&["BUNDLE", "REPLICA", "JOB", "FROM", "FATE", "WHERE", "ON AIR"], &rows).lines() {
                out.push_str(&format!("  {line}\n"));
            }
            for job in verdict.unmanaged.iter() {
                out.push_str(&format!("  {job}: belongs to no bundle; not placed again\n"));
            }
            if traces {
                for (bundle, job) in verdict.bundles.iter().flat_map(|b| b.jobs.iter().map(move |j| (b, j))) {
                    if let Fate::Dark {
                        reason: DarkReason::NoCapacityInAnyPool { trace: Some(trace), .. },
                    } = &job.fate
                    {
                        out.push_str(&format!(
                            "\n  {} replica {} job {}:\n",
                            bundle.bundle, job.replica_index, job.job_name
                        ));
                        out.push_str(&explain(trace));
                    }
                }
            }
        }
    }
    out.push('\n');
    for kind in &report.fleet {
        out.push_str(&format!("fleet: {}\n", summary_line(kind)));
    }
    for pool in &report.pools {
        for kind in &pool.kinds {
            out.push_str(&format!("pool {}: {}\n", pool.pool, summary_line(kind)));
        }
    }
    out
}

fn domain_row(verdict: &DomainVerdict) -> Vec<String> {
    let provisions = if verdict.provisions.is_empty() {
        "-".to_owned()
    } else {
        let mut by_shape: Vec<(String, usize)> = Vec::new();
        for p in &verdict.provisions {
            let shape = format!("{}/{} {}", p.pool, p.tier, p.instance_type);
            match by_shape.iter_mut().find(|(s, _)| *s == shape) {
                Some((_, n)) => *n += 1,
                None => by_shape.push((shape, 1)),
            }
        }
        by_shape
            .iter()
            .map(|(shape, n)| format!("{n} {shape}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        verdict.domain.kind.as_str().to_owned(),
        verdict.domain.name.clone(),
        verdict.nodes.len().to_string(),
        verdict.jobs_lost.to_string(),
        verdict.jobs_replaced.to_string(),
        provisions,
        verdict.dark_bundles().to_string(),
        if verdict.absorbed { "yes" } else { "no" }.to_owned(),
        verdict.why().unwrap_or_else(|| "-".to_owned()),
    ]
}

/// "survives the loss of any single node: no (worst: node a: ...)".
pub fn summary_line(kind: &KindSummary) -> String {
    let noun = kind.kind.as_str();
    match &kind.worst {
        None => format!(
            "survives the loss of any single {noun}: yes ({} of {} absorbed)",
            kind.absorbed, kind.domains
        ),
        Some(worst) => format!(
            "survives the loss of any single {noun}: no ({} of {} absorbed; worst: {noun} {}: {})",
            kind.absorbed, kind.domains, worst.name, worst.why
        ),
    }
}

fn fate_name(fate: &Fate) -> &'static str {
    match fate {
        Fate::Placed { .. } => "placed",
        Fate::Provision { .. } => "provision",
        Fate::Dark { .. } => "dark",
    }
}

fn fate_detail(fate: &Fate) -> String {
    match fate {
        Fate::Placed {
            node_id: Some(node_id),
            tier,
            ..
        } => format!("{node_id} ({tier})"),
        Fate::Placed {
            node_id: None, tier, ..
        } => format!("a node of {tier}"),
        Fate::Provision {
            node_id,
            tier,
            instance_type,
            ..
        } => format!("{node_id} ({tier}, {instance_type})"),
        Fate::Dark { reason } => reason.to_string(),
    }
}
